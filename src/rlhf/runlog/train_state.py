"""What a run resumes besides its models — optimizer, learning-rate schedule, data stream and random
generators — and the checkpoint of one step, sharded (DCP, every rank) or not (``state.pt``, rank 0).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf.config import ConfigError, OptimSection, TrainingConfig
from rlhf.optim import build_optimizer
from rlhf.runlog.checkpoint import checkpoint_path, save_checkpoint
from rlhf.runlog.distributed import Dist
from rlhf.runlog.rundir import load_resume_checkpoint
from rlhf.runlog.seeding import rng_state, set_rng_state
from rlhf.runlog.sharded_checkpoint import load_sharded, save_sharded


@dataclasses.dataclass
class TrainState:
    """The resumable part of a run besides the models: optimizer, schedule, the data stream (anything with
    ``state_dict`` / ``load_state_dict``, e.g. `rlhf.data.stream.PromptStream`) and the RNGs (``sampling``
    draws the responses, ``shuffle`` the minibatch order of later epochs)."""

    optimizer: torch.optim.Optimizer
    scheduler: Any
    stream: Any
    generators: dict[str, torch.Generator]

    @classmethod
    def create(
        cls,
        params: list[nn.Parameter],
        *,
        optim: OptimSection,
        seed: int,
        total_updates: int,
        stream: Any,
        device: torch.device,
    ) -> TrainState:
        """AdamW and its schedule (``optim``) over ``total_updates`` optimizer steps; generators seeded from
        ``seed`` (``run.seed``)."""
        optimizer, scheduler = build_optimizer(params, optim, total_updates)
        generators = {"sampling": torch.Generator(device).manual_seed(seed), "shuffle": torch.Generator()}
        generators["shuffle"].manual_seed(seed + 1)
        return cls(optimizer, scheduler, stream, generators)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint entries ``scheduler``, ``stream`` and ``rng`` (the optimizer is saved with the models)."""
        return {
            "scheduler": self.scheduler.state_dict(),
            "stream": self.stream.state_dict(),
            "rng": rng_state(self.generators),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["stream"])
        set_rng_state(state["rng"], self.generators)

    def save(self, out: Path, step: int, models: Any, extra: dict[str, Any], d: Dist) -> None:
        """Checkpoint ``step`` of an RL run: ``models`` (``modules()`` / ``state_dict()``), this state, ``extra``."""
        save_training(
            out,
            step,
            d,
            modules=models.modules(),
            optimizer=self.optimizer,
            plain={**self.state_dict(), **extra},
            unsharded=lambda: {"models": models.state_dict(), "optimizer": self.optimizer.state_dict()},
        )

    def resume(self, config: TrainingConfig, models: Any, d: Dist) -> tuple[Path | None, dict[str, Any]]:
        """``--run.resume``: the checkpoint picked (`rundir.load_resume_checkpoint`), loaded into ``models`` and this
        state, and its plain entries (``step``, a trainer's ``extra``); ``(None, {})`` when starting afresh."""
        checkpoint, saved = load_resume_checkpoint(config)
        if checkpoint is None:
            return None, {}
        self.restore(saved, models, d)
        return checkpoint, saved

    def restore(self, saved: dict[str, Any], models: Any, d: Dist) -> None:
        """Load what :meth:`save` wrote into ``models`` and this state."""

        def unsharded(saved: dict[str, Any]) -> None:
            models.load_state_dict(saved["models"])
            self.optimizer.load_state_dict(saved["optimizer"])

        restore_training(saved, d, modules=models.modules(), optimizer=self.optimizer, unsharded=unsharded)
        self.load_state_dict(saved)


def save_training(
    out: Path,
    step: int,
    d: Dist,
    *,
    modules: dict[str, nn.Module],
    optimizer: torch.optim.Optimizer,
    plain: dict[str, Any],
    unsharded: Any,
) -> None:
    """The checkpoint of ``step``. Unsharded runs: rank 0 writes ``state.pt`` = ``{step, **plain,
    **unsharded()}`` (every rank holds the same state). Sharded runs: every rank writes its DCP shards of
    ``modules`` and ``optimizer``, rank 0 the ``plain`` state (`rlhf.runlog.sharded_checkpoint`)."""
    if d.sharded:
        save_sharded(checkpoint_path(out, step), modules, optimizer, {"step": step, **plain})
    elif d.is_main:
        save_checkpoint(out, step, {"step": step, **plain, **unsharded()})


def restore_training(
    saved: dict[str, Any], d: Dist, *, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer, unsharded: Any
) -> None:
    """Load the models and optimizer of a :func:`save_training` checkpoint: DCP shards at any number of ranks,
    sharded or not, or ``unsharded(saved)`` for a ``state.pt``. The caller restores the plain state."""
    if "sharded" in saved:
        load_sharded(saved["sharded"], modules, optimizer)
    elif d.sharded:
        raise ConfigError(
            "resume: this checkpoint was written by an unsharded run (parallelism none or ddp), whose optimizer "
            "state is stored by parameter position; resume it with parallelism: ddp"
        )
    else:
        unsharded(saved)
