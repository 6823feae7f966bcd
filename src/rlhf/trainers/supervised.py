"""The loop SFT, RM and DPO share: epochs of shuffled examples, one optimizer step per batch, held-out
evaluation, checkpoints and resume — the trainer supplies the model and what one step and one evaluation
compute.

Per step (numbered in `train`): (1) the step's examples (`rlhf.data.stream.EpochOrder`) → (2) ``Task.step``,
this rank's share in micro-batches → (3) clip, AdamW, schedule → (4) metrics; ``Task.evaluate`` before training,
every ``run.eval_every`` steps and at each epoch's end → (5) the checkpoint (`rlhf.runlog.train_state.TrainState`,
the same state PPO and GRPO save).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf.config import TrainingConfig
from rlhf.data import TokenizedPreference
from rlhf.data.stream import EpochOrder
from rlhf.models.loading import load_trainable_state, trainable_state
from rlhf.runlog import distributed
from rlhf.runlog.distributed import Dist
from rlhf.runlog.metrics import open_run
from rlhf.runlog.progress import StepProgress
from rlhf.runlog.seeding import seed_everything
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
    """What a supervised trainer computes inside the shared loop: ``step(rows)``, forward + backward of the step's
    examples (indices into the training data; each rank takes its share) → its ``train/*`` stats over all ranks;
    ``evaluate()``, the ``eval/*`` metrics (None: no held-out examples); ``tokens(rows)``, the non-padding tokens
    of ``rows`` (``throughput/tokens_per_s``)."""

    trainable: Trainable
    model: OneModel
    step: Callable[[list[int]], dict[str, float]]
    evaluate: Callable[[], dict[str, float]] | None
    tokens: Callable[[list[int]], int]


def start(config: TrainingConfig) -> Dist:
    """Check every input (model paths, reward sources, stop_token) before anything loads and seed every random
    generator; returns this process's `Dist`."""
    from rlhf.inputs import check_inputs

    check_inputs(config)
    seed_everything(config.run.seed)
    return distributed.current()


def train(config: TrainingConfig, task: Task, num_examples: int, fingerprint: str, epochs: int, d: Dist) -> None:
    """Train ``epochs`` epochs over the ``num_examples`` training examples (`EpochOrder`; ``fingerprint`` names
    them), resuming from ``--run.resume``'s checkpoint, logging to ``metrics.jsonl`` under ``config.output_dir``."""
    order = EpochOrder(num_examples, config.batch.size, config.run.seed, fingerprint, config.COMMAND)
    out, total = Path(config.output_dir), epochs * order.steps_per_epoch
    d.check_batch(config.COMMAND, config.batch.size)
    params = task.trainable.parameters()
    state = TrainState.create(params, optim=config.optim, seed=config.run.seed, total_updates=total, stream=order)
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
            # 3. clip, AdamW, schedule
            stepped = update.optimizer_step(
                task.trainable, state.optimizer, state.scheduler, config.optim.max_grad_norm
            )
            step_s = time.perf_counter() - t0  # 4. metrics, evaluation when due
            metrics = {"step": step, "epoch": step / order.steps_per_epoch, **stats, "grad/norm": stepped.norm}
            metrics |= {"update/changed_frac": stepped.changed, "lr": lr}
            metrics |= {"time/step_s": step_s, "throughput/tokens_per_s": task.tokens(rows) / step_s}
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


def pair_tokens(pairs: Sequence[TokenizedPreference], rows: list[int]) -> int:
    """The tokens of the preference pairs ``rows`` (rm, dpo): the prompt twice, with each response."""
    return sum(2 * len(pairs[i].prompt_ids) + len(pairs[i].chosen_ids) + len(pairs[i].rejected_ids) for i in rows)


def held_out_batches(n: int, size: int, d: Dist) -> Iterator[tuple[list[int], bool, bool]]:
    """This rank's share of ``n`` held-out examples (rm, dpo) as micro-batches of ``size`` indices, evened out over
    the ranks (`rlhf.trainers.update.evenly`: a filler pass, ``real`` False, must count 0)."""
    mine = list(range(d.rank, n, d.world_size))
    return update.evenly([mine[start : start + size] for start in range(0, len(mine), size)], lambda: [0], d)


def pair_step(
    trainable: Trainable, indices: list[int], size: int, loss_of: Callable[[torch.Tensor], tuple[torch.Tensor, dict]]
) -> dict[str, float]:
    """Backward of the mean loss over the step's pairs ``indices`` (rm, dpo): this rank's share, in micro-batches of
    ``size`` pairs, ``loss_of(micro)`` giving a micro-batch's mean loss and stats, each weighted by its share of
    the step's pairs (the step's mean, whatever its size). Returns the step's stats over all ranks."""
    rows, d = torch.tensor(indices), trainable.d

    def micro_step(micro: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        loss, stats = loss_of(micro)
        share = len(micro) / len(rows)  # micro-batch mean × its share = its part of the step's mean
        return loss * share, {key: value * share for key, value in stats.items()}

    micro_batches = list(rows[d.rank :: d.world_size].split(size))
    return update.reduce_stats(update.accumulate(trainable, micro_batches, lambda: rows[:1], micro_step), d)
