"""Scoring a sampled batch with every reward source and combining the scores: the weighted sum or GDPO, what reward
functions receive besides the texts, the ``reward/*`` metrics, and the watch for unscorable batches.

Notation: B samples, K reward sources."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from typing import Any

import torch

from rlhf.core.group import gdpo_advantages, sum_rewards
from rlhf.data.stream import PromptBatch
from rlhf.models.sharding import model_loader
from rlhf.models.sharding import sampling as sampling_weights
from rlhf.rollout.generation import Generated, repeat_each
from rlhf.rollout.rewards import RewardContext, RewardError, RewardSet, load_reward_set, reward_models
from rlhf.runlog.distributed import SINGLE, Dist

MAX_UNSCORED_STEPS = 5
"""Consecutive steps with no scored sample before the run stops: one can happen by chance (a multi-task batch
missing every reward), five in a row mean the rewards do not fit the data."""


def load_rewards(reward: Any, tokenizer: Any, d: Dist, bf16: bool = False) -> RewardSet:
    """A ``reward`` (or judge) section's sources, an ensemble's combined as ``reward.ensemble`` says; when the
    run shards its models, each rank holds 1/world of every reward model (they are gathered for scoring, see
    :func:`score`); ``bf16``: in bfloat16 (:func:`reward_dtype`)."""
    return load_reward_set(
        reward_spec(reward.source),
        policy_tokenizer=tokenizer,
        device=str(d.device),
        loader=model_loader(d),
        dtype=reward_dtype(bf16),
        objective=reward.ensemble.objective,
        uwo_lambda=reward.ensemble.uwo_lambda,
    )


def reward_dtype(bf16: bool) -> str | None:
    """The dtype reward models load in: bfloat16 under mixed precision (frozen: nothing rounds away), else None,
    their checkpoint's own."""
    return "bfloat16" if bf16 else None


def reward_spec(reward: Any) -> Any:
    """The config's ``reward`` (a string or a tuple of RewardSpec dataclasses) as load_reward_set takes it."""
    return reward if isinstance(reward, str) else [dataclasses.asdict(spec) for spec in reward]


@dataclasses.dataclass(frozen=True)
class Scores:
    """Rewards of a batch of B samples from K sources. ``per_source``: (B, K), NaN = unscored. ``raw``: (B,) the
    weighted sum of the scored sources (the user's objective, ``reward/mean``), NaN when none scored the sample.
    ``combined``: (B,) what the advantages start from: ``raw``, or with ``gdpo`` the GDPO-normalised combination
    (``normalized`` True). ``metrics`` / ``extra``: as in :class:`~rlhf.rollout.rewards.RewardScores`."""

    per_source: torch.Tensor
    combined: torch.Tensor
    names: list[str]
    seconds: float
    raw: torch.Tensor
    normalized: bool = False
    metrics: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    extra: dict[str, list[Any]] = dataclasses.field(default_factory=dict)

    def select(self, rows: torch.Tensor) -> Scores:
        """The scores of ``rows`` (B',) in that order; logged metrics are the batch's and stay whole."""
        index = rows.tolist()
        extra = {key: [values[i] for i in index] for key, values in self.extra.items()}
        return dataclasses.replace(
            self, per_source=self.per_source[rows], combined=self.combined[rows], raw=self.raw[rows], extra=extra
        )


def score(
    rewards: Any,
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list],
    aggregation: str,
    group_size: int = 1,
    token_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
    context: RewardContext | None = None,
    d: Dist = SINGLE,
) -> Scores:
    """Score with every source, then combine: weighted sum, or GDPO within groups of ``group_size`` rows (PPO: the whole
    batch, so rewards on different scales weigh as their weights say). ``token_ids``, ``context``:
    ``RewardSet.score``'s. Every argument is the whole batch; under ``torchrun`` each rank scores its shard (whole
    groups) and the scores are gathered before they are combined: every rank returns the whole batch's."""
    start = time.perf_counter()
    B = len(prompts)
    if d.distributed:
        rows = d.shard(B, unit=group_size)
        prompts, completions = [prompts[i] for i in rows], [completions[i] for i in rows]
        columns = {key: [values[i] for i in rows] for key, values in columns.items()}
        token_ids = None if token_ids is None else (token_ids[0][rows], token_ids[1][rows])
        context = None if context is None else context.select(rows)
    with contextlib.ExitStack() as weights:  # sharded reward models: gathered once for all their micro-batches,
        for source in rewards.sources:  # however many each rank's share makes (like a rollout's policy)
            for model in reward_models(source):
                weights.enter_context(sampling_weights(model.model, d))
        result = rewards.score(prompts, completions, columns, token_ids, context)
    per_source = result.scores.float()
    metrics, extra = dict(result.metrics), dict(result.extra)
    if d.distributed:
        per_source = torch.stack(d.gather_rows(list(per_source.cpu()), B, unit=group_size))
        keys = sorted({key for part in d.gather([list(metrics)]) for key in part})
        metrics = {key: d.gather(metrics.get(key, [])) for key in keys}  # pooled: their step means are logged
        extra = _gather_extra(extra, B, group_size, d)
    K = per_source.shape[1]
    weights = rewards.weights.to(per_source)
    raw = sum_rewards(per_source.view(1, B, K), weights).reshape(B)
    combined, normalized = raw, False
    if aggregation == "gdpo" and K > 1:
        groups = per_source.view(-1, group_size if group_size > 1 else B, K)
        combined = gdpo_advantages(groups, weights).reshape(B)
        combined, normalized = torch.where(per_source.isnan().all(-1), torch.nan, combined), True
    return Scores(
        per_source, combined, list(result.names), time.perf_counter() - start, raw, normalized, metrics, extra
    )


