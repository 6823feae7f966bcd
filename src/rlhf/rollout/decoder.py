"""A lean KV-cached decoder for Llama-family models: the same logits as ``model(...)``, less overhead per token.

Notation: B rows, C prompt columns (left-padded), S = C + max_new_tokens cache slots, H hidden size,
h heads (g of them for keys/values), d head size, V vocab.

Why: sampling a small model on CPU is bound by per-token overhead, not arithmetic. A ``transformers`` forward
for one new token walks every module, builds a fresh attention mask and grows the KV cache with ``cat``, and
``F.linear`` on 16 rows runs at about half the speed of a product with a contiguous transposed weight (60
against 33 µs, 16×256×768 on 2 cores). Here:

- each layer's weights are packed once per rollout (q|k|v into one product, gate|up into another: four products
  per layer and step), for fp32 on a CPU with oneDNN in its blocked layout (what ``torch.compile`` does for
  frozen CPU weights; 13.1 against 23.6 ms for the 13 products of a 25M decode step, 16 rows, 2 cores), else
  transposed and contiguous, which ``torch.matmul`` reads fastest; on a GPU, no copy (`READS_OWN_WEIGHTS`);
- packed weights are kept between rollouts while the parameters are unchanged (:func:`reusing_packed`);
- each distinct prompt of a batch (GRPO's groups) is prefilled once, its keys and values copied to its rows;
- a cache of S slots is allocated once and written in place, with one additive mask row per sequence opened a
  column at a time and rotary cos/sin for every slot computed once by the model's own rotary module.

It covers ``LlamaForCausalLM`` and the models built the same way (``MistralForCausalLM``, ``Qwen2ForCausalLM``
with q/k/v biases) whose layers are plain ``nn.Linear`` or un-merged LoRA ``peft`` layers (the adapter is folded
into the packed weight: LoRA costs nothing per token). Anything else — another architecture, a sliding window
shorter than the sequence, length-dependent rotary scaling, quantised layers, DoRA — is refused by
:func:`build_decoder`, and sampling falls back to the model's own forward. Tests check the logits against the
model's forward at every step.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rlhf.data.collate import position_ids_from_mask
from rlhf.models.policy import unwrap
from rlhf.models.precision import compute_dtype

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
"""``config.model_type`` values whose decoder layer is: RMSNorm → attention (RoPE) → add → RMSNorm → SwiGLU → add."""

LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
"""Rotary types whose frequencies change with the sequence length: cos/sin cannot be computed once."""


class Unsupported(Exception):
    """The model is not one this decoder reproduces exactly; the caller uses the model's own forward."""


