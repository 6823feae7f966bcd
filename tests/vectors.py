"""Comparing `core` results with hand-computed numbers: float64 inputs, tight tolerances."""

from __future__ import annotations

import torch

F64 = torch.float64


def t(x) -> torch.Tensor:
    """A float64 tensor: hand-computed references are exact to ~1e-15 there."""
    return torch.tensor(x, dtype=F64)


def close(actual: torch.Tensor, expected, *, rtol: float = 1e-9, atol: float = 1e-10) -> None:
    """``actual`` equals the reference ``expected`` (NaN where it is NaN). atol 1e-10 covers references printed
    with 10 decimals."""
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=rtol, atol=atol, equal_nan=True
    )
