"""Per-token log-probabilities and entropy from language-model logits.

Shapes: ``B`` sequences, ``C`` query (context) tokens, ``T`` response tokens, ``V`` vocabulary.
Logits at position ``i`` predict token ``i + 1`` (checklist item 9): of ``query ⊕ response`` with C query tokens,
``logits[:, C-1:-1]`` pairs with ``input_ids[:, C:]`` (OAI ``policy.py`` L119-125; N+ ``ppo.py`` L640, L732-737; TRL
``ppo_trainer.py`` L712-713, GRPO ``grpo_trainer.py`` L1514-1521), the slice `rlhf.models.policy.score_response_tokens`
takes. Log-probs are taken from the temperature-scaled distribution the tokens were sampled from (item 10), τ exactly
as given (TRL's ``+1e-7`` is not added). Reference vectors 2-A.

Memory: a ``(B, T, V)`` float32 log-softmax copy is the largest tensor of a PPO step for big vocabularies,
so nothing here materialises one; work is done ``chunk_rows`` rows of ``V`` at a time.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

INVALID_LOGPROB = 1.0
"""Log-prob written at padding positions of the policy *and* reference log-probs (checklist item 13).

Both sides get the same value, so per-token KL = 0 and ratio = exp(0) = 1 there (N+ ``ppo.py`` L38, L675-676;
TRL ``ppo_trainer.py`` L69, L765-766).
"""

_FULL_PRECISION = (torch.float32, torch.float64)


def _row_chunks(x: torch.Tensor, chunk_rows: int) -> Iterator[torch.Tensor]:
    """Yield views of ``x (..., V)`` as ``(n, V)`` blocks, n ≤ ``chunk_rows``, in row-major order; never copies. A
    sliced tensor such as ``logits[:, C-1:-1]`` cannot be viewed as ``(N, V)`` (``reshape`` would copy the whole slice),
    so such inputs are walked one leading index at a time."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if x.dim() <= 2:
        yield from x.reshape(-1, x.size(-1)).split(chunk_rows)  # (V,) → (1, V) and (N, V) are views
        return
    try:
        flat = x.view(-1, x.size(-1))
    except RuntimeError:  # strides do not allow a flat view
        for sub in x:
            yield from _row_chunks(sub, chunk_rows)
        return
    yield from flat.split(chunk_rows)


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0, chunk_rows: int = 256
) -> torch.Tensor:
    """log softmax(logits / temperature)[index] without building the full log-softmax.

    Shapes: ``logits (..., V)``, ``index (...)`` integer → ``(...)``, float32 (float64 for float64 logits).

        log p(index) = l[index]/τ − logsumexp(l/τ)

    The selected logit minus a ``logsumexp`` computed ``chunk_rows`` rows at a time; half-precision logits
    (bf16 mixed precision) are upcast a chunk at a time and the result is float32: a log-prob rounded to
    bfloat16 is off by up to 0.03 nats at log p = -5 (8 bits of mantissa), more than a PPO ratio may move.
    Same idea as TRL ``trainer/utils.py`` ``selective_log_softmax`` (L479-523); ``temperature`` is applied
    chunk by chunk so no scaled ``(..., V)`` copy exists either. Differentiable; never writes into ``logits``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if index.shape != logits.shape[:-1]:
        raise ValueError(f"index {tuple(index.shape)} must match logits {tuple(logits.shape)} without the last dim")
    flat_index = index.long().reshape(-1)
    # Plain loop replaced (one row n of the flattened (N, V) logits at a time):
    #     for n in range(N): out[n] = log_softmax(logits[n] / τ)[index[n]]
    # done on blocks of rows so the temporary is (chunk_rows, V), not (N, V).
    pieces, start = [], 0
    for rows in _row_chunks(logits, chunk_rows):
        idx = flat_index[start : start + rows.size(0)].unsqueeze(-1)
        start += rows.size(0)
        rows = rows if rows.dtype in _FULL_PRECISION else rows.float()
        scaled = rows / temperature if temperature != 1.0 else rows
        pieces.append(scaled.gather(-1, idx).squeeze(-1) - torch.logsumexp(scaled, dim=-1))
    return torch.cat(pieces).reshape(index.shape)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, chunk_rows: int = 256) -> torch.Tensor:
    """Entropy of softmax(logits / τ) along the last dimension.

    Shapes: ``logits (..., V)`` → ``(...)``, float32 (float64 for float64 logits).

        H = logsumexp(l) − Σ_v softmax(l)_v · l_v,   l = logits / τ

    OAI ``core.py`` L290-292; TRL-legacy ``core.py`` L181-185; N+ ``ppo.py`` L762-763. Computed
    ``chunk_rows`` rows at a time (half-precision inputs in float32); logits must be finite.
    Reference vector 2-A: entropy([1, 2, 3]) = 0.8323955818.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    # Plain loop replaced: for n in range(N): H[n] = logsumexp(l[n]) − (softmax(l[n]) · l[n]).sum()
    pieces = []
    for rows in _row_chunks(logits, chunk_rows):
        rows = rows if rows.dtype in _FULL_PRECISION else rows.float()
        rows = rows / temperature if temperature != 1.0 else rows
        probs = torch.softmax(rows, dim=-1)
        pieces.append(torch.logsumexp(rows, dim=-1) - (probs * rows).sum(-1))
    return torch.cat(pieces).reshape(logits.shape[:-1])
