"""The sampler against the trainer: how far the log-probs of the engine that sampled a batch are from the
trainer's log-probs of the same tokens, and the truncated importance-sampling correction for the difference.

A fast engine (vLLM, or another kernel, dtype or batch shape) samples from a slightly different distribution
π_sampler than the trainer's π_old, so the rollout is off-policy by that much. Weighting each token's policy loss
by w = π_old / π_sampler (stop-gradient) corrects it; capping w at ``cap`` bounds the variance (truncated IS, as
TRL's ``vllm_importance_sampling_correction`` and verl's rollout correction do).

Shapes: ``trainer``, ``sampler`` (B, T) log-probs of the sampled tokens at the sampling temperature; ``mask``
(B, T), True = a response token.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from rlhf.core.masked import masked_mean, masked_sum


class Mismatch(NamedTuple):
    """|log π_old − log π_sampler| over the response tokens: its ``mean``, its ``max`` and the share of tokens
    where it exceeds the threshold (``share_above``); scalars."""

    mean: torch.Tensor
    max: torch.Tensor
    share_above: torch.Tensor


def logprob_mismatch(trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, threshold: float) -> Mismatch:
    """How far the sampler's log-probs are from the trainer's, token by token (`Mismatch`). No token: NaN, 0, NaN."""
    gap = (trainer - sampler).abs()
    mask = mask.bool()
    largest = torch.where(mask, gap, torch.zeros_like(gap)).max() if mask.any() else gap.new_zeros(())
    return Mismatch(masked_mean(gap, mask), largest, masked_mean((gap > threshold).to(gap.dtype), mask))


def importance_weights(
    trainer: torch.Tensor,
    sampler: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: Literal["token", "sequence"],
    cap: float,
    mode: Literal["truncate", "mask"] = "truncate",
) -> torch.Tensor:
    """(B, T) weights of each token's policy loss, w = π_old / π_sampler, without gradient:

        token:     w_t = exp(log π_old(y_t) − log π_sampler(y_t))
        sequence:  w_t = exp(Σ_s mask_s · (log π_old(y_s) − log π_sampler(y_s)))   the same for every token of a row

    ``truncate``: min(w, cap); ``mask``: 0 where w > cap (the token, or the whole row, leaves the loss). At padding
    the difference counts as 0, as in TRL (token level: weight 1); the loss masks it anyway.
    """
    if cap <= 0:
        raise ValueError(f"the importance-weight cap must be > 0, got {cap}")
    diff = torch.where(mask.bool(), trainer - sampler, torch.zeros_like(trainer)).detach()
    if level == "sequence":
        diff = masked_sum(diff, mask, dim=-1).unsqueeze(-1).expand_as(diff)
    elif level != "token":
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    weights = diff.exp()
    if mode == "truncate":
        return weights.clamp(max=cap)
    if mode == "mask":
        return weights.masked_fill(weights > cap, 0.0)
    raise ValueError(f"mode must be 'truncate' or 'mask', got {mode!r}")