def _linear(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, in) weight and bias of a linear layer, with an un-merged LoRA adapter folded in."""
    if type(module) is nn.Linear:
        return module.weight, module.bias
    base = getattr(module, "base_layer", None)
    active = getattr(module, "active_adapters", None)
    if type(base) is nn.Linear and hasattr(module, "get_delta_weight") and active is not None:
        # merged: peft already folded the adapter into the base weight; disabled: the adapter is off
        if getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
            return base.weight, base.bias
        if any(module.use_dora.get(name, False) for name in active):
            raise Unsupported("DoRA adapters")
        weight = base.weight
        for name in active:
            if name in module.lora_A:
                weight = weight + module.get_delta_weight(name)
        return weight, base.bias
    raise Unsupported(f"{type(module).__name__} is not a plain or LoRA linear layer")


@functools.cache
def _onednn_works() -> bool:
    """Whether this build runs oneDNN's prepacked fp32 product (the private op ``torch.compile`` emits for frozen
    CPU linears) and it agrees with ``torch.matmul``; checked once, on a small product."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)  # not the global one: a run's random state stays its own
        weight, x = torch.randn(5, 3, generator=generator), torch.randn(4, 3, generator=generator)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 4)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(out, x @ weight.t(), rtol=1e-5, atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


class _Product:
    """x ↦ x·Wᵀ + b for one packed (out, in) weight: oneDNN's blocked layout for fp32 on a CPU that has it,
    else the transposed weight, contiguous. ``rows``: how many rows a decode step multiplies (oneDNN's hint).
    Under mixed precision the weight is packed in bfloat16 and ``x`` cast to it, as autocast casts a product's
    inputs: the residual stream stays float32 as in the model's own forward under autocast."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int, dtype: torch.dtype):
        weight, bias = weight.to(dtype), None if bias is None else bias.detach().to(dtype)
        self.out_features, self.bias, self.dtype = weight.shape[0], bias, dtype
        self.onednn = weight.device.type == "cpu" and weight.dtype == torch.float32 and _onednn_works()
        if self.onednn:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), max(1, rows))
        else:
            self.weight = weight.detach().t().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if flat.dtype != self.dtype:  # mixed precision: the product's input in bfloat16, as autocast casts it
            flat = flat.to(self.dtype)
        if self.onednn:
            out = torch.ops.mkldnn._linear_pointwise(flat, self.weight, self.bias, "none", [], "")
        elif self.bias is None:
            out = torch.matmul(flat, self.weight)
        else:
            out = torch.addmm(self.bias, flat, self.weight)
        return out.view(*x.shape[:-1], self.out_features)


READS_OWN_WEIGHTS = ("cuda",)
"""Device types where the decoder multiplies the layers' own weights (:class:`_Views`) rather than a packed copy:
cuBLAS reads a transposed operand at full speed, so a copy buys nothing there and would hold a second policy in
the GPU's memory. A weight that must change dtype (bfloat16 compute over float32 master weights) or carries an
un-merged LoRA adapter is a new tensor either way, and is packed."""


class _Views:
    """x ↦ [x·W₁ᵀ + b₁ | x·W₂ᵀ + b₂ | …] for linear layers on the same input, each read where it is (no copy)."""

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor | None]]):
        self.pairs = [(w.detach(), None if b is None else b.detach()) for w, b in pairs]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.pairs[0][0].dtype
        x = x if x.dtype == dtype else x.to(dtype)  # pure bfloat16: the stream and the weights already agree
        outs = [F.linear(x, w, b) for w, b in self.pairs]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


def _packed(modules: list[nn.Module], rows: int, dtype: torch.dtype) -> _Product | _Views:
    """Several linear layers on the same input as one product, in ``dtype``: their weights and biases concatenated,
    or on a device of `READS_OWN_WEIGHTS` the layers' own weights when they already are what is multiplied."""
    pairs = [_linear(m) for m in modules]
    own = all(type(m) is nn.Linear for m in modules)  # not a LoRA layer, whose weight + adapter is a new tensor
    if own and pairs[0][0].device.type in READS_OWN_WEIGHTS and all(w.dtype == dtype for w, _ in pairs):
        return _Views(pairs)
    weight = torch.cat([w for w, _ in pairs])
    bias = None
    if any(b is not None for _, b in pairs):
        bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])
    return _Product(weight, bias, rows, dtype)


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """LlamaRMSNorm exactly: normalise in fp32, cast back, then scale. In fp32 that is ``F.rms_norm``, one
    kernel instead of five (bitwise the same result here, and 24 against 36 µs for 16 rows of 256)."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x32.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass
class _Layer:
    qkv: _Product  # H → (h + 2g)·d
    out: _Product  # h·d → H
    gate_up: _Product  # H → 2I
    down: _Product  # I → H
    norm1: nn.Module
    norm2: nn.Module
    scaling: float


def _check(model: nn.Module, total_length: int) -> None:
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise Unsupported(f"model type {getattr(config, 'model_type', None)!r}")
    if not type(model).__name__.endswith("ForCausalLM"):
        raise Unsupported(type(model).__name__)
    if getattr(config, "hidden_act", "silu") != "silu":
        raise Unsupported(f"activation {config.hidden_act!r}")
    window = getattr(config, "sliding_window", None)
    if window is not None and window < total_length:
        raise Unsupported(f"sliding window {window} < sequence length {total_length}")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type")) in LENGTH_DEPENDENT_ROPE:
        raise Unsupported(f"rope type {rope.get('rope_type')!r}")
    if getattr(config, "pretraining_tp", 1) != 1:
        raise Unsupported("pretraining_tp > 1")


class PackedWeights:
    """A model's weights as the decoder multiplies them (see the module docstring), with the modules it reads
    as they are (embedding, norms, rotary). ``rows``: the rows of a decode step, oneDNN's hint."""

    def __init__(self, model: nn.Module, rows: int):
        base = model.model
        # the products' dtype (and the KV cache's): bfloat16 under mixed precision, else the weights' own
        self.dtype = compute_dtype(model) or base.embed_tokens.weight.dtype
        try:
            self.layers = [self._pack(layer, rows, self.dtype) for layer in base.layers]
            self.head = _packed([model.lm_head], rows, self.dtype)
        except AttributeError as error:
            raise Unsupported(f"unexpected layer layout ({error})") from error
        if type(base.embed_tokens) is not nn.Embedding:
            raise Unsupported(f"embedding {type(base.embed_tokens).__name__}")
        self.embed, self.norm, self.rotary = base.embed_tokens, base.norm, base.rotary_emb

    @staticmethod
    def _pack(layer: nn.Module, rows: int, dtype: torch.dtype) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        if any(hasattr(attn, name) for name in ("q_norm", "k_norm")):
            raise Unsupported("q/k norms")
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not hasattr(norm, "variance_epsilon") or getattr(norm, "weight", None) is None:
                raise Unsupported(f"norm {type(norm).__name__}")
        return _Layer(
            _packed([attn.q_proj, attn.k_proj, attn.v_proj], rows, dtype),
            _packed([attn.o_proj], rows, dtype),
            _packed([mlp.gate_proj, mlp.up_proj], rows, dtype),
            _packed([mlp.down_proj], rows, dtype),
            layer.input_layernorm,
            layer.post_attention_layernorm,
            float(attn.scaling),
        )


