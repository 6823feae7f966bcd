"""The loop SFT and RM share: epochs of shuffled examples, one optimizer step per batch, held-out evaluation,
checkpoints and resume — the trainer supplies the model and what one step and one evaluation compute.

Per step: (1) the step's examples (`rlhf.data.stream.EpochOrder`) → (2) the trainer's forward + backward of
this rank's share, in micro-batches (``Task.step``, through `rlhf.trainers.update.accumulate`) → (3) clip the
global gradient norm, AdamW and schedule step → (4) metrics; ``Task.evaluate`` before training, every
``run.eval_every`` steps and at the end of every epoch, in that step's row → (5) the checkpoint, every
``run.save_every`` steps: the model, optimizer, schedule, data position and random state
(`rlhf.runlog.train_state.TrainState`, the same state PPO and GRPO save).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from rlhf.config import TrainingConfig
from rlhf.data.stream import EpochOrder
from rlhf.models.loading import load_trainable_state, trainable_state
from rlhf.runlog.distributed import Dist
from rlhf.runlog.metrics import open_run
from rlhf.runlog.progress import StepProgress
from rlhf.runlog.train_state import TrainState
from rlhf.trainers import update
from rlhf.trainers.update import Trainable


@dataclasses.dataclass(frozen=True)
class OneModel:
    """A run's one trained model as `TrainState` checkpoints it: ``module``, the module trained (sharded
    checkpoints) under ``name``, and ``weights``, the model whose trainable tensors ``state.pt`` keeps (the
    PEFT model under LoRA: the adapters only)."""

    name: str
    module: nn.Module
    weights: nn.Module

    def modules(self) -> dict[str, nn.Module]:
        return {self.name: self.module}

    def state_dict(self) -> dict[str, Any]:
        return {self.name: trainable_state(self.weights)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_trainable_state(self.weights, state[self.name])


@dataclasses.dataclass(frozen=True)
class Task:
    """What a supervised trainer computes inside the shared loop.

    - ``step(rows)``: forward + backward of the step's examples ``rows`` (indices into the training data;
      each rank takes its share), returning the step's ``train/*`` stats over all ranks;
    - ``evaluate()``: the ``eval/*`` metrics on the held-out examples (None: there are none);
    - ``tokens(rows)``: the non-padding tokens of ``rows``, for ``throughput/tokens_per_s``.
    """

    trainable: Trainable
    model: OneModel
    step: Callable[[list[int]], dict[str, float]]
    evaluate: Callable[[], dict[str, float]] | None
    tokens: Callable[[list[int]], int]


def train(config: TrainingConfig, task: Task, order: EpochOrder, epochs: int, d: Dist) -> None:
    """Train ``epochs`` epochs of ``order``'s batches (resuming from ``--run.resume``'s checkpoint), logging
    to ``metrics.jsonl`` under ``config.output_dir``."""
    out, total = Path(config.output_dir), epochs * order.steps_per_epoch
    d.check_batch(config.COMMAND, config.batch.size)
    params = task.trainable.parameters()
    state = TrainState.create(
        params, optim=config.optim, seed=config.run.seed, total_updates=total, stream=order, device=d.device
    )
    checkpoint, saved = state.resume(config, task.model, d)
    start = saved.get("step", 0)
    logger = open_run(config, checkpoint, start, d)
    task.trainable.module.train()  # dropout is off either way; train mode is what optimizer steps run in
    with StepProgress(total, start, enabled=config.run.progress and d.is_main, description=config.COMMAND) as progress:
        if start == 0 and task.evaluate is not None:  # the starting point of every eval curve
            logger.log({"step": 0, "epoch": 0.0, **task.evaluate()})
        for step in range(start + 1, total + 1):
            t0 = time.perf_counter()
            rows = next(order)  # 1. this step's examples
            state.optimizer.zero_grad(set_to_none=True)
            stats = task.step(rows)  # 2. forward + backward, micro-batched, this rank's share
            lr = state.scheduler.get_last_lr()[0]  # the rate this step uses
            grad_norm = update.optimizer_step(  # 3. clip, AdamW, schedule
                task.trainable, state.optimizer, state.scheduler, config.optim.max_grad_norm
            )
            step_s = time.perf_counter() - t0  # 4. metrics, evaluation when due
            metrics = {
                "step": step,
                "epoch": step / order.steps_per_epoch,
                **stats,
                "grad/norm": grad_norm,
                "lr": lr,
                "time/step_s": step_s,
                "throughput/tokens_per_s": task.tokens(rows) / step_s,
            }
            end_of_epoch = step % order.steps_per_epoch == 0
            every = config.run.eval_every
            evaluating = task.evaluate is not None and (end_of_epoch or (every > 0 and step % every == 0))
            if evaluating:
                t1 = time.perf_counter()
                metrics.update(task.evaluate())
                metrics["time/eval_s"] = time.perf_counter() - t1
            if evaluating or step % config.run.log_every == 0 or step == total:
                logger.log(metrics)
            progress.update(step, metrics)
            if config.run.save_every and step % config.run.save_every == 0:  # 5. checkpoint
                state.save(out, step, task.model, {}, d)
    logger.close()
