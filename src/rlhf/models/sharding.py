"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the models the trainers hold: shard, load, generate, save.

What it costs and saves, measured: docs/scaling.md, "FSDP2". Every model a sharded run holds is loaded by
:func:`load_sharded`: policy, reference, critic, the reward model ``rlhf rm`` trains and the frozen reward models PPO
and GRPO score with."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from rlhf.models.loading import apply_lora, checkpointed, frozen_copy, load_causal_lm, load_tokenizer
from rlhf.models.precision import bf16_enabled, compute_dtype, compute_in_bf16, frozen_dtype
from rlhf.runlog.distributed import Dist

if TYPE_CHECKING:
    from rlhf.config.sections import PolicyModel, TrainModel


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of ``model`` (plain, peft-wrapped, causal LM or classifier), in order: the
    outermost modules whose class ``model._no_split_modules`` names (transformers' own list of blocks that must
    stay whole; peft forwards it), or without that list the children of the longest ``nn.ModuleList``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks: list[nn.Module] = []
    inside: set[int] = set()  # ids of modules already covered by a block found above them
    for module in model.modules():
        if id(module) in inside:
            continue
        if type(module).__name__ in names:
            blocks.append(module)
            inside.update(id(m) for m in module.modules())
    if blocks:
        return blocks
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"found no transformer blocks in {type(model).__name__}")
    return list(max(lists, key=len))