@dataclass
class _Kept:
    """A model's packed weights kept between rollouts: ``holds`` open :func:`reusing_packed` blocks (or
    ``forever`` after :func:`keep_packed`), and the parameter versions the weights were packed from."""

    holds: int = 0
    forever: bool = False
    versions: tuple | None = None
    weights: PackedWeights | None = None


_kept: weakref.WeakKeyDictionary[nn.Module, _Kept] = weakref.WeakKeyDictionary()


def _versions(model: nn.Module) -> tuple:
    """What the packed weights depend on: every parameter's storage and in-place version (an optimizer step
    or ``load_state_dict`` bumps it) and each LoRA layer's adapter switches. (Not the rows hint: weights packed
    for 16 rows multiply a last chunk of 5 correctly.)"""
    params = tuple((p.data_ptr(), p._version, p.dtype) for p in model.parameters())
    switches = tuple(
        (getattr(m, "merged", False), getattr(m, "disable_adapters", False), tuple(m.active_adapters))
        for m in model.modules()
        if hasattr(m, "lora_A") and hasattr(m, "active_adapters")
    )
    return params, switches


@contextlib.contextmanager
def reusing_packed(model: nn.Module) -> Iterator[None]:
    """Within the block, rollouts of ``model`` reuse its packed weights while its parameters are unchanged;
    they are freed when the last open block ends (unless :func:`keep_packed`). Use it around several rollouts
    of unchanged weights (a prompt batch sampled in chunks, GRPO's dynamic-sampling rounds); under FSDP2, only
    inside the block that gathers the weights."""
    kept = _kept.setdefault(unwrap(model), _Kept())
    kept.holds += 1
    try:
        yield
    finally:
        kept.holds -= 1
        if kept.holds == 0 and not kept.forever:
            _kept.pop(unwrap(model), None)


def keep_packed(model: nn.Module) -> None:
    """Keep ``model``'s packed weights for as long as the model lives (a frozen model answering many batches):
    one more copy of its weights in memory, no packing per rollout."""
    _kept.setdefault(unwrap(model), _Kept()).forever = True


def packed_weights(model: nn.Module, rows: int) -> PackedWeights:
    """``model``'s (unwrapped) weights packed for decode steps of ``rows`` rows: the kept ones when they are
    still current, else packed now (and kept, inside :func:`reusing_packed`)."""
    kept = _kept.get(model)
    if kept is None:
        return PackedWeights(model, rows)
    versions = _versions(model)
    if kept.versions != versions:
        kept.weights = None  # free the stale copy before packing the new one
        kept.weights, kept.versions = PackedWeights(model, rows), versions
    return kept.weights


