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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf.config import ConfigError, TrainingConfig
from rlhf.data.groups import AnswerBatch, PreferenceGroup, answer_batches
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


# The preference trainers' steps over prompts (rm, dpo): each prompt's answers forwarded once, the loss over its pairs
# (docs/rankings.md). A trainer supplies what one forward scores per answer and what the loss of those scores is.

Scores = Callable[[Callable[..., Any], list[int], "slice | None"], torch.Tensor]
"""``scores(model, group_ids, chunk)``: (N,) one number per answer of the groups ``group_ids`` (indices into the
trainer's groups; ``chunk``: of the one group's answers only), from one forward of ``model`` — rm the reward, dpo
the response's summed log-probability."""
Objective = Callable[[torch.Tensor, list[int], int, int], tuple[torch.Tensor, dict[str, float]]]
"""``objective(scores, group_ids, step_groups, step_pairs)``: the groups' share of the loss of a step of
``step_groups`` prompts and ``step_pairs`` pairs (over all ranks), and their share of its stats."""


def group_pairs(groups: Sequence[PreferenceGroup], step_groups: int) -> dict[str, torch.Tensor]:
    """The pairs of ``groups`` as indices into their answers' scores laid end to end (`Scores`): ``better``,
    ``worse``, ``margin`` and each pair's ``weight``, 1/(G·n_g) for a group of n_g pairs among the step's G =
    ``step_groups`` prompts: each prompt's pairs averaged, then the prompts (InstructGPT; why: docs/rankings.md)."""
    better, worse, margin, weight, offset = [], [], [], [], 0
    for group in groups:
        better += [offset + b for b in group.better]
        worse += [offset + w for w in group.worse]
        margin += group.margins
        weight += [1.0 / (step_groups * group.num_pairs)] * group.num_pairs
        offset += len(group.answers)
    return {
        "better": torch.tensor(better),
        "worse": torch.tensor(worse),
        "margin": torch.tensor(margin),
        "weight": torch.tensor(weight, dtype=torch.float64),
    }


def group_step(
    trainable: Trainable, indices: list[int], groups: Sequence[PreferenceGroup], micro_size: int | None,
    scores: Scores, objective: Objective,
) -> dict[str, float]:  # fmt: skip
    """Backward of the step's loss over the prompts ``indices``: this rank's share of them in passes of at most
    ``micro_size`` answers (`rlhf.data.groups.answer_batches`), a prompt with more answers split over passes with the
    gradient of one (:func:`spanning_gradient`). Returns the step's stats over all ranks."""
    d = trainable.d
    mine = indices[d.rank :: d.world_size]
    step_groups, step_pairs = len(indices), sum(groups[i].num_pairs for i in indices)
    passes = answer_batches([len(groups[i].answers) for i in mine], micro_size)
    spanning: dict[str, torch.Tensor] = {}

    def step(batch: AnswerBatch | None) -> tuple[torch.Tensor, dict[str, float]]:
        if batch is None:  # a filler pass (another rank has more passes): one answer, weighted 0 by `accumulate`
            return scores(trainable.forward, indices[:1], slice(0, 1)).sum(), {}
        ids = [mine[g] for g in batch.groups]
        if batch.chunk is None:
            return objective(scores(trainable.forward, ids, None), ids, step_groups, step_pairs)
        stats: dict[str, float] = {}
        if batch.chunk.start == 0:
            answers = len(groups[ids[0]].answers)
            args = (trainable.module, ids, answers, micro_size, scores, objective, step_groups, step_pairs)
            spanning["grad"], stats = spanning_gradient(*args)
        return (scores(trainable.forward, ids, batch.chunk) * spanning["grad"][batch.chunk]).sum(), stats

    return update.reduce_stats(update.accumulate(trainable, passes, lambda: None, step), d)


def spanning_gradient(
    module: nn.Module, ids: list[int], answers: int, size: int, scores: Scores, objective: Objective,
    step_groups: int, step_pairs: int,
) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """A prompt whose answers take several passes: the gradient of its loss with respect to its answers' scores,
    computed from scores taken without gradient (passes of ``size`` answers), and its stats. Each pass's forward then
    backpropagates its slice of that gradient (``Σ s_a·∂L/∂s_a``): by the chain rule the weights get the gradient of
    the loss over all the answers at once, holding one pass's activations (GradCache, Gao et al. 2021;
    docs/rankings.md), at the cost of one more forward of these answers."""
    with torch.no_grad():
        parts = [scores(module, ids, slice(start, start + size)) for start in range(0, answers, size)]
    values = torch.cat(parts).requires_grad_()
    loss, stats = objective(values, ids, step_groups, step_pairs)
    (grad,) = torch.autograd.grad(loss, values)
    return grad, stats


@torch.no_grad()
def group_scores(
    model: Callable[..., Any], groups: Sequence[PreferenceGroup], size: int, scores: Scores, d: Dist
) -> list[torch.Tensor]:
    """The scores of this rank's share of ``groups`` (every ``d.world_size``-th from ``d.rank``; all of them with a
    one-process ``d``), one (k,) tensor per group on the CPU, in passes of at most ``size`` answers evened out over
    the ranks (sharded, every rank runs every pass)."""
    mine = list(range(d.rank, len(groups), d.world_size))
    passes = answer_batches([len(groups[i].answers) for i in mine], size)
    filler = AnswerBatch((0,), slice(0, 1))
    out = []
    for batch, real, _ in update.evenly(passes, lambda: filler, d):
        ids = [mine[g] for g in batch.groups] if real else [0]
        values = scores(model, ids, batch.chunk).float().cpu()
        if real:
            out.append(values)
    flat = torch.cat(out) if out else torch.zeros(0)
    return list(flat.split([len(groups[i].answers) for i in mine]))


def check_passes(config: TrainingConfig, groups: Sequence[PreferenceGroup], d: Dist) -> None:
    """Sharded (FSDP), every forward is a collective that every rank runs: a prompt with more answers than a pass
    holds needs forwards of its own (`spanning_gradient`) that the other ranks would not run: refused."""
    most = max((len(group.answers) for group in groups), default=0)
    if d.sharded and config.batch.micro_size is not None and most > config.batch.micro_size:
        raise ConfigError(
            f"batch.micro_size={config.batch.micro_size} answers is fewer than the {most} answers of a prompt; with "
            f"run.parallelism fsdp every prompt's answers must fit one pass: set batch.micro_size ≥ {most}"
        )
