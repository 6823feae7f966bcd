"""Direct preference optimisation (`rlhf dpo`): the policy learns from preference pairs without a reward model.

`run` reads top to bottom: (1) the pairs, tokenised whole (``prompt + response + eos``, as ``rlhf rm`` does) and
grouped by prompt (`rlhf.data.groups`) → (2) the policy → (3) the reference log-probs of every answer, computed once
with the policy *before* training (why: docs/dpo.md, "The reference") → (4) the epoch loop SFT, RM and DPO share
(`rlhf.trainers.supervised`): per step, this rank's prompts in passes of answers, each answer forwarded once
(`rlhf.trainers.supervised.group_step`, docs/rankings.md), the loss of `rlhf.core.dpo` over the prompts' pairs, each
prompt's pairs averaged → (5) ``final/`` (LoRA merged). The metrics (named as other
libraries name them): docs/dpo.md, "Metrics".
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlhf import planning
from rlhf.config import DPOConfig
from rlhf.core.dpo import DPOLoss, dpo_loss
from rlhf.data import TokenizedSFT, load_preferences
from rlhf.data.groups import PreferenceGroup, group_preferences
from rlhf.data.stream import fingerprint_of
from rlhf.data.tokenization import IGNORE_INDEX
from rlhf.models.loading import load_tokenizer
from rlhf.models.sharding import gathered, load_lm, preparation
from rlhf.runlog import distributed, rundir
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.trainers import supervised
from rlhf.trainers.sft import Batcher, token_losses, write_final
from rlhf.trainers.update import Trainable

METRICS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)
"""Each is logged as ``train/loss`` and the others bare during training, and as ``eval/<name>`` on held-out pairs."""


@distributed.entry
@rundir.claims_output_dir
def run(config: DPOConfig) -> Path:
    """Train ``config.model.name`` on the preference pairs of ``config.data.train``; returns ``final/``."""
    d = supervised.start(config)
    # 1. every pair, before any step, grouped by prompt
    tokenizer = load_tokenizer(config.model.name, config.data.chat_template_kwargs)
    train = load_preferences(config.data.train, tokenizer, config.data.max_length)
    held_out = load_preferences(config.data.eval, tokenizer, config.data.max_length) if config.data.eval else []
    groups, held_out_groups = group_preferences(train), group_preferences(held_out)
    supervised.check_passes(config, groups, d)
    positions, answers = planning.sequence_positions(train + held_out), planning.most_answers(groups)
    planning.check(config, d, positions, answers=answers)  # before any weights
    # 2. the policy; 3. the reference: the policy's own log-probs before any step
    model = load_lm(config.model.name, config.model.dtype, d, preparation(config.model, d.device))
    # only its padding is used (`Batcher.padded`): the passes of answers are planned by `supervised.group_step`
    batches = Batcher(
        config.effective_micro_batch_size, False, config.data.max_length, int(tokenizer.eos_token_id), d.device
    )
    reference = None
    if config.dpo.loss != DPOLoss.SIMPO:
        # sharded: one all-gather for the whole pass, and every module resharded after it — a root left gathered
        # would hand the optimizer its gathered copies instead of the sharded parameters
        with gathered(model):
            reference = reference_logps(model, groups + held_out_groups, batches)
    print(
        f"dpo: {len(train)} training pairs over {len(groups)} prompts ({sum(len(g.answers) for g in groups)} "
        f"answers, each forwarded once per epoch), {len(held_out)} held out; loss {config.dpo.loss}, β "
        f"{config.dpo.beta}; "
        + ("no reference (simpo)" if reference is None else "reference log-probs computed from the starting policy"),
        file=sys.stderr,
    )
    ref_train, ref_held = (None, None) if reference is None else (reference[: len(groups)], reference[len(groups) :])
    # 4. the epoch loop: DPO over each step's prompts, AdamW, evaluation, checkpoints
    trainable = Trainable(model, d)
    task = supervised.Task(
        trainable,
        supervised.OneModel("model", model, model),
        step=functools.partial(train_step, config, trainable, groups, ref_train, batches),
        evaluate=functools.partial(evaluate, config, model, held_out_groups, ref_held, batches, d)
        if held_out
        else None,
        tokens=lambda rows: sum(groups[i].tokens() for i in rows),
    )
    fingerprint = fingerprint_of((g.prompt_ids, *g.answers, g.better, g.worse) for g in groups)
    supervised.train(config, task, len(groups), fingerprint, config.dpo.epochs, d)
    # 5. final/, LoRA merged
    return write_final(config, model, tokenizer, d)


def answer_sequences(groups: Sequence[PreferenceGroup], ids: list[int], chunk: slice | None) -> list[TokenizedSFT]:
    """The answers of the groups ``ids`` (``chunk``: of the one group's), each as ``prompt + response`` with labels on
    the response only."""
    answers = [(group, answer) for group in (groups[i] for i in ids) for answer in group.answers]
    return [
        TokenizedSFT(group.where[0], group.prompt_ids + answer, [IGNORE_INDEX] * len(group.prompt_ids) + answer)
        for group, answer in (answers if chunk is None else answers[chunk])
    ]


def scores_of(groups: Sequence[PreferenceGroup], batches: Batcher) -> supervised.Scores:
    """The policy's `rlhf.trainers.supervised.Scores`: each answer's summed response log-prob, one right-padded
    forward (`rlhf.trainers.sft.token_losses`, float32 log-softmax)."""

    def scores(model: Callable[..., Any], ids: list[int], chunk: slice | None) -> torch.Tensor:
        per_token, mask = token_losses(model, batches.padded(answer_sequences(groups, ids, chunk)))
        return -(per_token * mask).sum(-1)

    return scores


@torch.no_grad()
def reference_logps(model: torch.nn.Module, groups: Sequence[PreferenceGroup], batches: Batcher) -> list[torch.Tensor]:
    """Summed log-probs of every answer of ``groups`` under ``model`` as it is now, one (k,) tensor per group: the
    reference. Every rank computes all of them (sharded, every rank is in every forward; the caller gathers the
    model)."""
    model.eval()
    size, one = batches.micro_batch_size, Dist(device=torch.device(batches.device))
    reference = supervised.group_scores(model, groups, size, scores_of(groups, batches), one)
    model.train()
    return reference


def objective_of(
    config: DPOConfig, groups: Sequence[PreferenceGroup], reference: list[torch.Tensor] | None, prefix: str
) -> supervised.Objective:
    """The `rlhf.trainers.supervised.Objective` of `rlhf.core.dpo`: the groups' pairs, each prompt's averaged, and
    the `METRICS` (``train/loss`` and the others bare during training, ``eval/<name>`` held out)."""

    def objective(logps: torch.Tensor, ids: list[int], step_groups: int, step_pairs: int):
        members = [groups[i] for i in ids]
        pairs = supervised.group_pairs(members, step_groups)
        better, worse = pairs["better"].to(logps.device), pairs["worse"].to(logps.device)
        lengths = torch.tensor([len(a) for g in members for a in g.answers], dtype=logps.dtype, device=logps.device)
        ref = None if reference is None else torch.cat([reference[i] for i in ids]).to(logps.device, logps.dtype)
        loss, stats = dpo_loss(
            logps[better],
            logps[worse],
            None if ref is None else ref[better],
            None if ref is None else ref[worse],
            beta=config.dpo.beta,
            loss_type=config.dpo.loss,
            label_smoothing=config.dpo.label_smoothing,
            chosen_lengths=lengths[better],
            rejected_lengths=lengths[worse],
            simpo_gamma=config.dpo.simpo_gamma,
            weights=pairs["weight"].to(logps.device, logps.dtype),
        )
        share = len(better) / step_pairs  # these pairs' part of the step's means
        values = {
            "rewards/chosen": stats["rewards_chosen"].item(),
            "rewards/rejected": stats["rewards_rejected"].item(),
            "rewards/margins": stats["margins"].item(),
            "rewards/accuracies": stats["accuracy"].item(),
            "logps/chosen": logps[better].mean().item(),
            "logps/rejected": logps[worse].mean().item(),
        }
        values = {"loss": loss.item() / share} | values  # the weighted loss is already the step's share
        named = {
            (f"{prefix}/{key}" if prefix == "eval" or key == "loss" else key): v * share for key, v in values.items()
        }
        return loss, named

    return objective


def train_step(
    config: DPOConfig,
    trainable: Trainable,
    groups: list[PreferenceGroup],
    reference: list[torch.Tensor] | None,
    batches: Batcher,
    indices: list[int],
) -> dict[str, float]:
    """Backward of the step's loss over the prompts ``indices`` in passes of at most ``batch.micro_size`` answers
    (`rlhf.trainers.supervised.group_step`); returns the step's stats over all ranks."""
    scores, objective = scores_of(groups, batches), objective_of(config, groups, reference, "train")
    return supervised.group_step(trainable, indices, groups, config.batch.micro_size, scores, objective)


@torch.no_grad()
def evaluate(
    config: DPOConfig,
    model: torch.nn.Module,
    groups: list[PreferenceGroup],
    reference: list[torch.Tensor] | None,
    batches: Batcher,
    d: Dist = SINGLE,
) -> dict[str, float]:
    """The `METRICS` over all held-out prompts as ``eval/<name>`` (the loss weighs each prompt as a step does; each
    rank scores its share; sums over ranks)."""
    model.eval()
    logps = supervised.group_scores(model, groups, batches.micro_batch_size, scores_of(groups, batches), d)
    mine = list(range(d.rank, len(groups), d.world_size))
    totals = {f"eval/{key}": 0.0 for key in METRICS}
    if mine:
        num_pairs = sum(group.num_pairs for group in groups)
        objective = objective_of(config, groups, reference, "eval")
        _, totals = objective(torch.cat(logps).to(d.device), mine, len(groups), num_pairs)
    model.train()
    return d.sum_values(totals)
