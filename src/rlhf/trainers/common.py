"""Plumbing the RL trainers share: stop tokens, generating a batch, scoring it, held-out samples, the run dir.

Math never lives here (it is in ``rlhf.core``); this is I/O and bookkeeping around the models.
Notation: B sequences, C prompt columns, T response columns, K reward sources.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf.config import ConfigError, config_to_dict, config_to_yaml
from rlhf.core.group import gdpo_advantages, sum_rewards
from rlhf.data import held_out, left_pad, load_prompts
from rlhf.data.stream import PromptBatch, PromptStream
from rlhf.data.tokenization import stop_token_ids
from rlhf.models.loading import load_tokenizer
from rlhf.models.sharding import model_loader
from rlhf.models.sharding import sampling as sampling_weights
from rlhf.optim import build_optimizer
from rlhf.rollout.engine import RowGenerators, SamplingParams, sample
from rlhf.rollout.rewards import RewardContext, RewardError, RewardModelReward, RewardSet, load_reward_set
from rlhf.runlog import distributed
from rlhf.runlog.checkpoint import checkpoint_path, save_checkpoint
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.runlog.metrics import MetricsLogger, NoLogger
from rlhf.runlog.rundir import atomic_open, atomic_write_text, clear_run, load_resume_checkpoint
from rlhf.runlog.seeding import rng_state, seed_everything, set_rng_state
from rlhf.runlog.sharded_checkpoint import load_sharded, save_sharded

MAX_HELD_OUT = 32
"""Held-out prompts answered at every eval step: the first ones of ``data.eval``, or a slice of ``data.train``."""

MAX_UNSCORED_STEPS = 5
"""Consecutive steps whose every sample no reward source could score (all ``None``) before the run stops:
one such step is skipped with a warning (a multi-task batch can miss every reward by chance), five in a row
mean the rewards do not fit the data."""


def device_for_run() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclasses.dataclass(frozen=True)
class RLInputs:
    """What PPO and GRPO set up before their models (:func:`rl_inputs`)."""

    d: Dist
    tokenizer: Any
    stops: list[int]
    train_prompts: list
    eval_prompts: list
    rewards: RewardSet
    sampling: SamplingParams


def rl_inputs(config: Any) -> RLInputs:
    """Check every input (model paths, reward sources, stop token) before anything loads, seed every generator,
    then the policy's tokenizer, the stop token ids, the training and held-out prompts, the reward sources and
    the sampling settings."""
    from rlhf.inputs import check_inputs

    check_inputs(config)
    d = distributed.current()
    seed_everything(config.run.seed)
    tokenizer = load_tokenizer(config.model.name)
    train_prompts, eval_prompts = rl_prompts(config, tokenizer)
    sampling = SamplingParams.of(config.sampling)
    stops = stop_token_ids(tokenizer, config.sampling.stop)
    rewards = load_rewards(config, tokenizer, d)
    return RLInputs(d, tokenizer, stops, train_prompts, eval_prompts, rewards, sampling)


def load_rewards(config: Any, tokenizer: Any, d: Dist) -> RewardSet:
    """The config's reward sources for an RL trainer; when the run shards its models, each rank holds 1/world of
    every reward model (they are gathered for scoring, see :func:`score`)."""
    return load_reward_set(reward_spec(config.reward.source), policy_tokenizer=tokenizer, device=str(d.device),
                           loader=model_loader(d))  # fmt: skip


def reward_spec(reward: Any) -> Any:
    """The config's ``reward`` (a string or a tuple of RewardSpec dataclasses) as load_reward_set takes it."""
    if isinstance(reward, str):
        return reward
    return [dataclasses.asdict(spec) for spec in reward]


