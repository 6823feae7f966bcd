"""What an RL run sets up before its models: the checked inputs, the prompts, the reward sources, the episode
runner, and what reward functions see as ``trainer_state``."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

from rlhf import planning
from rlhf.config import ConfigError, PolicyGradientConfig
from rlhf.data import held_out, load_prompts
from rlhf.data.stream import PromptStream
from rlhf.data.tokenization import stop_token_ids
from rlhf.models.loading import load_tokenizer
from rlhf.models.precision import bf16_enabled
from rlhf.rollout import scoring
from rlhf.rollout.engine import SamplingParams
from rlhf.rollout.episodes import EpisodeLimits, EpisodeRunner, load_environment
from rlhf.rollout.rewards import EnvironmentReward, RewardSet, reward_models
from rlhf.rollout.tools import Tool
from rlhf.runlog.distributed import Dist
from rlhf.trainers import supervised

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


def load_inputs(config: PolicyGradientConfig, worker: Dist | None = None) -> Inputs:
    """After `rlhf.trainers.supervised.start` (every input checked, the seeds set): the policy's tokenizer, the stop
    token ids, the training and held-out prompts, the reward sources and the sampling settings. A sampling worker
    (`rlhf.trainers.rl.producer`) gives its own ``worker`` Dist, and plans nothing: the trainer's plan counts it."""
    d = supervised.start(config)
    tokenizer = load_tokenizer(config.model.name, config.data.chat_template_kwargs)
    train_prompts, eval_prompts = run_prompts(config, tokenizer)
    if worker is None:
        planning.check(config, d, planning.prompt_positions(train_prompts + eval_prompts, config.response_tokens))
    d = worker or d
    sampling = SamplingParams.of(config.sampling)
    stops = stop_token_ids(tokenizer, config.sampling.stop)
    episodes = episode_runner(config, tokenizer=tokenizer, stops=stops)  # its files fail before reward models load
    rewards = scoring.load_rewards(config.reward, tokenizer, d, bf16_enabled(config.model.bf16, d.device))
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
    for model in (model for source in rewards.sources for model in reward_models(source)):
        if not model.shares_policy_tokenizer:
            raise ConfigError(
                f"reward model {model.name!r} has another tokenizer than the policy; multi-turn episodes are "
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


def run_prompts(config: PolicyGradientConfig, tokenizer: Any) -> tuple[list, list]:
    """Training prompts, and held-out ones: ``data.eval``, else a small deterministic slice of ``data.train``."""
    training = load_prompts(config.data.train, tokenizer, config.sampling.max_prompt_length)
    if config.data.eval:
        return training, load_prompts(config.data.eval, tokenizer, config.sampling.max_prompt_length)[:MAX_HELD_OUT]
    return held_out(training, min(MAX_HELD_OUT, len(training) // 10), seed=config.run.seed)
