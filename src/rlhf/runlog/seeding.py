"""Seeds and the complete random state of a process, so a resumed run draws exactly what the original would."""

from __future__ import annotations

import random
from typing import Any

import torch

RANK_SEED_STRIDE = 100003
"""Per-process seeds are ``seed + rank * 100003`` (OAI ``set_mpi_seed``; N-details, N+, TRL; checklist item 8)."""


def process_seed(seed: int, rank: int = 0) -> int:
    return seed + rank * RANK_SEED_STRIDE


def seed_everything(seed: int, rank: int = 0) -> int:
    """Seed Python's and torch's global generators for this process; returns the seed used."""
    s = process_seed(seed, rank)
    random.seed(s)
    torch.manual_seed(s)
    return s


def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Everything random in this process: Python, torch CPU (and CUDA), and named torch generators."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    for name, gen in (generators or {}).items():
        state[f"generator/{name}"] = gen.get_state()
    return state


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    """Restore what :func:`rng_state` captured. A named generator missing from ``state`` is an error."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, gen in (generators or {}).items():
        key = f"generator/{name}"
        if key not in state:
            raise KeyError(f"checkpoint has no state for the random generator {name!r}")
        gen.set_state(state[key])
