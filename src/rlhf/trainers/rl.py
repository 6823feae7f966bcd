"""The loop PPO and GRPO share, as `rlhf.trainers.supervised` is sft's, rm's and dpo's: the algorithm supplies its
models, how it samples, what it learns from a scored batch and what it adds after each step (`Algorithm`). The
phases of a step are numbered in `train`; the same step function by function: docs/architecture.md, "One PPO
step".
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf import planning
from rlhf.config import ConfigError, PolicyGradientConfig
from rlhf.config.sections import PolicyModel
from rlhf.core.logprobs import INVALID_LOGPROB
from rlhf.core.losses import off_policy_mask, top_entropy_mask
from rlhf.core.masked import masked_mean, masked_sum
from rlhf.core.mismatch import importance_weights, logprob_mismatch
from rlhf.core.sequences import ResponseMasks, penalize_missing_eos, response_masks
from rlhf.data import held_out, load_prompts
from rlhf.data.stream import PromptBatch, PromptStream
from rlhf.data.tokenization import stop_token_ids
from rlhf.models.loading import compile_models, load_tokenizer, load_trainable_state, trainable_state
from rlhf.models.policy import ActorCritic, Reference, ScoredTokens, ValueHead
from rlhf.models.precision import bf16_enabled, frozen_dtype
from rlhf.models.sharding import load_policy, unsharded
from rlhf.models.sharding import sampling as sampling_weights
from rlhf.rollout import generation, scoring
from rlhf.rollout.engine import SamplingParams
from rlhf.rollout.episodes import EpisodeLimits, EpisodeRunner, load_environment
from rlhf.rollout.rewards import EnvironmentReward, RewardModelReward, RewardSet
from rlhf.rollout.tools import Tool
from rlhf.runlog import rundir, samples
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.runlog.metrics import MetricsLogger, NoLogger, Stopwatch, open_run
from rlhf.runlog.progress import StepProgress
from rlhf.runlog.train_state import TrainState
from rlhf.trainers import supervised, update

MAX_HELD_OUT = 32
"""Held-out prompts answered at every eval step: the first ones of ``data.eval``, or a slice of ``data.train``."""


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What an RL run sets up before its models (:func:`load_inputs`)."""

    d: Dist
    tokenizer: Any
    stops: list[int]
    train_prompts: list
    eval_prompts: list
    rewards: RewardSet
    sampling: SamplingParams
    episodes: EpisodeRunner | None = None
    """Multi-turn runs: what plays the episodes (``rollout``); None: one response per prompt."""


