"""Masked reductions and whitening.

Shapes: any ``x`` with a broadcast-compatible ``mask`` (usually both ``(B, T)``); ``mask`` is bool or {0, 1}.
Entries where ``mask`` is 0 never influence a result (they are multiplied by zero, not indexed away, so the
functions stay shape-stable and work on any device).
"""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x·mask over ``dim`` (all elements when ``dim`` is None). ``where`` instead of ``x * mask`` so that NaN/inf at
    masked positions cannot leak into the sum."""
    x = torch.where(mask.bool(), x, torch.zeros_like(x))
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x·mask / Σ mask over ``dim`` (all elements when None). All-masked gives NaN (0/0), never a silent 0."""
    count = mask.expand_as(x).to(x.dtype)
    return masked_sum(x, mask, dim) / (count.sum() if dim is None else count.sum(dim))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries of ``x`` (a scalar). ``unbiased=True`` applies Bessel's correction n/(n−1) (TRL,
    torch default); ``False`` is the population variance (OpenAI lm-human-preferences, N+ ``ppo.py``). See checklist
    item 28. Raises ValueError when no entry is unmasked, or only one and ``unbiased`` (n−1 = 0): whitening such a batch
    is meaningless (checklist Part 3 §12)."""
    n = mask.expand_as(x).to(x.dtype).sum()
    if n == 0:
        raise ValueError("masked_var: every entry is masked; there is nothing to take the variance of")
    if unbiased and n == 1:
        raise ValueError("masked_var: unbiased variance of a single entry divides by n-1 = 0")
    mean = masked_sum(x, mask) / n
    var = masked_sum((x - mean) ** 2, mask) / n
    return var * n / (n - 1) if unbiased else var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, unbiased: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """``(x − μ)/sqrt(σ² + eps)`` with the masked entries' mean and variance (eps inside the root, as in OAI
    ``core.whiten`` and TRL ``masked_whiten``); ``shift_mean=False`` adds the mean back (OAI reward whitening). Every
    entry is transformed, masked ones included (reference 2-D: the 100s become 51.58): callers zero-fill padding
    afterwards. ``unbiased`` defaults to True as in TRL; OAI and N+ use the population variance."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=unbiased)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    return whitened if shift_mean else whitened + mean
