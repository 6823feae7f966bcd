"""How many bytes each part of a training step holds, from the models' sizes: pure arithmetic, no torch.

Notation: L layers, H hidden size, I the MLP's inner size, a attention heads (g of them for keys/values), d head
size, V vocabulary; N = rows × positions tokens in one forward. ``width`` is the bytes of one value in the model's
dtype (4 float32, 2 bfloat16/float16). The derivation of every count, and what is left out: docs/memory.md.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes of one value per ``model.dtype``."""

FLOAT32 = 4
GiB = 1024**3


@dataclass(frozen=True)
class Transformer:
    """The sizes of a decoder (or an encoder reward model) that memory depends on, read from its config.json. ``params``
    counts every parameter (embeddings and head included); ``matmul_params`` those of the layers' linear maps and the LM
    head (what the lean decoder packs); ``gated`` is a SwiGLU MLP with RMSNorm (Llama, Mistral, Qwen2, Gemma…), else a
    two-matrix MLP with LayerNorm (GPT-2 style)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params: int
    matmul_params: int
    gated: bool = True


def weights(params: int, width: int) -> int:
    """A model's parameters: ``params × width``."""
    return params * width


def gradients(trainable: int, width: int) -> int:
    """One gradient per trainable parameter, in the parameter's dtype."""
    return trainable * width


def adamw_state(trainable: int, width: int) -> int:
    """AdamW's two moments (``exp_avg``, ``exp_avg_sq``) per trainable parameter, each in the parameter's dtype
    (torch creates them with ``zeros_like``); the step counters are scalars."""
    return 2 * trainable * width


def kv_cache(model: Transformer, rows: int, positions: int, width: int) -> int:
    """Sampling's keys and values: 2 × L × g × d × rows × positions values."""
    return 2 * model.layers * model.kv_heads * model.head_dim * rows * positions * width


def layer_activations(model: Transformer, rows: int, positions: int, width: int) -> int:
    """What one decoder layer saves for the backward pass over ``rows × positions`` tokens (autograd's saved
    tensors).

    Gated (RMSNorm, SwiGLU, fused attention): per token 8H + 2gd + 4I values — each norm its input, normalised
    input and output (3H, twice), the attention's query, keys, values and output (H + 2gd + H) and the MLP's
    gate, activated gate, up and product (4I) — plus a + 2 float32 (the attention's log-sum-exp per head, each
    norm's reciprocal RMS). GPT-2 style (LayerNorm, GELU MLP, attention weights materialised): 9H + 5I + 3a ×
    positions values plus 4 float32 per token."""
    H, I = model.hidden, model.intermediate  # noqa: E741 - the MLP's inner size, as in the papers
    if model.gated:
        values, floats = 8 * H + 2 * model.kv_heads * model.head_dim + 4 * I, model.heads + 2
    else:
        values, floats = 9 * H + 5 * I + 3 * model.heads * positions, 4
    return rows * positions * (values * width + floats * FLOAT32)


def activations(model: Transformer, rows: int, positions: int, width: int, *, checkpointing: bool) -> int:
    """A training forward's saved tensors: every layer's, or with gradient checkpointing each layer's input
    (H values per token) plus one layer's in full, recomputed during the backward pass; and the final norm's
    (3H values + one float32 per token)."""
    tokens = rows * positions
    per_layer = layer_activations(model, rows, positions, width)
    kept = model.layers * tokens * model.hidden * width + per_layer if checkpointing else model.layers * per_layer
    return kept + tokens * (3 * model.hidden * width + FLOAT32)


def logits(rows: int, positions: int, vocab: int, *, copies: int) -> int:
    """Float32 vocabulary-wide tensors alive at once over ``rows × positions``: ``copies`` of V values per
    position (the logits, their tempered copy, the softmax the entropy keeps)."""
    return copies * rows * positions * vocab * FLOAT32


def inference_workspace(model: Transformer, rows: int, positions: int, width: int) -> int:
    """A forward without gradients: what is alive at its widest point — the residual stream, a layer's norm
    output, query/key/value and the MLP's three inner tensors (3H + H + 2gd + 3I values per token)."""
    per_token = 4 * model.hidden + 2 * model.kv_heads * model.head_dim + 3 * model.intermediate
    return rows * positions * per_token * width


def sharded(total: int, world_size: int) -> int:
    """One rank's share of a tensor sharded over ``world_size`` ranks (rounded up)."""
    return -(-total // world_size)
