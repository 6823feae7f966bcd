"""Seeds and the complete random state of a process, so a resumed run draws exactly what the original would."""

from __future__ import annotations

import contextlib
import os
import platform
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


def environment() -> dict[str, Any]:
    """What a run's floating-point results depend on besides its seed and inputs (saved with the demo's summary):
    the CPU and its kernel level, threads and library versions pick the kernels, whose last bits RL training
    amplifies into another trajectory (docs/reproducibility.md)."""
    import transformers

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    return {
        "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


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
        # as many GPUs as both machines have: a run resumed on a machine with fewer GPUs (or none) goes on
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])
    for name, gen in (generators or {}).items():
        key = f"generator/{name}"
        if key not in state:
            raise KeyError(f"checkpoint has no state for the random generator {name!r}")
        gen.set_state(state[key])