def shard(model: nn.Module, mesh: DeviceMesh, *, mixed_precision: bool | None = None, root: bool = True) -> None:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, head), in place. One
    all-gather then brings in one layer at a time: the peak is one layer's full weights plus 1/world of the rest.
    ``root=False``: the layers only — a wrapper whose forward runs the model is sharded as the root instead.
    ``mixed_precision``: see :func:`_precision`. Frozen models (reference, reward) and LoRA models shard the same way:
    FSDP2 shards frozen parameters too and reduce-scatters only the gradients that exist."""
    policy = _precision(model, mixed_precision)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    if root:
        fully_shard(model, mesh=mesh, mp_policy=policy)


def _precision(model: nn.Module, mixed: bool | None = None) -> MixedPrecisionPolicy:
    """bfloat16 compute with float32 gradient reduction when ``mixed`` (None: when ``model`` computes in bfloat16,
    ``model.bf16``: `rlhf.models.precision.compute_in_bf16` hooked it or one of its modules), gathering each layer
    in bfloat16 — the sharded master weights and the optimizer stay in their own dtype; the parameters' dtype
    otherwise (``model.bf16: false``, frozen models already in their dtype, the float32 value head)."""
    if mixed is None:
        mixed = any(compute_dtype(module) is not None for module in model.modules())
    if mixed:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def load_sharded(build: Callable[[str | torch.device], nn.Module], mesh: DeviceMesh) -> nn.Module:
    """A sharded model whose weights are ``build``'s, without a whole copy on every rank (docs/scaling.md).
    ``build(device)`` is an ordinary loader (``from_pretrained`` and whatever the trainer does after it); called with
    ``"meta"`` it must make the same architecture without reading any weights (see
    :func:`~rlhf.models.loading.pretrained`). Every rank shards that empty model; rank 0 alone calls ``build("cpu")``
    and :func:`materialize` hands each rank its slice and rank 0's random state (so a fresh head's or LoRA's draws, and
    every later one, are what one process draws)."""
    with torch.device("meta"):
        model = build("meta")
    shard(model, mesh)
    return materialize(model, build("cpu") if dist.get_rank() == 0 else None, mesh)


def materialize(model: nn.Module, full: nn.Module | None, mesh: DeviceMesh) -> nn.Module:
    """Give a sharded ``model`` built on the meta device rank 0's ``full`` weights (None on the other ranks; the
    same architecture, unsharded, on the CPU), broadcast tensor by tensor, and rank 0's global random state."""
    model.to_empty(device=mesh.device_type)
    set_model_state_dict(
        model,
        full.state_dict() if full is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    _broadcast_non_persistent_buffers(model, full)
    random_state = [torch.get_rng_state()]
    dist.broadcast_object_list(random_state, src=0)
    torch.set_rng_state(random_state[0])
    return model


@torch.no_grad()
def _broadcast_non_persistent_buffers(model: nn.Module, full: nn.Module | None) -> None:
    """Fill the buffers no state dict carries (rotary ``inv_freq``, say) — ``to_empty`` left them garbage —
    with rank 0's, which ``from_pretrained`` computed. Copying rather than re-running each module's own init
    works for any architecture. FSDP does not shard buffers: each rank holds them whole."""
    reference = dict(full.named_buffers()) if full is not None else {}
    for module_name, module in model.named_modules():
        for name in sorted(module._non_persistent_buffers_set):
            buffer = getattr(module, name)
            if buffer is None:
                continue
            if full is not None:
                buffer.copy_(reference[f"{module_name}.{name}" if module_name else name])
            dist.broadcast(buffer, src=0)


def fsdp_modules(model: nn.Module) -> list[FSDPModule]:
    """Every module of ``model`` that ``fully_shard`` wrapped, root first."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(model: nn.Module) -> Iterator[nn.Module]:
    """All-gather the full weights of a sharded ``model`` once for the whole block (a rollout, not each of its per-token
    forwards; a reward model's scoring), reshard after it; costs one full copy on every rank meanwhile
    (docs/scaling.md).

    Inside, every parameter is a plain tensor holding the full weight (``rollout.decoder`` packs it as an unsharded
    model's), and forwards — any number, so they may differ between ranks — communicate nothing: each FSDP module is
    told not to reshard after its forward, so FSDP's pre-forward finds its weights gathered. On exit each module is
    resharded and gets back :func:`shard`'s setting (layers reshard after forward; the root keeps its weights for
    backward)."""
    modules = fsdp_modules(model)
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
    # issue every module's all-gather before waiting on any, so they overlap; all are complete before the
    # block starts, so no collective is in flight while the weights are read
    handles = [module.unshard(async_op=True) for module in modules]
    for handle in handles:
        if handle is not None:
            handle.wait()
    try:
        yield model
    finally:
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(module is not model, recurse=False)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The full, unsharded state dict on CPU on rank 0 (``save_pretrained`` of ``final/``); None elsewhere. Gathered one
    tensor at a time and moved to CPU as it comes, so no rank holds a second full copy on the accelerator. Every rank
    must call it (each tensor is a collective)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if dist.get_rank() == 0 else None


def load_lm(
    name_or_path: str, dtype: str, d: Dist, prepare: Callable[[nn.Module], nn.Module] | None = None
) -> nn.Module:
    """The trainers' causal LM: :func:`~rlhf.models.loading.load_causal_lm` on this rank's device, or, when
    the run shards its models (``parallelism: fsdp``), sharded by :func:`load_sharded`. ``prepare`` (e.g. adding
    LoRA adapters) is applied before sharding; the adapters' random initial weights are rank 0's on every rank."""
    tokenizer = load_tokenizer(name_or_path)

    def build(device: str | torch.device) -> nn.Module:
        model = load_causal_lm(name_or_path, dtype, device, tokenizer=tokenizer)
        return prepare(model) if prepare is not None else model

    return load_sharded(build, d.mesh) if d.sharded else build(d.device)


def model_loader(d: Dist) -> Callable[[Callable[[str | torch.device], nn.Module]], nn.Module] | None:
    """What a frozen model's ``loader`` is in this run (``rlhf.rollout.rewards.ModelLoader``): None (load it
    whole) unless the run shards its models; then :func:`load_sharded`, each rank holding 1/world."""
    return functools.partial(load_sharded, mesh=d.mesh) if d.sharded else None


def shard_small(module: nn.Module, d: Dist) -> nn.Module:
    """``fully_shard`` a module without transformer blocks (a value head) as one unit when the run shards: its
    gradients must go through FSDP like the rest (gradient clipping cannot mix sharded and plain tensors)."""
    if d.sharded:
        fully_shard(module, mesh=d.mesh, mp_policy=_precision(module))
    return module


def sampling(model: nn.Module, d: Dist) -> AbstractContextManager[nn.Module]:
    """The weights ready for a rollout: :func:`gathered` when sharded, the model as it is otherwise."""
    return gathered(model) if d.sharded else nullcontext(model)


def preparation(model: TrainModel, device: torch.device) -> Callable[[nn.Module], nn.Module] | None:
    """What :func:`load_lm` applies before sharding to a model that trains (a config's ``model`` section) on the run's
    ``device``: its LoRA adapters, gradient checkpointing, then bfloat16 compute (``model.bf16``,
    `rlhf.models.precision`); None when none of them."""
    lora, checkpointing, bf16 = model.lora, model.gradient_checkpointing, bf16_enabled(model.bf16, device)
    if not lora and not checkpointing and not bf16:
        return None

    def prepare(module: nn.Module) -> nn.Module:
        module = apply_lora(module, lora) if lora else module
        module = checkpointed(module) if checkpointing else module
        return compute_in_bf16(module, device) if bf16 else module

    return prepare


def load_policy(model: PolicyModel, d: Dist, reference: bool) -> tuple[nn.Module, nn.Module | None]:
    """(policy, reference) for an RL trainer from a config's ``model`` section (``name``, ``dtype``, ``bf16``,
    ``lora``, ``reference_dtype``). The reference is a frozen copy of the initial policy, in ``reference_dtype``
    when set (bfloat16 under mixed precision, else ``dtype``) — or None when not wanted, or with LoRA (the base
    model with the adapter switched off is the reference, no copy). Sharded runs load the reference as a second
    sharded model (a copy of a sharded module is not one)."""
    name_or_path, dtype, prepare = model.name, model.dtype, preparation(model, d.device)
    reference_dtype = model.reference_dtype or frozen_dtype(dtype, bf16_enabled(model.bf16, d.device))
    copy = reference and not model.lora
    if d.sharded:
        frozen = load_lm(name_or_path, reference_dtype, d).eval().requires_grad_(False) if copy else None
        return load_lm(name_or_path, dtype, d, prepare), frozen
    policy = load_causal_lm(name_or_path, dtype, d.device)
    frozen = frozen_copy(policy, reference_dtype) if copy else None
    return (prepare(policy) if prepare else policy), frozen


def unsharded(model: nn.Module, build: Callable[[], nn.Module], d: Dist) -> nn.Module | None:
    """``model`` itself when it is not sharded; else, on rank 0, a plain CPU model holding its full weights
    (``build()`` makes the empty shell: the same architecture, adapters included), None on the other ranks.
    Every rank must call it (the weights are gathered tensor by tensor)."""
    if not d.sharded:
        return model
    state = full_state_dict(model)
    if state is None:
        return None
    plain = build()
    plain.load_state_dict(state)
    return plain