class LlamaDecoder:
    """Prefill a left-padded prompt batch (:meth:`prefill`), then append one (B,) column per :meth:`step` (real for
    every row, as the sampler's mask says); both return the (B, V) logits after the last column. Positions follow
    ``position_ids_from_mask`` (the first real token is 0); ``rows``: the batch size of the decode steps (a hint for
    the packed layout; any batch works)."""

    def __init__(self, model: nn.Module, total_length: int, rows: int = 1):
        model = unwrap(model)
        _check(model, total_length)
        self.weights = packed_weights(model, rows)
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.slots = total_length

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """Each distinct prompt (ids and mask) is computed once; rows that repeat it get copies of its cache."""
        distinct, rows = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
        if len(distinct) == len(prompt_ids):
            return self._prefill(prompt_ids, prompt_mask)
        C = prompt_ids.shape[1]
        logits = self._prefill(distinct[:, :C], distinct[:, C:])
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.cos, self.sin, self.mask = self.cos[rows], self.sin[rows], self.mask[rows]
        return logits[rows]

    def _prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        B, C = prompt_ids.shape
        S, device = self.slots, prompt_ids.device
        dtype = self.weights.dtype
        real = prompt_mask.bool()
        positions = position_ids_from_mask(prompt_mask)  # as the model's own forward gets them
        positions = torch.cat([positions, positions[:, -1:] + torch.arange(1, S - C + 1, device=device)], dim=-1)
        # cos/sin in the residual stream's dtype, as the model's rotary module gives them (float32 under autocast)
        stream = torch.empty(0, dtype=self.weights.embed.weight.dtype, device=device)
        cos, sin = self.weights.rotary(stream, positions)
        self.cos, self.sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, S, d)
        shape = (B, self.kv_heads, S, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.weights.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.weights.layers]
        # One additive mask row per sequence: 0 where a key may be read, −inf where it is padding or not
        # written yet. Padding queries may read themselves, so no row is all −inf (softmax of it is NaN).
        self.mask = torch.full((B, 1, 1, S), float("-inf"), dtype=dtype, device=device)
        self.mask[:, 0, 0, :C] = torch.zeros((), dtype=dtype, device=device).masked_fill(~real, float("-inf"))
        causal = torch.ones(C, C, dtype=torch.bool, device=device).tril()
        visible = (causal & real[:, None, :]) | torch.eye(C, dtype=torch.bool, device=device)
        prefill_mask = torch.zeros(B, 1, C, C, dtype=dtype, device=device).masked_fill(~visible[:, None], float("-inf"))
        self.length = 0
        return self._forward(prompt_ids.masked_fill(~real, 0), prefill_mask, 0)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask[:, 0, 0, self.length] = 0.0
        return self._forward(tokens.unsqueeze(-1), self.mask[..., : self.length + 1], self.length)

    def static_step(self, tokens: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """:meth:`step` with static shapes, for a captured CUDA graph: ``slot`` (a one-element long tensor on the
        device) is the cache slot the (B,) ``tokens`` go to, and every one of the S slots is attended (those not
        written yet are masked). Nothing is read on the host and every buffer is written in place, so the same
        kernels run at every token; the caller advances ``slot``. The logits equal :meth:`step`'s up to the order of
        the attention's sums over S rather than the written slots (masked slots add exact zeros)."""
        self.mask.index_fill_(-1, slot, 0.0)
        return self._forward(tokens.unsqueeze(-1), self.mask, slot)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, start: int | torch.Tensor) -> torch.Tensor:
        """Logits after the last of ``ids`` (B, Q), written to the cache from slot ``start``: an int (attend the
        slots up to the last written), or a tensor of Q = 1 slot (attend all of them: :meth:`static_step`)."""
        B, Q = ids.shape
        if isinstance(start, torch.Tensor):
            cos, sin = self.cos.index_select(2, start), self.sin.index_select(2, start)
            end = self.slots
        else:
            end = start + Q
            cos, sin = self.cos[:, :, start:end], self.sin[:, :, start:end]
        h, g, d = self.heads, self.kv_heads, self.head_dim
        x = self.weights.embed(ids)
        for layer, keys, values in zip(self.weights.layers, self.keys, self.values, strict=True):
            qkv = layer.qkv(_rms_norm(x, layer.norm1))
            qk, v = qkv.view(B, Q, h + 2 * g, d).transpose(1, 2).split([h + g, g], dim=1)
            # queries and keys rotated in one go (float32 rotary tables under mixed precision: back to the cache's dtype)
            rotated = _rotate(qk, cos, sin)
            q, k = (rotated if rotated.dtype == v.dtype else rotated.to(v.dtype)).split([h, g], dim=1)
            if isinstance(start, torch.Tensor):
                keys.index_copy_(2, start, k)
                values.index_copy_(2, start, v)
            else:
                keys[:, :, start:end] = k
                values[:, :, start:end] = v
            attended = F.scaled_dot_product_attention(
                q, keys[:, :, :end], values[:, :, :end], attn_mask=mask, scale=layer.scaling, enable_gqa=g != h
            )
            x = x + layer.out(attended.transpose(1, 2).reshape(B, Q, h * d))
            gate, up = layer.gate_up(_rms_norm(x, layer.norm2)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        if not isinstance(start, torch.Tensor):
            self.length = end
        return self.weights.head(_rms_norm(x[:, -1], self.weights.norm))


def build_decoder(model: nn.Module, total_length: int, rows: int = 1) -> LlamaDecoder | None:
    """A :class:`LlamaDecoder` for ``model``, or None when it is not a model the decoder reproduces."""
    try:
        return LlamaDecoder(model, total_length, rows)
    except Unsupported:
        return None
