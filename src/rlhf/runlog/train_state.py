"""What a run resumes besides its models — optimizer, learning-rate schedule, data stream and random
generators — and the checkpoint of one step, sharded (DCP, every rank) or not (``state.pt``, rank 0)."""

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
        cls, params: list[nn.Parameter], *, optim: OptimSection, seed: int, total_updates: int, stream: Any
    ) -> TrainState:
        """AdamW and its schedule (``optim``) over ``total_updates`` optimizer steps; generators seeded from
        ``seed`` (``run.seed``)."""
        optimizer, scheduler = build_optimizer(params, optim, total_updates)
        # both on the CPU: "sampling" only draws each rollout's row seeds (`rlhf.rollout.engine.row_seeds`; the rows'
        # own streams live on the device), so a run draws the same seeds on any device and its checkpoint resumes
        # on another kind of device
        generators = {
            "sampling": torch.Generator().manual_seed(seed),
            "shuffle": torch.Generator().manual_seed(seed + 1),
        }
        return cls(optimizer, scheduler, stream, generators)

    def save(self, out: Path, step: int, models: Any, extra: dict[str, Any], d: Dist) -> None:
        """Checkpoint ``step``: ``models`` (``modules()`` / ``state_dict()``), the optimizer, schedule, stream, RNGs
        and ``extra``; rank 0 writes ``state.pt`` (every rank holds the same state), unless the run is sharded:
        then every rank writes its DCP shards and rank 0 the rest (`rlhf.runlog.sharded_checkpoint`)."""
        plain = {
            "step": step,
            "scheduler": self.scheduler.state_dict(),
            "stream": self.stream.state_dict(),
            "rng": rng_state(self.generators),
            **extra,
        }
        if d.sharded:
            save_sharded(checkpoint_path(out, step), models.modules(), self.optimizer, plain)
        elif d.is_main:
            save_checkpoint(
                out, step, {**plain, "models": models.state_dict(), "optimizer": self.optimizer.state_dict()}
            )

    def resume(self, config: TrainingConfig, models: Any, d: Dist) -> tuple[Path | None, dict[str, Any]]:
        """``--run.resume``: the checkpoint picked (`rundir.load_resume_checkpoint`), loaded into ``models`` and this
        state, and its plain entries (``step``, a trainer's ``extra``); ``(None, {})`` when starting afresh. Sharded
        checkpoints (DCP) load at any number of ranks, sharded or not; a ``state.pt`` only unsharded."""
        checkpoint, saved = load_resume_checkpoint(config)
        if checkpoint is None:
            return None, {}
        if "sharded" in saved:
            load_sharded(saved["sharded"], models.modules(), self.optimizer)
        elif d.sharded:
            raise ConfigError(
                "resume: this checkpoint was written by an unsharded run (parallelism none or ddp), whose optimizer "
                "state is stored by parameter position; resume it with parallelism: ddp"
            )
        else:
            models.load_state_dict(saved["models"])
            self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.stream.load_state_dict(saved["stream"])
        set_rng_state(saved["rng"], self.generators)
        return checkpoint, saved
