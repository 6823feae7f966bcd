"""The changes that lower a plan's peak, as flags typed after ``rlhf <command>``: each single change
(`single_changes`), the order they are tried in (`candidates`), the first that fits (`cheapest_fix`) and each
one's plan (`alternatives`, what `rlhf plan` lists)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlhf.config import ConfigError, DPOConfig, RMConfig, TrainingConfig
from rlhf.config.loading import with_flags
from rlhf.planning.layout import Plan, micro_rows_now, plan, reference_copy

LORA = "--model.lora '{r: 8}'"
"""LoRA with its defaults at rank 8, as the command line takes it (YAML)."""


@dataclass(frozen=True)
class Fix:
    """A change to the config (``flags``, as typed on the command line) and the plan it gives."""

    flags: tuple[str, ...]
    plan: Plan


def single_changes(config: TrainingConfig, world_size: int, answers: int = 2) -> tuple[list[str], list[str]]:
    """(smaller micro-batch sizes, largest first; the other single changes, cheapest first: gradient
    checkpointing, a bfloat16 reference, FSDP over the ranks, LoRA) that apply to ``config``. Micro-batches divide
    the minibatch; rm's and dpo's count answers and need not divide anything, so they halve (``answers``: the most
    of one prompt, `plan`)."""
    model = config.model
    current = micro_rows_now(config, world_size, answers)
    if isinstance(config, RMConfig | DPOConfig):
        sizes = sorted({current >> k for k in range(1, current.bit_length())}, reverse=True)
    else:
        sizes = [m for m in range(current - 1, 0, -1) if config.minibatch_size % m == 0]
    micro = [f"--batch.micro_size={m}" for m in sizes]
    others = [
        *([] if model.gradient_checkpointing else ["--model.gradient_checkpointing=true"]),
        *(["--model.reference_dtype=bfloat16"] if reference_copy(config) and model.dtype == "float32" else []),
        *(["--run.parallelism=fsdp"] if world_size > 1 and config.run.parallelism != "fsdp" else []),
        *([] if model.lora else [LORA]),
    ]
    return micro, others


def candidates(config: TrainingConfig, world_size: int, answers: int = 2) -> Iterator[tuple[str, ...]]:
    """Changes that lower the peak, cheapest first: micro-batches down to a quarter of today's (at most 4× the
    passes), then each other single change (`single_changes`) alone and with smaller micro-batches, then smaller
    micro-batches still (each pass on a few rows wastes the hardware), then the changes together, adding one at a
    time."""
    micro, others = single_changes(config, world_size, answers)
    few = len(micro) - sum(int(m.split("=")[1]) * 4 < micro_rows_now(config, world_size, answers) for m in micro)
    yield from ((m,) for m in micro[:few])
    for change in others:
        yield (change,)
        yield from ((change, m) for m in micro)
    yield from ((m,) for m in micro[few:])
    together: tuple[str, ...] = ()
    for change in others:
        # with LoRA the base is the reference (no copy, no dtype of its own)
        together = tuple(f for f in together if not (change == LORA and "reference" in f))
        together += (change,)
        if len(together) > 1:
            yield together
            yield from ((*together, m) for m in micro)


def _planned(config: TrainingConfig, flags: tuple[str, ...], **where: Any) -> Fix | None:
    """``flags`` applied by the command line's own parser (`rlhf.config.loading.with_flags`) and the plan they
    give; None for a combination refused."""
    try:
        changed = with_flags(config, [word for flag in flags for word in shlex.split(flag)])
    except ConfigError:
        return None
    return Fix(flags, plan(changed, **where))


def cheapest_fix(config: TrainingConfig, budget: int, **where: Any) -> Fix | None:
    """The first of `candidates` whose plan fits ``budget`` bytes, or None (``where``: `plan`'s world_size,
    positions, runtime, retains and worker_place)."""
    tried = candidates(config, where["world_size"], where.get("answers", 2))
    fixes = (_planned(config, flags, **where) for flags in tried)
    return next((fix for fix in fixes if fix is not None and fix.plan.peak <= budget), None)


def alternatives(config: TrainingConfig, **where: Any) -> list[Fix]:
    """Each single change (`single_changes`) with its plan: what `rlhf plan` lists (``where``: as `cheapest_fix`)."""
    micro, others = single_changes(config, where["world_size"], where.get("answers", 2))
    fixes = (_planned(config, (change,), **where) for change in micro + others)
    return [fix for fix in fixes if fix is not None]