@dataclasses.dataclass(frozen=True)
class Generated:
    """A sampled batch. ``query_responses``/``attention_mask``: (B, C+T); ``responses``: (B, T), PAD after stop."""

    query_responses: torch.Tensor
    attention_mask: torch.Tensor
    responses: torch.Tensor
    completions: list[str]
    has_stop: torch.Tensor  # (B,) bool: the response ended with a stop token (not cut at max_new_tokens)
    pad_token_id: int

    @property
    def token_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What a reward model sharing the policy's tokenizer scores: (query ⊕ response, mask)."""
        return self.query_responses, self.attention_mask

    @property
    def completion_ids(self) -> list[list[int]]:
        """Each response's token ids without padding, the stop token included (TRL's ``completion_ids``: up to
        and including the first EOS)."""
        lengths = (self.responses != self.pad_token_id).sum(-1).tolist()
        return [row[:n] for row, n in zip(self.responses.tolist(), lengths, strict=True)]


def generate(
    model: nn.Module,
    tokenizer: Any,
    batch: PromptBatch,
    params: SamplingParams,
    stops: list[int],
    generator: torch.Generator,
    device: torch.device,
    repeat: int = 1,
    d: Dist = SINGLE,
    max_rows: int | None = None,
) -> Generated:
    """Sample ``repeat`` responses per prompt (consecutive rows), decode them, and build ``query ⊕ response``.

    Under ``torchrun`` each rank samples its shard of the rows (whole prompts: ``d.shard(n, unit=repeat)``) and
    the token ids are gathered, so every rank returns the whole batch. Row ``i`` draws from its own stream
    (:class:`~rlhf.rollout.engine.RowGenerators`, seeded from one draw of ``generator``), so the responses do
    not depend on the number of ranks. ``max_rows``: sample at most that many rows at a time (memory).
    """
    pad = tokenizer.pad_token_id
    n = len(batch) * repeat
    rows = d.shard(n, unit=repeat)
    noise = RowGenerators.spawn(generator, rows)
    prompt_ids = [batch.input_ids[row // repeat] for row in rows]
    responses: list[list[int]] = []
    step = max_rows or max(1, len(rows))
    with sampling_weights(model, d):  # sharded weights are gathered once for the whole rollout
        for start in range(0, len(rows), step):
            chunk = slice(start, start + step)
            query, query_mask = left_pad(prompt_ids[chunk], pad)
            sampled = sample(model, query.to(device), query_mask.to(device), params, stops, pad, noise[chunk])
            lengths = (sampled != pad).sum(-1).tolist()
            responses += [ids[:length] for ids, length in zip(sampled.tolist(), lengths, strict=True)]
    responses = d.gather_rows(responses, n, unit=repeat)
    return assemble([batch.input_ids[row // repeat] for row in range(n)], responses, tokenizer, stops, device)


def assemble(
    prompt_ids: list[list[int]], responses: list[list[int]], tokenizer: Any, stops: list[int], device: torch.device
) -> Generated:
    """A `Generated` batch from unpadded prompt and response ids: prompts left-padded, responses right-padded
    to the longest one (at least one column)."""
    pad = tokenizer.pad_token_id
    query, query_mask = left_pad(prompt_ids, pad)
    T = max(1, max(map(len, responses), default=1))
    response = torch.full((len(responses), T), pad, dtype=torch.long)
    for i, ids in enumerate(responses):
        response[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    query, query_mask, response = query.to(device), query_mask.to(device), response.to(device)
    response_mask = (response != pad).long()
    has_stop = torch.isin(response, torch.tensor(stops, device=device)).any(-1)
    return Generated(
        query_responses=torch.cat([query, response], dim=1),
        attention_mask=torch.cat([query_mask, response_mask], dim=1),
        responses=response,
        completions=tokenizer.batch_decode(response.tolist(), skip_special_tokens=True),
        has_stop=has_stop,
        pad_token_id=pad,
    )


@dataclasses.dataclass(frozen=True)
class Scores:
    """Rewards of a batch of B samples from K sources.

    ``per_source``: (B, K), NaN = unscored. ``raw``: (B,) the weighted sum of the scored sources — the user's
    objective, what ``reward/mean`` reports; NaN when no source scored the sample. ``combined``: (B,) what
    the advantages start from: ``raw`` itself, or with ``reward_aggregation: gdpo`` the GDPO-normalised
    combination (``normalized`` is then True). ``metrics`` / ``extra``: what reward functions logged through
    ``log_metric`` (``"<source>/<name>"`` → values) and ``log_extra`` (``"<source>/<column>"`` → B values).
    """

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
            self,
            per_source=self.per_source[rows],
            combined=self.combined[rows],
            raw=self.raw[rows],
            extra=extra,
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
    """Score with every source, then combine: weighted sum, or GDPO within groups of ``group_size`` rows.

    For PPO (one sample per prompt) GDPO's "group" is the whole batch: each reward is normalised over the
    batch before the weighted sum, so rewards on different scales weigh as their weights say.
    ``token_ids``: the policy's (query ⊕ response, mask), scored as they are by reward models that share the
    policy's tokenizer (see ``RewardSet.score``). ``context``: chat prompts, completion ids and trainer state
    for reward functions (:func:`reward_context`, :func:`make_trainer_state`).
    Every argument is the whole batch; under ``torchrun`` each rank scores its shard (whole groups) and the
    scores are gathered before they are combined, so every rank returns the whole batch's `Scores`.
    """
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
            if isinstance(source, RewardModelReward):
                weights.enter_context(sampling_weights(source.model, d))
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
    return Scores(per_source, combined, list(result.names), time.perf_counter() - start, raw, normalized,
                  metrics, extra)  # fmt: skip


def _gather_extra(extra: dict[str, list[Any]], B: int, group_size: int, d: Dist) -> dict[str, list[Any]]:
    """``log_extra`` columns of every rank's rows, back in row order (a column a rank lacks is None there)."""
    keys = sorted({key for part in d.gather([list(extra)]) for key in part})
    rows = len(d.shard(B, unit=group_size))
    local = [{key: extra[key][i] if key in extra else None for key in keys} for i in range(rows)]
    merged = d.gather_rows(local, B, unit=group_size)
    return {key: [row[key] for row in merged] for key in keys}


def reward_context(
    batch: PromptBatch, generated: Generated | None = None, repeat: int = 1, trainer_state: Any = None
) -> RewardContext:
    """What reward functions get besides texts (TRL's convention): each row's chat prompt (``repeat`` rows per
    prompt, as :func:`generate` lays them out), the completion ids of ``generated`` and ``trainer_state``."""
    messages = repeat_each(batch.messages, repeat) if any(m is not None for m in batch.messages) else None
    ids = generated.completion_ids if generated is not None else None
    return RewardContext(messages=messages, completion_ids=ids, trainer_state=trainer_state)


def make_trainer_state(
    config: Any, steps_done: int, stream: PromptStream | None = None, rows: int | None = None
) -> Any:
    """The ``transformers.TrainerState`` reward functions receive as ``trainer_state`` (TRL passes its trainer's).

    ``global_step``: iterations completed (the ``step`` of metrics.jsonl, 0 while the first batch is scored);
    ``max_steps``: ``config.steps``; ``epoch``: passes over the training prompts so far, fractional (from the
    prompt stream's position); ``logging_steps`` / ``eval_steps`` / ``save_steps``: ``log_every`` /
    ``eval_every`` / ``save_every``; ``train_batch_size``: ``rows`` (completions per step). Without a config
    (``rlhf sample``, ``rlhf eval``) it is a fresh state, as TRL's before training: step 0 of 0.
    """
    from transformers import TrainerState  # only here: importing transformers costs seconds

    if config is None:
        return TrainerState()
    epoch = None
    if stream is not None:
        epoch = stream.epoch + stream.index / len(stream.prompts)
        num_epochs = math.ceil(config.steps * stream.batch_size / len(stream.prompts))
    return TrainerState(
        epoch=epoch, global_step=steps_done, max_steps=config.steps, logging_steps=config.run.log_every,
        eval_steps=config.run.eval_every, save_steps=config.run.save_every, train_batch_size=rows,
        num_train_epochs=num_epochs if stream is not None else 0,
    )  # fmt: skip


def _mean_std(values: torch.Tensor) -> tuple[float, float]:
    """Mean and population std of the non-NaN entries; NaN for both when there are none."""
    values = values[~values.isnan()]
    if not len(values):
        return math.nan, math.nan
    return values.mean().item(), values.std(unbiased=False).item()


def reward_metrics(scores: Scores, prefix: str = "reward") -> dict[str, float]:
    """``reward/mean``, ``reward/std``: the weighted sum of the raw rewards over scored samples (the user's
    objective, also under GDPO); ``reward/normalized_mean`` / ``_std``: GDPO's combination, with gdpo only;
    ``reward/unscored``: samples no source scored (when > 0); ``reward/<name>/mean`` and ``/std`` per source
    with several sources; ``reward/<source>/<metric>``: the step's mean of what a reward function logged with
    ``log_metric(metric, value)`` (NaN values left out, as TRL does)."""
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


def sample_rows(
    step: int, prompts: list[str], completions: list[str], scores: Scores
) -> list[dict[str, Any]]:
    """One JSON row per sample: step, prompt, completion, ``reward`` (the weighted sum of the raw rewards),
    ``rewards`` by source (with several) and ``extra`` (the ``log_extra`` columns, ``"<source>/<column>"``)."""
    rows = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        value = scores.raw[i].item()
        row: dict[str, Any] = {"step": step, "prompt": prompt, "completion": completion}
        row["reward"] = None if math.isnan(value) else value
        if len(scores.names) > 1:
            row["rewards"] = {
                name: (None if math.isnan(v) else v)
                for name, v in zip(scores.names, scores.per_source[i].tolist(), strict=True)
            }
        if scores.extra:
            row["extra"] = {key: values[i] for key, values in scores.extra.items()}
        rows.append(row)
    return rows


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    with atomic_open(path) as f:
        for row in rows:
            # default=str: a log_extra value JSON cannot hold is written as its text rather than losing the file
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return path


def write_samples(
    output_dir: Path, step: int, prompts: list[str], completions: list[str], scores: Scores
) -> Path:
    """``samples/step_NNNNNN.jsonl``: one line per held-out prompt with its completion and rewards."""
    path = output_dir / "samples" / f"step_{step:06d}.jsonl"
    return _write_rows(path, sample_rows(step, prompts, completions, scores))


def write_completions(
    output_dir: Path, step: int, prompts: list[str], completions: list[str], scores: Scores
) -> Path | None:
    """``completions/step_NNNNNN.jsonl``: the step's training samples (rows as in ``samples/``), written only
    when a reward function logged columns with ``log_extra`` — TRL's completions table
    (``completions/completions_NNNNN.parquet``, the last batch's prompts, completions, rewards and extra
    columns at each logging step). None when there is nothing to write."""
    if not scores.extra:
        return None
    path = output_dir / "completions" / f"step_{step:06d}.jsonl"
    return _write_rows(path, sample_rows(step, prompts, completions, scores))


def log_completions(
    config: Any, output_dir: Path, step: int, prompts: list[str], completions: list[str], scores: Scores
) -> None:
    """:func:`write_completions` at the steps whose metrics are logged (every ``log_every`` and the last)."""
    if step % config.run.log_every == 0 or step == config.steps:
        write_completions(output_dir, step, prompts, completions, scores)


class UnscoredSteps:
    """Watches for batches in which no sample could be scored (every reward ``None``).

    Such a batch carries no learning signal: updating on it would still move the policy (Adam's momentum,
    weight decay, the KL and entropy terms) on nothing. :meth:`skip` says whether to skip this step's update,
    warning on stderr; after :data:`MAX_UNSCORED_STEPS` such steps in a row it raises a :class:`RewardError`.
    """

    def __init__(self, limit: int = MAX_UNSCORED_STEPS):
        self.limit = limit
        self.in_a_row = 0

    def skip(self, step: int, rewards: torch.Tensor, names: list[str]) -> bool:
        """``rewards``: (B,) the batch's combined rewards, NaN = unscored."""
        if not rewards.isnan().all():
            self.in_a_row = 0
            return False
        self.in_a_row += 1
        sources = ", ".join(map(repr, names))
        if self.in_a_row >= self.limit:
            raise RewardError(
                f"step {step}: no sample of the last {self.in_a_row} batches could be scored (reward {sources} "
                "returned None for every one): check that the reward functions fit the data, e.g. the dataset "
                "columns they read and the completion format they expect"
            )
        print(
            f"warning: step {step}: no sample of the batch could be scored (reward {sources} returned None for "
            f"all {len(rewards)}); the update is skipped ({self.in_a_row} such step(s) in a row, the run stops "
            f"at {self.limit})",
            file=sys.stderr,
        )
        return True


def write_run_config(output_dir: Path, config: Any) -> None:
    atomic_write_text(output_dir / "config.yaml", config_to_yaml(config))


def open_run(
    output_dir: Path, config: Any, checkpoint: Path | None, start: int, d: Dist = SINGLE
) -> MetricsLogger | NoLogger:
    """Say whether the run resumes, write ``config.yaml`` and open ``metrics.jsonl``.

    Resuming from ``checkpoint`` (at step ``start``) keeps the metric rows before ``start + 1``. Otherwise
    the previous run's files are deleted first (``--run.overwrite``, or a resume with nothing to resume), so no
    stale checkpoint or sample survives; `rundir.claim` has already refused a run nobody asked to replace.
    Shared by every trainer so resumes read the same everywhere. Under ``torchrun`` rank 0 alone does this
    (the others get a `NoLogger`), after every rank has checked that the global batch gives it rows.
    """
    if config.batch.size < d.world_size:
        raise ConfigError(
            f"{config.COMMAND}: batch.size={config.batch.size} is global (all ranks together) and gives no rows to "
            f"some of the {d.world_size} ranks; use a batch.size of at least {d.world_size} or fewer processes"
        )
    if not d.is_main:
        return NoLogger()
    if checkpoint is not None:
        print(f"resuming from {checkpoint} (step {start})", file=sys.stderr)
    else:
        if config.run.resume:
            print(f"resume: no checkpoint under {output_dir / 'checkpoints'}; starting from step 0",
                  file=sys.stderr)  # fmt: skip
        clear_run(output_dir)
    write_run_config(output_dir, config)
    resume_step = start + 1 if checkpoint is not None else None
    return MetricsLogger(
        output_dir, config.run.report_to, resume_step=resume_step, run_config=config_to_dict(config),
        run_name=config.run.name,
    )


def rl_prompts(config: Any, tokenizer: Any) -> tuple[list, list]:
    """Training prompts, and held-out ones: ``data.eval``, else a small deterministic slice of ``data.train``."""
    prompts = load_prompts(config.data.train, tokenizer, config.sampling.max_prompt_length)
    if config.data.eval:
        return prompts, load_prompts(config.data.eval, tokenizer, config.sampling.max_prompt_length)[:MAX_HELD_OUT]
    n = min(MAX_HELD_OUT, len(prompts) // 10)
    if n == 0:
        return prompts, []
    return held_out(prompts, n, seed=config.run.seed)


@dataclasses.dataclass
class TrainState:
    """The resumable part of an RL run besides the models: optimizer, schedule, prompt stream and the RNGs
    (``sampling`` draws the responses, ``shuffle`` the minibatch order of later epochs)."""

    optimizer: torch.optim.Optimizer
    scheduler: Any
    stream: PromptStream
    generators: dict[str, torch.Generator]

    @classmethod
    def create(
        cls, config: Any, params: list[nn.Parameter], total_updates: int, prompts: list, device: torch.device
    ) -> TrainState:
        optimizer, scheduler = build_optimizer(params, config.optim, total_updates)
        seed = config.run.seed
        generators = {"sampling": torch.Generator(device).manual_seed(seed), "shuffle": torch.Generator()}
        generators["shuffle"].manual_seed(seed + 1)
        return cls(optimizer, scheduler, PromptStream(prompts, config.batch.size, seed=config.run.seed), generators)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint entries ``scheduler``, ``stream`` and ``rng`` (the optimizer is saved with the models)."""
        return {"scheduler": self.scheduler.state_dict(), "stream": self.stream.state_dict(),
                "rng": rng_state(self.generators)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["stream"])
        set_rng_state(state["rng"], self.generators)

    def save(self, out: Path, step: int, models: Any, extra: dict[str, Any], d: Dist) -> None:
        """Checkpoint ``step`` of an RL run: ``models`` (``modules()`` / ``state_dict()``), this state, ``extra``."""
        save_training(out, step, d, modules=models.modules(), optimizer=self.optimizer,
                      plain={**self.state_dict(), **extra},
                      unsharded=lambda: {"models": models.state_dict(), "optimizer": self.optimizer.state_dict()})

    def resume(self, config: Any, models: Any, d: Dist) -> tuple[Path | None, dict[str, Any]]:
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
    out: Path, step: int, d: Dist, *, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer,
    plain: dict[str, Any], unsharded: Any,
) -> None:  # fmt: skip
    """The checkpoint of ``step``. Unsharded runs: rank 0 writes ``state.pt`` = ``{step, **plain,
    **unsharded()}`` (every rank holds the same state). Sharded runs: every rank writes its DCP shards of
    ``modules`` and ``optimizer``, rank 0 the ``plain`` state (`rlhf.runlog.sharded_checkpoint`)."""
    if d.sharded:
        save_sharded(checkpoint_path(out, step), modules, optimizer, {"step": step, **plain})
    elif d.is_main:
        save_checkpoint(out, step, {"step": step, **plain, **unsharded()})


def restore_training(
    saved: dict[str, Any], d: Dist, *, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer,
    unsharded: Any,
) -> None:  # fmt: skip
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


def repeat_each(values: list[Any], k: int) -> list[Any]:
    """[a, b] → [a, a, b, b] for k = 2: per-prompt values aligned with k consecutive completions."""
    return [value for value in values for _ in range(k)]


def concat_scores(parts: list[Scores]) -> Scores:
    """The Scores of several batches as one (rows in order, times summed, logged metrics pooled; a ``log_extra``
    column missing from a part is None in its rows)."""
    metrics: dict[str, list[float]] = {}
    for part in parts:
        for key, values in part.metrics.items():
            metrics.setdefault(key, []).extend(values)
    columns = list(dict.fromkeys(key for part in parts for key in part.extra))
    extra = {
        key: [v for part in parts for v in part.extra.get(key, [None] * len(part.raw))] for key in columns
    }
    return Scores(
        torch.cat([s.per_source for s in parts]),
        torch.cat([s.combined for s in parts]),
        parts[0].names,
        sum(s.seconds for s in parts),
        torch.cat([s.raw for s in parts]),
        parts[0].normalized,
        metrics,
        extra,
    )


def response_metrics(generated: Generated) -> dict[str, float]:
    """``response/length_mean``, ``length_max``, ``eos_rate`` and ``tokens`` of a sampled batch."""
    lengths = (generated.responses != generated.pad_token_id).sum(-1).float()
    return {
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/eos_rate": generated.has_stop.float().mean().item(),
        "response/tokens": lengths.sum().item(),
    }


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """The rows of one forward/backward pass and the only columns of ``query ⊕ response`` they need.

    rows: (b,) row indices. first_column: the first of the C query columns where one of the rows has a
    real token (left padding before it is cut). response_length: T' ≤ T response columns kept — the
    longest response + 1, for the value read one past the stop token (right padding after it is cut).
    """

    rows: torch.Tensor
    first_column: int
    response_length: int

    def columns(self, C: int) -> slice:
        """The kept columns of a (B, C+T) ``query ⊕ response`` tensor."""
        return slice(self.first_column, C + self.response_length)


def plan_micro_batches(
    rows: torch.Tensor, attention_mask: torch.Tensor, T: int, max_rows: int, max_tokens: int | None
) -> list[MicroBatch]:
    """Split the ``rows`` of one minibatch into micro-batches with their padding cut.

    ``attention_mask``: (B, C+T) of the whole batch, query left-padded, response right-padded. A micro-batch
    holds at most ``max_rows`` rows and, with ``max_tokens``, at most that many tokens once padded to its
    own longest row (rows × kept columns). With a token budget the rows are first sorted longest first, so
    rows of similar length share a micro-batch and pad little; a row longer than the budget alone gets a
    micro-batch of its own. Without one, the rows keep their order in consecutive chunks of ``max_rows``.
    Every row lands in exactly one micro-batch; the plan depends only on the lengths, so the rollout's
    no-grad pass and the first epoch, planned alike, run exactly the same forwards.
    """
    C = attention_mask.shape[1] - T
    query = attention_mask[rows, :C].sum(-1).tolist()
    needed = (attention_mask[rows, C:].sum(-1) + 1).clamp(max=T).tolist()  # response columns a row needs
    order = list(range(len(query)))
    if max_tokens is not None:
        order.sort(key=lambda i: -(query[i] + needed[i]))
    plans: list[list[int]] = []
    widest_query = widest_response = 0
    for i in order:
        grown = max(widest_query, query[i]) + max(widest_response, needed[i])
        group = plans[-1] if plans else []
        full = len(group) >= max_rows or (max_tokens is not None and (len(group) + 1) * grown > max_tokens)
        if not group or full:
            plans.append([i])
            widest_query, widest_response = query[i], needed[i]
        else:
            group.append(i)
            widest_query, widest_response = max(widest_query, query[i]), max(widest_response, needed[i])
    return [
        MicroBatch(
            rows=rows[torch.tensor(group)],
            first_column=C - max(query[i] for i in group),
            response_length=max(needed[i] for i in group),
        )
        for group in plans
    ]


def micro_batches(config: Any, minibatch: torch.Tensor, mask: torch.Tensor, T: int) -> list[MicroBatch]:
    """The micro-batches of one minibatch of rollout rows under ``config.batch.micro_size`` and
    ``config.batch.micro_tokens``, padding cut (:func:`plan_micro_batches`)."""
    size, budget = config.effective_micro_batch_size, config.batch.micro_tokens
    return plan_micro_batches(minibatch, mask, T, size, budget)


def evaluate_and_log(
    config: Any, policy: nn.Module, tokenizer: Any, rewards: Any, prompts: list, stops: list[int],
    device: torch.device, out: Path, step: int, metrics: dict[str, Any], logger: MetricsLogger | NoLogger,
    trainer_state: Any = None, d: Dist = SINGLE,
) -> None:  # fmt: skip
    """End of an RL step: answer the held-out prompts when due (every ``run.eval_every`` steps and at the last),
    adding ``eval/reward/*`` to this step's ``metrics``, then log the row when due (every ``log_every``).
    ``trainer_state``: what reward functions get as ``trainer_state`` on the held-out prompts."""
    evaluating = bool(prompts) and (
        (config.run.eval_every > 0 and step % config.run.eval_every == 0) or step == config.steps
    )
    if evaluating:
        start = time.perf_counter()
        metrics.update(
            evaluate(config, policy, tokenizer, rewards, prompts, stops, device, out, step, trainer_state, d)
        )
        metrics["time/eval_s"] = time.perf_counter() - start
    if evaluating or step % config.run.log_every == 0 or step == config.steps:
        logger.log(metrics)


@torch.no_grad()
def evaluate(
    config: Any, policy: nn.Module, tokenizer: Any, rewards: Any, prompts: list, stops: list[int],
    device: torch.device, out: Path, step: int, trainer_state: Any = None, d: Dist = SINGLE,
) -> dict[str, float]:  # fmt: skip
    """Answer the held-out prompts (same sampler, a fixed seed so steps are comparable), write them to
    ``samples/step_NNNNNN.jsonl`` (rank 0) and return ``eval/reward/*``. Each rank answers and scores its
    share; the rows are gathered."""
    sampling = SamplingParams.of(config.sampling)
    generator = torch.Generator(device).manual_seed(config.run.seed + 2)
    batch = PromptBatch.of(prompts, range(len(prompts)))
    generated = generate(policy, tokenizer, batch, sampling, stops, generator, device, d=d,
                         max_rows=config.effective_micro_batch_size)  # fmt: skip
    context = reward_context(batch, generated, trainer_state=trainer_state)
    scores = score(rewards, batch.texts, generated.completions, batch.columns, config.reward.aggregation,
                   token_ids=generated.token_ids, context=context, d=d)  # fmt: skip
    if d.is_main:
        write_samples(out, step, batch.texts, generated.completions, scores)
    return reward_metrics(scores, prefix="eval/reward")