@dataclasses.dataclass(frozen=True)
class Sampled:
    """One step's scored samples: ``generated`` (B rows), their ``scores``, the ``rewards`` (B,) float32 the update
    learns from (NaN: no source could score the row), each row's prompt and the sampler's own ``stats``."""

    generated: generation.Generated
    scores: scoring.Scores
    rewards: torch.Tensor
    prompts: list[str]
    stats: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Rollout:
    """What an update needs about one sampled batch, on the training device: ``query_responses``, ``attention_mask``
    (B, C+T) long; ``logprobs``, ``ref_logprobs`` (B, T) float32 at the sampling temperature, INVALID_LOGPROB at
    padding (None: taken from the training forward, or no reference); ``advantages`` (B, T) float32;
    ``sampler_logprobs`` (B, T) the engine's own log-probs of its tokens (`Generated.sampler_logprobs`);
    ``entropy_keep`` (B, T) bool, the tokens ``top_entropy_quantile`` trains the policy loss on (None: all)."""

    query_responses: torch.Tensor
    attention_mask: torch.Tensor
    logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    sampler_logprobs: torch.Tensor | None
    entropy_keep: torch.Tensor | None

    @property
    def response_length(self) -> int:
        return self.advantages.shape[1]

    def micro_inputs(self, micro: update.MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``query_responses`` and ``attention_mask`` of ``micro``: its rows, its own columns only (the cut ones are
        padding, outside every mask)."""
        cols = micro.columns(self.query_responses.shape[1] - self.response_length)
        return self.query_responses[micro.rows, cols], self.attention_mask[micro.rows, cols]

    def sampler_at(self, micro: update.MicroBatch) -> torch.Tensor | None:
        """``sampler_logprobs`` of ``micro``'s rows and response columns."""
        logprobs = self.sampler_logprobs
        return None if logprobs is None else logprobs[micro.rows, : micro.response_length]


@dataclasses.dataclass(frozen=True)
class ValueFunction:
    """PPO's value function: a ``head`` on the policy's trunk, or a separate ``critic``; ``load()`` builds a fresh
    one (on the CPU), the shell of the unsharded copy for ``final/``."""

    head: ValueHead | None = None
    critic: nn.Module | None = None
    load: Callable[..., nn.Module] | None = None


class Models:
    """What an RL run trains and scores against: the policy, its reference (None without a KL penalty in GRPO),
    PPO's value function, `Trainable`, policy and value function as the ranks train them, and the ``engine`` that
    samples (one of ours by name, or vLLM holding its own copy of the policy's weights). The checkpoint holds what
    changes: the policy's trained weights, the value function and a moving reference."""

    def __init__(
        self,
        model: PolicyModel,
        d: Dist,
        *,
        reference: bool,
        ema: float | None = None,
        value: Callable[[nn.Module], ValueFunction] | None = None,
        engine: generation.LocalEngine | generation.Engine = generation.AUTO,
    ):
        self.model, self.d, self.engine = model, d, engine
        self.policy, copy = load_policy(model, d, reference)
        self.reference = Reference(self.policy, copy, ema) if reference else None
        self.value = value(self.policy) if value is not None else ValueFunction()
        if model.compile:
            compile_models([self.policy, copy, self.value.critic], d.device)
        self.trainable = update.Trainable(ActorCritic(self.policy, self.value.head, self.value.critic), d)

    def old_scores(
        self, ids: torch.Tensor, mask: torch.Tensor, T: int, temperature: float, entropy: bool = False
    ) -> ScoredTokens:
        """The rollout's forward without gradients, on the plain module (no collective); a training forward is
        ``trainable.forward`` (through the gradient-synchronising wrapper under torchrun)."""
        return self.trainable.module(ids, mask, T, temperature, entropy=entropy)

    def sync_engine(self) -> None:
        """Give an engine with its own weights (vLLM) the policy's current ones; ours sample the policy itself. A
        server all ranks share gets them from rank 0, and the others expect what rank 0 pushed."""
        engine = self.engine
        if isinstance(engine, generation.LocalEngine):
            return
        with sampling_weights(self.policy, self.d) as policy:  # sharded: every rank gathers the full weights
            if not engine.shared or self.d.is_main:
                engine.sync(policy)
        if engine.shared and self.d.distributed:  # a collective: no rank samples before the push is done
            engine.client, engine.version = self.d.broadcast((engine.client, engine.version))

    def value_module(self) -> nn.Module | None:
        return self.value.head if self.value.head is not None else self.value.critic

    def modules(self) -> dict[str, nn.Module]:
        """The modules that change in training, by name (checkpoints)."""
        modules = {"policy": self.policy}
        if self.value_module() is not None:
            modules["value"] = self.value_module()
        if self.reference is not None and self.reference.moves:
            modules["reference"] = self.reference.copy
        return modules

    def state_dict(self) -> dict[str, Any]:
        # the policy's trained tensors only (LoRA: the adapters); the others whole
        return {name: trainable_state(m) if name == "policy" else m.state_dict() for name, m in self.modules().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, module in self.modules().items():
            if name == "policy":
                load_trainable_state(module, state[name], "policy weights")
            else:
                module.load_state_dict(state[name])


class Algorithm:
    """What PPO and GRPO supply to :func:`train`: their models, how they sample and what they learn; an algorithm
    with state of its own (PPO's β) also overrides the after-step and the checkpoint methods."""

    models: Models
    updates_per_step: int
    """Optimizer steps per iteration (the schedule spans ``steps`` × this)."""

    def sample(self, stream: PromptStream, generator: torch.Generator, trainer_state: Any) -> Sampled:
        """Phases 1-2: sample responses to the next prompts and score them."""
        raise NotImplementedError

    def learn(self, step: int, sampled: Sampled, state: TrainState, watch: Stopwatch) -> dict[str, float]:
        """The rollout's passes and the update (timed as ``logprobs`` and ``train``); their stats."""
        raise NotImplementedError

    def after_step(self, stats: dict[str, float]) -> dict[str, float]:
        """After the update (or its skip), with the step's stats so far: what to add to the row."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The algorithm's own state in a checkpoint."""
        return {}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` from a checkpoint's entries."""


def train(config: PolicyGradientConfig, make: Callable[[Any, Inputs], Algorithm]) -> Path:
    """Train ``config.model.name`` with the algorithm ``make(config, inputs)`` builds; returns ``final/``."""
    inputs = load_inputs(config)
    out, d = Path(config.output_dir), inputs.d
    d.check_batch(config.COMMAND, config.batch.size)
    algorithm = make(config, inputs)
    models = algorithm.models
    stream = PromptStream(inputs.train_prompts, config.batch.size, seed=config.run.seed)
    total = config.steps * algorithm.updates_per_step
    params = models.trainable.parameters()
    state = TrainState.create(params, optim=config.optim, seed=config.run.seed, total_updates=total, stream=stream)
    checkpoint, saved = state.resume(config, models, d)
    algorithm.load_state_dict(saved)
    models.sync_engine()  # the policy as trained so far: adapters, a resumed checkpoint
    start = saved.get("step", 0)
    logger = open_run(config, checkpoint, start, d)
    if start == 0 and inputs.eval_prompts:  # step 0 (a resumed run has its row): every curve's own starting point
        logger.log({"step": 0, **evaluate(config, inputs, models, 0, stream)})
    unscored = scoring.UnscoredSteps()
    with StepProgress(config.steps, start, enabled=config.run.progress and d.is_main, health=logger.health) as progress:
        for step in range(start + 1, config.steps + 1):
            watch = Stopwatch("rollout", "logprobs", "train")
            trainer_state = make_trainer_state(config, step - 1, stream)
            with watch("rollout"):  # 1. sample and score
                sampled = algorithm.sample(stream, state.generators["sampling"], trainer_state)
            watch.seconds["rollout"] -= sampled.scores.seconds  # scoring has its own time/score_s
            learned = {}
            if not unscored.skip(step, sampled.rewards, sampled.scores.names):  # else nothing to learn: no update
                learned = algorithm.learn(step, sampled, state, watch)  # 2. rollout passes and update
                models.sync_engine()  # vLLM samples the updated policy from the next rollout (and eval) on
                if models.reference is not None:
                    models.reference.follow()  # 3. kl.reference_ema: the anchor moves after each update
            stats = sampled.stats | learned
            stats |= algorithm.after_step(stats)  # 4. e.g. PPO's β for the next step
            metrics = step_metrics(step, sampled, state.scheduler.get_last_lr()[0], watch, stats)
            # 5. when due: the completions (rank 0), the held-out answers (every run.eval_every steps and at the last,
            # in this step's row), the row (every run.log_every steps)
            logging = step % config.run.log_every == 0 or step == config.steps
            if d.is_main and logging:
                generated = sampled.generated
                samples.write_completions(
                    out, step, sampled.prompts, generated.completions, sampled.scores, generated.episodes
                )
            every = config.run.eval_every
            evaluating = bool(inputs.eval_prompts) and ((every > 0 and step % every == 0) or step == config.steps)
            if evaluating:
                metrics |= evaluate(config, inputs, models, step, stream)
            if evaluating or logging:
                logger.log(metrics)
            progress.update(step, metrics)
            stop = doctor_stops(config, logger, d)  # 6. doctor.stop_on: a finding that severe started
            if stop or (config.run.save_every and step % config.run.save_every == 0):  # 7.
                state.save(out, step, models, algorithm.state_dict(), d)
            if stop:
                break
    logger.close()
    write_final(models, inputs.tokenizer, out / "final", d)
    return out / "final"


def open_engine(config: PolicyGradientConfig, d: Dist) -> generation.LocalEngine | generation.Engine:
    """The run's sampling engine (``sampling.engine``): `rlhf.rollout.generation.open_engine`; vLLM holds its copy of
    the policy in bfloat16 under mixed precision (it never trains), else in ``model.dtype``."""
    model = config.model
    return generation.open_engine(
        config.sampling,
        model.name,
        dtype=frozen_dtype(model.dtype, bf16_enabled(model.bf16, d.device)),
        seed=config.run.seed,
        response_tokens=config.response_tokens,
    )


def load_inputs(config: PolicyGradientConfig) -> Inputs:
    """After `rlhf.trainers.supervised.start` (every input checked, the seeds set): the policy's tokenizer, the stop
    token ids, the training and held-out prompts, the reward sources and the sampling settings."""
    d = supervised.start(config)
    tokenizer = load_tokenizer(config.model.name, config.data.chat_template_kwargs)
    train_prompts, eval_prompts = prompts(config, tokenizer)
    planning.check(config, d, planning.prompt_positions(config, train_prompts + eval_prompts))  # before any weights
    sampling = SamplingParams.of(config.sampling)
    stops = stop_token_ids(tokenizer, config.sampling.stop)
    episodes = episode_runner(config, tokenizer=tokenizer, stops=stops)  # its files fail before reward models load
    rewards = scoring.load_rewards(config.reward.source, tokenizer, d, bf16_enabled(config.model.bf16, d.device))
    if episodes is not None:
        check_episode_rewards(config, rewards, d)
    return Inputs(d, tokenizer, stops, train_prompts, eval_prompts, rewards, sampling, episodes)


def check_episode_rewards(config: PolicyGradientConfig, rewards: RewardSet, d: Dist) -> None:
    """A reward model with another tokenizer than the policy's cannot score episodes: it would score re-encoded
    text, and an episode's text is not one answer. An environment whose rewards no source reads is said once."""
    unread = not any(isinstance(source, EnvironmentReward) for source in rewards.sources)
    if config.rollout.environment is not None and unread and d.is_main:
        print(
            f"note: reward.source does not list 'environment', so the rewards {config.rollout.environment} gives "
            "(step, get_reward) are not used",
            file=sys.stderr,
        )
    for source in rewards.sources:
        if isinstance(source, RewardModelReward) and not source.shares_policy_tokenizer:
            raise ConfigError(
                f"reward model {source.name!r} has another tokenizer than the policy; multi-turn episodes are "
                "scored on the policy's token ids, so a reward model must share the policy's tokenizer"
            )


def episode_runner(config: PolicyGradientConfig, *, tokenizer: Any, stops: list[int]) -> EpisodeRunner | None:
    """The multi-turn runner ``rollout`` describes (environment, tools, limits), None for single responses."""
    rollout = config.rollout
    if not rollout.multi_turn:
        return None
    limits = EpisodeLimits(
        max_turns=rollout.max_turns,
        max_tokens=config.response_tokens,
        max_tool_calls=rollout.max_tool_calls,
        tool_timeout=rollout.tool_timeout,
        max_opening_tokens=config.sampling.max_prompt_length,
    )
    factory = load_environment(rollout.environment) if rollout.environment is not None else None
    tools = [Tool.load(spec) for spec in rollout.tools]
    name = rollout.environment or "environment"
    return EpisodeRunner(tokenizer, stops, factory=factory, tools=tools, limits=limits, name=name)


def make_trainer_state(config: PolicyGradientConfig, steps_done: int, stream: PromptStream) -> Any:
    """What reward functions get as ``trainer_state`` (`rlhf.rollout.scoring.make_trainer_state`; for users: the
    README's "Reward sources"); ``train_batch_size`` counts completions, ``epoch`` is fractional."""
    run, epochs = config.run, math.ceil(config.steps * stream.batch_size / len(stream.prompts))
    return scoring.make_trainer_state(
        epoch=stream.epoch + stream.index / len(stream.prompts),
        global_step=steps_done,
        max_steps=config.steps,
        logging_steps=run.log_every,
        eval_steps=run.eval_every,
        save_steps=run.save_every,
        train_batch_size=config.num_sequences,
        num_train_epochs=epochs,
    )


def prompts(config: PolicyGradientConfig, tokenizer: Any) -> tuple[list, list]:
    """Training prompts, and held-out ones: ``data.eval``, else a small deterministic slice of ``data.train``."""
    train = load_prompts(config.data.train, tokenizer, config.sampling.max_prompt_length)
    if config.data.eval:
        return train, load_prompts(config.data.eval, tokenizer, config.sampling.max_prompt_length)[:MAX_HELD_OUT]
    return held_out(train, min(MAX_HELD_OUT, len(train) // 10), seed=config.run.seed)


def sample_and_score(
    config: PolicyGradientConfig,
    inputs: Inputs,
    models: Models,
    batch: PromptBatch,
    generator: torch.Generator,
    trainer_state: Any,
    *,
    repeat: int = 1,
    max_rows: int | None = None,
) -> Sampled:
    """Answer ``batch`` with the policy through ``models.engine`` (``repeat`` answers per prompt, consecutive rows; at most ``max_rows`` in
    one forward) and score the answers (GDPO within each prompt's ``repeat`` rows); ``rewards``: the combined
    scores. Each rank samples and scores its share of the prompts; every rank returns the whole batch."""
    d = inputs.d
    sample = (
        generation.generate
        if inputs.episodes is None
        else functools.partial(generation.generate_episodes, inputs.episodes)
    )
    generated = sample(
        models.policy,
        inputs.tokenizer,
        batch,
        inputs.sampling,
        inputs.stops,
        generator,
        d.device,
        repeat=repeat,
        d=d,
        max_rows=max_rows,
        engine=models.engine,
    )
    prompts = generation.repeat_each(batch.texts, repeat)
    columns = {name: generation.repeat_each(values, repeat) for name, values in batch.columns.items()}
    context = scoring.reward_context(batch, generated, repeat=repeat, trainer_state=trainer_state)
    scores = scoring.score(
        inputs.rewards,
        prompts,
        generated.completions,
        columns,
        config.reward.aggregation,
        group_size=repeat,
        token_ids=generated.token_ids,
        context=context,
        d=d,
    )
    return Sampled(generated, scores, scores.combined, prompts)


def micro_plan(config: PolicyGradientConfig, mask: torch.Tensor, T: int) -> Callable[[torch.Tensor], list]:
    """``rows → micro-batches`` under ``batch.micro_size`` and ``batch.micro_tokens``, padding cut: the same plan
    for the rollout's passes and every update, so the first update's ratio is exactly 1 (checklist item 34)."""
    size, budget = config.effective_micro_batch_size, config.batch.micro_tokens
    return lambda rows: update.plan_micro_batches(rows, mask, T, size, budget)


def first_pass(
    config: PolicyGradientConfig, generated: generation.Generated, unit: int, d: Dist
) -> Iterator[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], int, bool]]:
    """(rows, (ids, mask), T', real) of this rank's micro-batches of the first pass of :func:`update_passes`, ids and
    mask cut to their columns: the rollout's no-grad passes run exactly these forwards. Under FSDP (every forward a
    collective) filler passes (``real`` False: drop the output) even out the count."""
    ids, mask = generated.query_responses, generated.attention_mask
    (B, L), T = ids.shape, generated.responses.shape[1]
    plan = micro_plan(config, mask, T)
    micro_batches = []
    for minibatch in torch.arange(B).split(config.minibatch_size):
        micro_batches += update.own_micro_batches(minibatch, unit, plan, d)
    passes = ((micro, True, None) for micro in micro_batches)
    if d.sharded:
        passes = update.evenly(micro_batches, lambda: plan(update.own_row(B, unit, d))[0], d)
    for micro, real, _ in passes:
        cols = micro.columns(L - T)
        yield micro.rows, (ids[micro.rows, cols], mask[micro.rows, cols]), micro.response_length, real


def response_logprobs(
    generated: generation.Generated, *logprobs: torch.Tensor | None
) -> tuple[ResponseMasks, list[torch.Tensor | None]]:
    """The responses' masks, and each of ``logprobs`` (B, T) with INVALID_LOGPROB at padding (the columns a
    micro-batch cut too), on both sides of every ratio and KL: KL = 0 and ratio = 1 there (checklist item 13)."""
    masks = response_masks(generated.responses, pad_token_id=generated.pad_token_id)
    return masks, [None if x is None else x.masked_fill(masks.padding_mask, INVALID_LOGPROB) for x in logprobs]


def missing_eos_penalized(config: PolicyGradientConfig, scores: torch.Tensor, has_stop: torch.Tensor) -> torch.Tensor:
    """``scores`` (B,) with ``reward.missing_eos_penalty`` applied to the responses that did not stop (when set)."""
    reward = config.reward
    if reward.missing_eos_penalty is None:
        return scores
    return penalize_missing_eos(scores, has_stop, reward.missing_eos_mode, reward.missing_eos_penalty)


def kl_stats(
    logprobs: torch.Tensor, ref: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, scored: torch.Tensor
) -> dict[str, float]:
    """``kl/mean``: per-sequence Σ (log π − log π_ref) over ``mask``, averaged over the scored sequences (the name
    users know it by; NaN when none was); ``kl/estimator_mean``: the same of the estimator's per-token ``kl``."""
    return {
        "kl/mean": masked_sum(logprobs - ref, mask, dim=-1)[scored].mean().item(),
        "kl/estimator_mean": masked_sum(kl, mask, dim=-1)[scored].mean().item(),
    }


MISMATCH_THRESHOLD = 0.5
"""``rollout/logprob_diff_frac``: the share of tokens whose |log π_trainer − log π_sampler| exceeds this (a
probability off by a factor e^0.5 ≈ 1.65)."""


def mismatch_stats(trainer: torch.Tensor, sampler: torch.Tensor | None, mask: torch.Tensor) -> dict[str, float]:
    """``rollout/logprob_diff_mean``, ``_max`` and ``_frac`` of the trainer's log-probs of the sampled tokens against
    the engine's, over ``mask`` (`rlhf.core.mismatch.logprob_mismatch`); none when the engine's are unknown."""
    if sampler is None:
        return {}
    mean, largest, above = logprob_mismatch(trainer.detach(), sampler, mask, MISMATCH_THRESHOLD)
    return {
        "rollout/logprob_diff_mean": mean.item(),
        "rollout/logprob_diff_max": largest.item(),
        "rollout/logprob_diff_frac": above.item(),
    }


def is_weights(
    config: PolicyGradientConfig, old: torch.Tensor, sampler: torch.Tensor | None, mask: torch.Tensor
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The truncated importance weights π_old/π_sampler of ``sampling.is_correction`` for the policy loss
    (`rlhf.core.mismatch.importance_weights`), with ``rollout/is_weight_mean`` and ``rollout/is_capped_frac`` over
    ``mask`` (token means: callers scale them by their share); None with ``none``."""
    s = config.sampling
    if s.is_correction == "none":
        return None, {}
    if sampler is None:
        raise RuntimeError("sampling.is_correction needs the engine's log-probs of the rollout, and it has none")
    weights = importance_weights(old, sampler, mask, level=s.is_correction, cap=s.is_cap, mode=s.is_mode)
    capped = weights >= s.is_cap if s.is_mode == "truncate" else weights == 0
    stats = {
        "rollout/is_weight_mean": masked_mean(weights, mask),
        "rollout/is_capped_frac": masked_mean(capped.float(), mask),
    }
    return weights, {key: value.item() for key, value in stats.items()}


def objective_options(config: PolicyGradientConfig) -> dict[str, Any]:
    """The policy objective's settings for `rlhf.core.losses.clipped_policy_loss` (clip, CISPO, SAPO or VESPO; token or
    sequence ratios; ``delta`` as the clip's dual cap; the KL term weighted by the ratio or not)."""
    section = config.algorithm
    return {
        "clip_low": section.clip_range,
        "clip_high": config.clip_range_upper,
        "dual_clip": section.delta,
        "objective": config.policy_objective,
        "importance_level": section.importance_sampling_level,
        "sapo_temperatures": (section.sapo_temperature_pos, section.sapo_temperature_neg),
        "vespo_kernels": (
            (section.vespo_k_pos, section.vespo_lambda_pos),
            (section.vespo_k_neg, section.vespo_lambda_neg),
        ),
        "kl_bias_correction": section.use_bias_correction_kl,
    }


SETTING_STATS = {"clip_ratio/dual": "clip_ratio/dual", "vespo_phi_mean": "policy/vespo_phi_mean", "kl": "kl/loss_mean"}
"""The policy loss's stats that only some settings give (``delta``, ``loss_type: vespo``, the KL in the loss), by the
name they are logged under."""


def setting_stats(pg_stats: dict[str, torch.Tensor], share: float) -> dict[str, float]:
    """Those of :data:`SETTING_STATS` that `rlhf.core.losses.clipped_policy_loss` gave, times ``share`` (this
    micro-batch's share of the minibatch's tokens: the update sums them into the minibatch's means)."""
    return {key: pg_stats[name].item() * share for name, key in SETTING_STATS.items() if name in pg_stats}


def entropy_keep(config: PolicyGradientConfig, entropy: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor | None:
    """The tokens the policy loss trains on under ``top_entropy_quantile`` (`rlhf.core.losses.top_entropy_mask`):
    chosen once per rollout from the sampling policy's entropies over the whole batch (every rank's rows), so
    neither the micro-batching nor the number of ranks changes them; None when every token trains."""
    quantile = config.algorithm.top_entropy_quantile
    if quantile >= 1.0:
        return None
    if entropy is None:
        raise RuntimeError("top_entropy_quantile needs the rollout's entropies, and the no-grad pass gave none")
    return top_entropy_mask(entropy, mask, quantile)


def surrogate_weights(
    config: PolicyGradientConfig,
    rollout: Rollout,
    micro: update.MicroBatch,
    logprobs: torch.Tensor,
    old: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """What multiplies the policy's surrogate on ``micro``'s tokens: the sampler correction (:func:`is_weights`),
    the entropy mask (``rollout.entropy_keep``) and the off-policy mask (``off_policy_mask_threshold``:
    `rlhf.core.losses.off_policy_mask`, against the sampler's log-probs when known, else ``old``), with their
    stats as token means over ``mask`` (``policy/off_policy_masked``: the share of tokens the mask left out);
    None when none applies."""
    rows, t = micro.rows, micro.response_length
    sampler = rollout.sampler_at(micro)
    weights, stats = is_weights(config, old, sampler, mask)
    keep = None if rollout.entropy_keep is None else rollout.entropy_keep[rows, :t]
    threshold = config.algorithm.off_policy_mask_threshold
    if threshold is not None:
        behaviour = sampler if sampler is not None else old
        on_policy = off_policy_mask(logprobs, behaviour, rollout.advantages[rows, :t], mask, threshold)
        stats["policy/off_policy_masked"] = masked_mean((~on_policy).float(), mask).item()
        keep = on_policy if keep is None else keep & on_policy
    if keep is None:
        return weights, stats
    keep = keep.to(logprobs.dtype)
    return (keep if weights is None else weights * keep), stats


def ratio_dev_max(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """max |π/π_old − 1| over ``mask``: exactly 0 in the first minibatch (checklist item 34)."""
    with torch.no_grad():
        return (logprobs - old_logprobs).exp().sub(1).abs().masked_fill(~mask, 0).max().item()


def update_passes(
    config: PolicyGradientConfig,
    models: Models,
    rollout: Rollout,
    state: TrainState,
    *,
    passes: int,
    unit: int,
    step: Callable[..., tuple[torch.Tensor, dict[str, float]]],
    held: Sequence[nn.Parameter] = (),
    first: ScoredTokens | None = None,
) -> dict[str, float]:
    """``passes`` passes over ``rollout`` (the first in the rollout's order, later ones shuffled) in minibatches of
    ``config.minibatch_size`` rows, one optimizer step each, in the micro-batches of :func:`micro_plan`.
    ``step(micro, minibatch)``: a micro-batch's loss and stats, normalised by the minibatch's global denominators;
    ``unit``: rows that share a rank (a GRPO group); ``held``: parameters whose gradients are dropped before each
    step (AdamW leaves them and their state alone); ``first``: the first micro-batch's forward, already run
    (`rlhf.trainers.ppo.fuses_first_update`). Returns the per-update means over all ranks, ``grad/norm``,
    ``update/changed_frac`` and ``policy/first_ratio_max_dev`` (exactly 0: the policy has not moved yet; checklist item 34)."""
    trainable, d = models.trainable, models.d
    num_rows, size = rollout.query_responses.shape[0], config.minibatch_size
    plan = micro_plan(config, rollout.attention_mask, rollout.response_length)
    totals: dict[str, float] = {}
    norms, changed, first_dev = 0.0, [], -math.inf
    for p in range(passes):
        order = torch.arange(num_rows) if p == 0 else torch.randperm(num_rows, generator=state.generators["shuffle"])
        for k, minibatch in enumerate(order.split(size)):
            state.optimizer.zero_grad(set_to_none=True)
            micro_batches = update.own_micro_batches(minibatch, unit, plan, d)
            fused = first is not None and p == k == 0
            if fused and len(micro_batches) != 1:
                raise RuntimeError(f"a fused first forward needs one micro-batch, not {len(micro_batches)}")
            micro_step = functools.partial(step, minibatch=minibatch, **({"forward": first} if fused else {}))
            stats = update.accumulate(
                trainable, micro_batches, lambda: plan(update.own_row(num_rows, unit, d))[0], micro_step
            )
            dev = stats.pop("ratio_dev_max", -math.inf)
            if p == k == 0:
                first_dev = dev
            update.merge(totals, stats)
            for param in held:
                param.grad = None
            stepped = update.optimizer_step(trainable, state.optimizer, state.scheduler, config.optim.max_grad_norm)
            norms += stepped.norm
            changed.append(stepped.changed)
    updates = passes * math.ceil(num_rows / size)
    result = {key: value / updates for key, value in update.reduce_stats(totals, d).items()}
    result["grad/norm"] = norms / updates  # the same on every rank
    result["update/changed_frac"] = sum(changed) / len(changed)  # the same on every rank
    result["policy/first_ratio_max_dev"] = update.reduce_stats({"first_max": first_dev}, d)["first_max"]
    return result


def in_warmup(step: int, steps: int, d: Dist, during: str, after: str) -> bool:
    """Whether ``step`` is one of the first ``steps`` of a warm-up; the main rank says on stderr when it starts
    (``steps 1-N {during}``) and when it is over (``step N+1: {after}``)."""
    if steps and d.is_main and step in (1, steps + 1):
        print(f"steps 1-{steps} {during}" if step == 1 else f"step {step}: {after}", file=sys.stderr)
    return step <= steps


def clipped_objective(config: PolicyGradientConfig, step: int, d: Dist = SINGLE) -> bool:
    """Whether ``step`` trains on the clipped surrogate, or on the unclipped policy-gradient loss of the warm-up
    (the first ``warmup_pg_steps`` steps)."""
    warmup = config.algorithm.warmup_pg_steps
    during = f"use the vanilla policy-gradient loss (warmup_pg_steps={warmup})"
    after = "the vanilla policy-gradient warm-up is over; the clipped objective takes over"
    return not in_warmup(step, warmup, d, during, after)


def step_metrics(step: int, sampled: Sampled, lr: float, watch: Stopwatch, stats: dict[str, float]) -> dict:
    """The training row of one step: ``step``, ``reward/*``, the step's ``stats``, ``response/*``, ``lr``,
    ``time/*`` (scoring's own seconds as ``time/score_s``) and ``throughput/tokens_per_s``."""
    metrics = {"step": step, **scoring.reward_metrics(sampled.scores), **stats}
    metrics |= generation.response_metrics(sampled.generated)
    times = watch.metrics() | {"time/score_s": sampled.scores.seconds}
    return metrics | {"lr": lr, **times, "throughput/tokens_per_s": metrics["response/tokens"] / times["time/step_s"]}


@torch.no_grad()
def evaluate(
    config: PolicyGradientConfig, inputs: Inputs, models: Models, step: int, stream: PromptStream
) -> dict[str, float]:
    """Answer the held-out prompts (same sampler, a fixed seed so steps are comparable), write them to
    ``samples/step_NNNNNN.jsonl`` (rank 0) and return ``eval/reward/*`` and ``time/eval_s``. Each rank answers and
    scores its share. Its own generator leaves training's trajectory the same with or without it."""
    t0 = time.perf_counter()
    trainer_state = make_trainer_state(config, step, stream)
    generator = torch.Generator().manual_seed(config.run.seed + 2)  # row seeds only: the same on any device
    batch = PromptBatch.of(inputs.eval_prompts, range(len(inputs.eval_prompts)))
    answered = sample_and_score(
        config, inputs, models, batch, generator, trainer_state, max_rows=config.effective_micro_batch_size
    )
    if inputs.d.is_main:
        generated = answered.generated
        out = Path(config.output_dir)
        samples.write_samples(out, step, batch.texts, generated.completions, answered.scores, generated.episodes)
    return scoring.reward_metrics(answered.scores, prefix="eval/reward") | {"time/eval_s": time.perf_counter() - t0}


def doctor_stops(config: PolicyGradientConfig, logger: MetricsLogger | NoLogger, d: Dist = SINGLE) -> bool:
    """Whether the run stops now: a finding at least as severe as ``doctor.stop_on`` started at this step. Rank 0
    watches the metrics; every rank gets its answer (a collective, so only when stop_on is set)."""
    if config.doctor.stop_on == "never" or not config.doctor.alarms:
        return False
    event = d.broadcast(logger.health.stop if logger.health is not None else None)
    if event is not None and d.is_main:
        print(
            f"doctor: stopping at step {event.step} (doctor.stop_on: {config.doctor.stop_on}) on {event.rule.name}; "
            f"a checkpoint is saved and final/ holds this step's policy. To go on: --run.resume "
            f"--doctor.stop_on never",
            file=sys.stderr,
        )
    return event is not None


def write_final(models: Models, tokenizer: Any, final: Path, d: Dist) -> None:
    """``final/``: a plain ``save_pretrained`` policy (LoRA merged in) + tokenizer, and PPO's value function beside it
    (``value_head.safetensors``, or the separate critic under ``critic/``). Every rank calls it (sharded weights
    are gathered by all); rank 0 alone writes, through a staging directory (a crash keeps the previous final/)."""
    from safetensors.torch import save_file

    # plain modules: themselves, or when sharded, full copies on rank 0 (None elsewhere)
    policy = unsharded(models.policy, lambda: load_policy(models.model, SINGLE, reference=False)[0], d)
    value = models.value_module()
    value = unsharded(value, models.value.load, d) if value is not None else None
    if policy is None or not d.is_main:
        return
    policy = policy.merge_and_unload() if hasattr(policy, "merge_and_unload") else policy
    with rundir.staged(final) as staging:
        out = staging / "final"
        policy.save_pretrained(out)
        tokenizer.save_pretrained(out)
        if isinstance(value, ValueHead):
            save_file({k: v.contiguous() for k, v in value.state_dict().items()}, out / "value_head.safetensors")
        elif value is not None:
            value.trunk.save_pretrained(out / "critic")
            save_file(dict(value.head.state_dict()), out / "critic" / "value_head.safetensors")
