"""`rlhf plan --config FILE [--world_size N] [--device_memory_gib G]`: the plan of a trainer's config, what each
single change would make its peak, and whether it fits the budget."""

from __future__ import annotations

import torch

from rlhf.config import TrainingConfig
from rlhf.core.memory import GiB
from rlhf.planning.device import budget, plan_inputs, refusal, worker_fits
from rlhf.planning.fixes import alternatives, cheapest_fix
from rlhf.planning.layout import plan, render
from rlhf.planning.lengths import data_shape
from rlhf.runlog.distributed import device_for_run

TRAINERS = ("sft", "rm", "dpo", "ppo", "grpo")


def command_of(sections: set[str]) -> str | None:
    """The trainer a config file is for, from its own section (``ppo:``, ``grpo:``, ``dpo:``, ``rm:``/``normalize:``,
    ``sft:``); None when it has none of them."""
    found = [c for c in TRAINERS if c in sections] + (["rm"] if "normalize" in sections else [])
    return found[0] if len(set(found)) == 1 else None


def report(
    config: TrainingConfig,
    *,
    world_size: int = 1,
    device_memory_gib: float | None = None,
    device: torch.device | None = None,
) -> tuple[str, bool]:
    """What `rlhf plan` prints for ``config`` on ``world_size`` ranks, and whether it fits the budget (the GPU or
    this machine's free memory, ``run.memory_budget_gib``, or ``device_memory_gib``); ``device``: the trainer's,
    by default the one a one-process run of this config would take, and its sampling worker's beside it as the
    run would place it (`worker_place`)."""
    device = device or device_for_run()
    positions, answers = data_shape(config)
    where, home = plan_inputs(config, device, world_size=world_size, positions=positions, answers=answers)
    predicted = plan(config, **where)
    gib = device_memory_gib if device_memory_gib is not None else config.run.memory_budget_gib
    limit, source = budget(device, gib)
    fits, worker = predicted.peak <= limit, worker_fits(predicted, home)
    lines = [
        render(predicted),
        "",
        f"peak {predicted.peak / GiB:.2f} GiB per rank ({predicted.peak_phase}); budget {limit / GiB:.2f} GiB "
        f"({source}): {'fits' if fits else 'does NOT fit'}",
        *(sentence for _, sentence in worker),
        "",
        "what each change would make the peak:",
    ]
    for fix in alternatives(config, **where):
        mark = "fits" if fix.plan.peak <= limit else ""
        lines.append(f"  {' '.join(fix.flags):<48} {fix.plan.peak / GiB:8.2f} GiB  {mark}")
    if not fits:
        fix = cheapest_fix(config, limit, **where)
        lines += ["", refusal(predicted, limit, source, fix).replace("; no weights were loaded", "")]
    return "\n".join(lines), fits and all(ok for ok, _ in worker)
