"""The device's budget and the check every trainer runs at its start: the plan against what the device has free
(or ``run.memory_budget_gib``), silent when it fits, else a refusal naming the cheapest change that fits."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from rlhf.config import ConfigError, PolicyGradientConfig, TrainingConfig
from rlhf.core.memory import GiB
from rlhf.planning.fixes import Fix, cheapest_fix
from rlhf.planning.layout import Plan, WorkerPlace, plan, render
from rlhf.runlog.distributed import Dist, worker_device

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


def worker_place(config: TrainingConfig, device: torch.device) -> tuple[WorkerPlace, torch.device]:
    """(Where, which device) the sampling worker (``sampling.max_staleness`` > 0) holds its models beside a trainer
    on ``device``: ``sampling.worker_device`` resolved as the trainer resolves it
    (`rlhf.runlog.distributed.worker_device`: ``cuda`` is GPU 0, as the worker names it). No worker: the CPU."""
    if not isinstance(config, PolicyGradientConfig) or not config.sampling.max_staleness:
        return "cpu", torch.device("cpu")
    home = worker_device(config.sampling.worker_device, device)
    if home.type != "cuda":
        return "cpu", home
    shares = device.type == "cuda" and (device.index or 0) == home.index
    return ("trainer's GPU" if shares else "another GPU"), home


def plan_inputs(
    config: TrainingConfig, device: torch.device, *, world_size: int, positions: int, answers: int
) -> tuple[dict[str, Any], torch.device]:
    """`plan`'s keyword arguments for ``config`` on ``world_size`` ranks of ``device`` (this process's RSS as the
    runtime, whether the allocator keeps what a phase frees, the sampling worker's place), and the device the worker's parts live
    on (`worker_place`): what `rlhf plan` and each trainer's start (`check`) plan alike."""
    place, home = worker_place(config, device)
    retains = device.type != "cuda"  # a CPU allocator keeps what a phase frees (`plan`)
    sizes = {"world_size": world_size, "positions": positions, "answers": answers}
    return {**sizes, "runtime": process_rss(), "retains": retains, "worker_place": place}, home


def worker_fits(predicted: Plan, home: torch.device) -> list[tuple[bool, str]]:
    """The sampling worker's parts outside the trainer's memory (`Plan.apart`), each against its own: (fits, the
    sentence saying so). Its CPU parts beside a GPU trainer against `free_memory` (this process's own is taken
    already); its GPU parts on another GPU than the trainer's (``home``, `worker_place`) against that GPU's free
    memory. [] when all of the worker is in the plan's peak, or there is no worker."""
    fits = []
    for pool, parts in predicted.apart.items():
        size, cpu = sum(parts.values()), pool == "cpu"
        (limit, source), where = (free_memory(), "the CPU's memory") if cpu else (gpu_free(home), str(home))
        verdict = "fits" if size <= limit else "does NOT fit"
        sentence = f"takes {size / GiB:.2f} GiB of {where}; {limit / GiB:.2f} GiB there ({source}): {verdict}"
        fits.append((size <= limit, f"the sampling worker (sampling.max_staleness) {sentence}"))
    return fits


def gpu_free(device: torch.device) -> tuple[int, str]:
    """`available` on a GPU other than the trainer's; none where the machine lacks it (the worker refuses it at its
    start)."""
    if (device.index or 0) >= torch.cuda.device_count():
        return 0, f"this machine has {torch.cuda.device_count()} CUDA GPU(s)"
    return available(device)


def budget(device: torch.device, gib: float | None) -> tuple[int, str]:
    """The budget: ``gib`` (``--device_memory_gib``, else ``run.memory_budget_gib``) when set, else what the
    device has free."""
    if gib is not None:
        return int(gib * GiB), f"{gib:g} GiB per rank"
    return available(device)


def check(config: TrainingConfig, d: Dist, positions: int, answers: int = 2) -> Plan | None:
    """At a trainer's start (``d``: its `Dist`), before any weight loads: the plan against the budget, silent when
    it fits; when it does not, the plan on stderr and ConfigError naming the cheapest change that fits, or the
    sampling worker's parts that do not fit their own memory (`worker_fits`) (``run.ignore_memory_plan``: a
    warning, and the run goes on). None when the plan cannot be made (a model whose config the plan cannot read):
    said, and the run goes on. ``answers``: rm, the most answers of a prompt (`plan`)."""
    command = config.COMMAND
    where, home = plan_inputs(config, d.device, world_size=d.world_size, positions=positions, answers=answers)
    try:
        predicted = plan(config, **where)
    except Exception as error:  # noqa: BLE001 - the plan advises; a model it cannot read must not stop a run
        if d.is_main:
            print(f"{command}: no memory plan ({type(error).__name__}: {error}); going on", file=sys.stderr)
        return None
    limit, source = budget(d.device, config.run.memory_budget_gib)
    fits, worker = predicted.peak <= limit, [sentence for ok, sentence in worker_fits(predicted, home) if not ok]
    if fits and not worker:  # silent: `rlhf plan` shows the plan of a run that fits
        return predicted
    if d.is_main:
        print(render(predicted), file=sys.stderr)
    over = (
        "; ".join(worker)
        if fits
        else f"the memory plan's peak {predicted.peak / GiB:.2f} GiB per rank does NOT fit the budget of "
        f"{limit / GiB:.2f} GiB ({source})"
    )
    if config.run.ignore_memory_plan:
        if d.is_main:
            print(f"{command}: {over}; run.ignore_memory_plan is set: going on anyway", file=sys.stderr)
        return predicted
    if fits:
        raise ConfigError(
            f"{command}: {over}; no weights were loaded. --sampling.worker_device puts the worker elsewhere (cpu, "
            "cuda:N), --sampling.max_staleness 0 samples in the trainer's process instead; to run anyway: "
            "--run.ignore_memory_plan true."
        )
    fix = cheapest_fix(config, limit, **where)
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
    if predicted.worker_place == "trainer's GPU":  # a change of place the fixes do not try
        shared = sum(predicted.worker_gpu.values()) / GiB
        advice += (
            f" The sampling worker's {shared:.2f} GiB on this GPU are in the peak: --sampling.worker_device cpu (or "
            "another GPU) moves them, --sampling.max_staleness 0 drops them."
        )
    return (
        f"{head} {advice} To run anyway: --run.ignore_memory_plan true; to state the budget: --run.memory_budget_gib."
    )