def _gather_extra(extra: dict[str, list[Any]], B: int, group_size: int, d: Dist) -> dict[str, list[Any]]:
    """``log_extra`` columns of every rank's rows, back in row order (a column a rank lacks is None there)."""
    keys = sorted({key for part in d.gather([list(extra)]) for key in part})
    rows = len(d.shard(B, unit=group_size))
    local = [{key: extra[key][i] if key in extra else None for key in keys} for i in range(rows)]
    merged = d.gather_rows(local, B, unit=group_size)
    return {key: [row[key] for row in merged] for key in keys}


def concat_scores(parts: list[Scores]) -> Scores:
    """The Scores of several batches as one (rows in order, times summed, logged metrics pooled; a ``log_extra``
    column missing from a part is None in its rows)."""
    keys = dict.fromkeys(key for part in parts for key in part.metrics)
    metrics = {key: [v for part in parts for v in part.metrics.get(key, [])] for key in keys}
    columns = dict.fromkeys(key for part in parts for key in part.extra)
    extra = {key: [v for part in parts for v in part.extra.get(key, [None] * len(part.raw))] for key in columns}
    rows = {key: torch.cat([getattr(part, key) for part in parts]) for key in ("per_source", "combined", "raw")}
    seconds = sum(part.seconds for part in parts)
    return dataclasses.replace(parts[0], **rows, seconds=seconds, metrics=metrics, extra=extra)


def reward_context(
    batch: PromptBatch, generated: Generated | None = None, repeat: int = 1, trainer_state: Any = None
) -> RewardContext:
    """What reward functions get besides texts (TRL's convention): each row's chat prompt (``repeat`` rows per
    prompt, as `rlhf.rollout.generation.generate` lays them out), the completion ids of ``generated``, its
    episodes (multi-turn) and ``trainer_state``."""
    messages = repeat_each(batch.messages, repeat) if any(m is not None for m in batch.messages) else None
    ids, episodes = (None, None) if generated is None else (generated.completion_ids, generated.episodes)
    return RewardContext(messages=messages, completion_ids=ids, trainer_state=trainer_state, episodes=episodes)


def make_trainer_state(**fields: Any) -> Any:
    """The ``transformers.TrainerState`` reward functions receive as ``trainer_state`` (TRL passes its trainer's):
    ``fields`` as the training loop fills them (`rlhf.trainers.rl.inputs.make_trainer_state`); without any (``rlhf
    sample``, ``rlhf eval``) a fresh state, as TRL's before training: step 0 of 0, epoch 0 (a number on every
    transformers version: before 5.x's later releases a fresh state's epoch was None)."""
    from transformers import TrainerState  # only here: importing transformers costs seconds

    return TrainerState(**{"epoch": 0.0, **fields})


def _mean_std(values: torch.Tensor) -> tuple[float, float]:
    """Mean and population std of the non-NaN entries; NaN for both when there are none."""
    values = values[~values.isnan()]
    if not len(values):
        return math.nan, math.nan
    return values.mean().item(), values.std(unbiased=False).item()


def reward_metrics(scores: Scores, prefix: str = "reward") -> dict[str, float]:
    """The ``reward/*`` metrics of the README's "Metrics" table under ``prefix`` (``eval/reward``, ``judge``):
    means and stds over the scored samples, the mean of each ``log_metric`` name (NaN values left out, as TRL
    does), ``unscored`` only when > 0, per-source ones only with several sources."""
    out = dict(zip((f"{prefix}/mean", f"{prefix}/std"), _mean_std(scores.raw), strict=True))
    if scores.normalized:
        out[f"{prefix}/normalized_mean"], out[f"{prefix}/normalized_std"] = _mean_std(scores.combined)
    unscored = int(scores.raw.isnan().sum())
    if unscored:
        out[f"{prefix}/unscored"] = unscored
    if len(scores.names) > 1:
        for k, name in enumerate(scores.names):
            out[f"{prefix}/{name}/mean"], out[f"{prefix}/{name}/std"] = _mean_std(scores.per_source[:, k])
    for key, values in scores.metrics.items():
        out[f"{prefix}/{key}"] = _mean_std(torch.tensor(values, dtype=torch.float64))[0]
    return out


class UnscoredSteps:
    """Watches for batches in which no sample could be scored (every reward ``None``): updating on one would still
    move the policy (Adam's momentum, weight decay, the KL and entropy terms) on nothing. :meth:`skip` says
    whether to skip this step's update, warning on stderr; :data:`MAX_UNSCORED_STEPS` in a row raise RewardError."""

    def __init__(self):
        self.in_a_row = 0

    def skip(self, step: int, rewards: torch.Tensor, names: list[str]) -> bool:
        """``rewards``: (B,) the batch's combined rewards, NaN = unscored."""
        if not rewards.isnan().all():
            self.in_a_row = 0
            return False
        self.in_a_row += 1
        sources = ", ".join(map(repr, names))
        if self.in_a_row >= MAX_UNSCORED_STEPS:
            raise RewardError(
                f"step {step}: no sample of the last {self.in_a_row} batches could be scored (reward {sources} "
                "returned None for every one): check that the reward functions fit the data, e.g. the dataset "
                "columns they read and the completion format they expect"
            )
        print(
            f"warning: step {step}: no sample of the batch could be scored (reward {sources} returned None for "
            f"all {len(rewards)}); the update is skipped ({self.in_a_row} such step(s) in a row, the run stops "
            f"at {MAX_UNSCORED_STEPS})",
            file=sys.stderr,
        )
        return True
