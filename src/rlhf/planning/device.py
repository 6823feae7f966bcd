"""The device's budget and the check every trainer runs at its start: the plan against what the device has free
(or ``run.memory_budget_gib``), silent when it fits, else a refusal naming the cheapest change that fits."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from rlhf.config import ConfigError, TrainingConfig
from rlhf.core.memory import GiB
from rlhf.planning.fixes import Fix, cheapest_fix
from rlhf.planning.layout import Plan, plan, render
from rlhf.runlog.distributed import Dist

USABLE = 0.9
"""Share of the free memory a run may plan to use: the rest is headroom for what the plan leaves out (the
allocator's slack, other processes growing)."""


def process_rss() -> int:
    """This process's resident memory now (bytes), from /proc; 0 where there is none."""
    return _proc_bytes("/proc/self/status", "VmRSS") or 0


def _proc_bytes(path: str, key: str) -> int | None:
    """The ``key: N kB`` line of a /proc file, in bytes; None where there is none."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith(f"{key}:")), None)


def available(device: torch.device) -> tuple[int, str]:
    """(bytes this rank may plan to use, where the figure comes from) on ``device``: a GPU's free memory, or this
    process's memory and `free_memory`, either times `USABLE`."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * USABLE), f"{USABLE:.0%} of {device}'s free memory"
    free, source = free_memory()
    return process_rss() + free, f"this process + {source}"


def free_memory() -> tuple[int, str]:
    """(`USABLE` of the machine's MemAvailable shared by the ranks on it (LOCAL_WORLD_SIZE), where it comes from):
    what new memory a rank may plan to take of the CPU's."""
    free = _proc_bytes("/proc/meminfo", "MemAvailable")  # the kernel's estimate of memory new work can take
    if free is None:
        raise OSError("/proc/meminfo has no MemAvailable")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    share = f" / {local} ranks" if local > 1 else ""
    return int(free * USABLE) // local, f"{USABLE:.0%} of MemAvailable{share}"


def worker_fit(predicted: Plan) -> tuple[bool, str] | None:
    """Beside a GPU, whose memory the plan's peak is, the sampling worker's CPU memory against `free_memory` (this
    process's own is taken already): (fits, the sentence saying so); None without a worker, or on CPU, where the
    worker is in the plan's peak."""
    if predicted.retains or not predicted.worker:
        return None
    limit, source = free_memory()
    fits = predicted.worker_total <= limit
    return fits, (
        f"the sampling worker (sampling.max_staleness) takes {predicted.worker_total / GiB:.2f} GiB of the CPU's "
        f"memory; {limit / GiB:.2f} GiB there ({source}): {'fits' if fits else 'does NOT fit'}"
    )


def budget(device: torch.device, gib: float | None) -> tuple[int, str]:
    """The budget: ``gib`` (``--device_memory_gib``, else ``run.memory_budget_gib``) when set, else what the
    device has free."""
    if gib is not None:
        return int(gib * GiB), f"{gib:g} GiB per rank"
    return available(device)


def check(config: TrainingConfig, d: Dist, positions: int) -> Plan | None:
    """At a trainer's start (``d``: its `Dist`), before any weight loads: the plan against the budget, silent when
    it fits; when it does not, the plan on stderr and ConfigError naming the cheapest change that fits, or beside
    a GPU the sampling worker that does not fit the CPU's memory (`worker_fit`) (``run.ignore_memory_plan``: a
    warning, and the run goes on). None when the plan cannot be made (a model whose config the plan cannot read):
    said, and the run goes on."""
    command, runtime, retains = config.COMMAND, process_rss(), d.device.type != "cuda"
    try:
        predicted = plan(config, world_size=d.world_size, positions=positions, runtime=runtime, retains=retains)
    except Exception as error:  # noqa: BLE001 - the plan advises; a model it cannot read must not stop a run
        if d.is_main:
            print(f"{command}: no memory plan ({type(error).__name__}: {error}); going on", file=sys.stderr)
        return None
    limit, source = budget(d.device, config.run.memory_budget_gib)
    fits, worker = predicted.peak <= limit, worker_fit(predicted)
    if fits and (worker is None or worker[0]):  # silent: `rlhf plan` shows the plan of a run that fits
        return predicted
    if d.is_main:
        print(render(predicted), file=sys.stderr)
    over = (
        worker[1]
        if fits and worker
        else f"the memory plan's peak {predicted.peak / GiB:.2f} GiB per rank does NOT fit the budget of "
        f"{limit / GiB:.2f} GiB ({source})"
    )
    if config.run.ignore_memory_plan:
        if d.is_main:
            print(f"{command}: {over}; run.ignore_memory_plan is set: going on anyway", file=sys.stderr)
        return predicted
    if fits:
        raise ConfigError(
            f"{command}: {over}; no weights were loaded. --sampling.max_staleness 0 samples in the trainer's process "
            "instead; to run anyway: --run.ignore_memory_plan true."
        )
    fix = cheapest_fix(config, limit, world_size=d.world_size, positions=positions, runtime=runtime, retains=retains)
    raise ConfigError(f"{command}: {refusal(predicted, limit, source, fix)}")


def refusal(predicted: Plan, limit: int, source: str, fix: Fix | None) -> str:
    """Why a run is refused: the peak against the budget and the cheapest change that fits (the plan itself is
    printed above it)."""
    head = (
        f"the memory plan predicts a peak of {predicted.peak / GiB:.2f} GiB per rank in the {predicted.peak_phase} "
        f"phase, over the budget of {limit / GiB:.2f} GiB ({source}); no weights were loaded."
    )
    if fix is None:
        advice = "No change within reach fits (smaller micro-batches, checkpointing, a bfloat16 reference, FSDP, LoRA)."
    else:
        advice = f"The cheapest change that fits: {' '.join(fix.flags)} (peak {fix.plan.peak / GiB:.2f} GiB)."
    return (
        f"{head} {advice} To run anyway: --run.ignore_memory_plan true; to state the budget: --run.memory_budget_gib."
    )
