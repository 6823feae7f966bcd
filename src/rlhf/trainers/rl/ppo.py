"""PPO for RLHF (Ziegler et al. 2019; Stiennon et al. 2020; Ouyang et al. 2022): the algorithm `PPO` inside the RL
loop of `rlhf.trainers.rl` (`train` runs the iterations; this file is read top to bottom from `PPO`).

One iteration, phase by phase with the functions that run it: docs/architecture.md, "One PPO step" (1-2
`PPO.draw`, 3-6 `PPO.learn`, 7 `PPO.after_step`). All math is in ``rlhf.core``; each phase below is one call.

Conventions (checklist numbers from ``docs/ppo_checklist.md``):
- the score sits on the first PAD after EOS (TRL/N+, item 25) or on the EOS (``score_position: eos``);
- advantages are whitened once per rollout with Bessel's correction (TRL; N+ uses the population variance);
- the value loss and GAE use ``~padding_mask_p1``, the policy loss ``~padding_mask`` (item 24);
- epoch 0 keeps the rollout's order and micro-batches, so the first minibatch's forward is the very computation
  that produced the old log-probs: the ratio is exactly 1 (item 34).
Deviations from the references: responses stop at EOS during sampling (TRL), not at a fixed length (OAI/N+);
a sample no reward source could score (``None``) is left out of the update, not given a made-up score.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf.config import PPOConfig
from rlhf.core.advantages import gae, whiten_advantages
from rlhf.core.kl import kl_estimate, kl_shaped_rewards, update_kl_coef
from rlhf.core.losses import aggregate, clipped_value_loss, explained_variance
from rlhf.core.masked import masked_mean, masked_whiten
from rlhf.core.sequences import score_index
from rlhf.data.stream import PromptStream
from rlhf.models.critic import critic_layout, load_critic
from rlhf.models.policy import ScoredTokens, ValueHead
from rlhf.models.precision import bf16_enabled
from rlhf.models.sharding import load_sharded, shard_small
from rlhf.rollout import generation
from rlhf.rollout.rewards import RewardSet, reward_models
from rlhf.runlog import distributed, rundir
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.runlog.metrics import Stopwatch
from rlhf.runlog.train_state import TrainState
from rlhf.trainers import update
from rlhf.trainers.rl import updates
from rlhf.trainers.rl.inputs import Inputs
from rlhf.trainers.rl.loop import Algorithm, train
from rlhf.trainers.rl.models import Models, ValueFunction
from rlhf.trainers.rl.rollout import (
    Rollout,
    Sampled,
    missing_eos_penalized,
    no_grad_pass,
    pass_stats,
    sample_and_score,
    top_entropy_tokens,
)


@dataclass(frozen=True)
class PPORollout(Rollout):
    """`Rollout` (old and reference log-probs always present) with the value function's side: ``values``,
    ``returns`` (B, T) float32 (values 0 beyond padding_mask_p1); ``policy_mask`` / ``value_mask`` (B, T) bool, the
    tokens of the policy loss (~padding_mask) and of the value loss (~padding_mask_p1), False for unscored rows."""

    values: torch.Tensor
    returns: torch.Tensor
    policy_mask: torch.Tensor
    value_mask: torch.Tensor


class PPO(Algorithm):
    """PPO inside the RL loop (`rlhf.trainers.train`): one response per prompt, the rollout's passes and the
    clipped updates, then the KL controller; β is part of the checkpoint."""

    def __init__(self, config: PPOConfig, inputs: Inputs):
        self.config, self.inputs = config, inputs
        self.models = build_models(config, inputs.rewards, inputs.d)
        self.updates_per_step = config.ppo.epochs * config.ppo.num_minibatches
        self.kl_coef = config.kl.coef

    @staticmethod
    def draw(
        config: PPOConfig,
        inputs: Inputs,
        models: Models,
        stream: PromptStream,
        generator: torch.Generator,
        trainer_state: Any,
    ) -> Sampled:
        """Phases 1-2: roll out the policy, one response per prompt, and score the finished responses."""
        return sample_and_score(config, inputs, models, next(stream), generator, trainer_state)

    def learn(self, step: int, sampled: Sampled, state: TrainState, watch: Stopwatch) -> dict[str, float]:
        """Phases 3-6: old/ref log-probs and values, KL-shaped rewards, GAE and whitening; K epochs of clipped
        policy and value updates."""
        config, d, fused = self.config, self.inputs.d, fuses_first_update(self.config)
        with watch("logprobs"):
            rollout, stats, first = make_rollout(
                config, self.models, sampled.generated, sampled.rewards, self.kl_coef, fused, d
            )
        with watch("train"):
            clipped, frozen = updates.clipped_objective(config, step, d), policy_frozen(config, step, d)
            return stats | ppo_update(config, self.models, rollout, state, self.kl_coef, first, clipped, frozen)

    def after_step(self, stats: dict[str, float]) -> dict[str, float]:
        """Phase 7: adapt β to the KL of this rollout (before the update), once per iteration."""
        if math.isfinite(stats.get("kl/mean", math.nan)):  # NaN or absent when nothing was scored: keep β
            kl = self.config.kl
            self.kl_coef = update_kl_coef(
                kl.control, self.kl_coef, stats["kl/mean"], kl.target, kl.horizon, self.config.batch.size
            )
        return {"kl/coef": self.kl_coef}

    def state_dict(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_coef}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.kl_coef = saved.get("kl_coef", self.kl_coef)


def build_models(config: PPOConfig, rewards: RewardSet, d: Dist) -> Models:
    """The policy, its reference and the value function."""
    return Models(config, d, value=functools.partial(value_function, config, rewards, d))


def value_function(config: PPOConfig, rewards: RewardSet, d: Dist, policy: nn.Module) -> ValueFunction:
    """A value head on ``policy``'s trunk, or a separate critic started from the reward model (``ppo.critic``;
    ``auto``: `rlhf.models.critic.critic_layout`, said on stderr)."""
    # The critic reads the policy's token ids: a reward model with another tokenizer cannot start it (its
    # embeddings would index other tokens, or run out of range), so it starts from the policy.
    readers = (model for source in rewards.sources for model in reward_models(source) if model.shares_policy_tokenizer)
    rm = next(readers, None)  # an ensemble's: its first member
    layout = critic_layout(config.ppo.critic, rm is not None)
    if config.ppo.critic == "auto" and d.is_main:
        started = (
            f"started from the reward model {rm.model.name_or_path}"
            if rm is not None
            else "no reward model reads the policy's tokens to start a separate one"
        )
        print(f"ppo: critic auto → {layout} ({started})", file=sys.stderr)
    if layout == "shared":
        hidden = policy.config.hidden_size
        return ValueFunction(head=shard_small(ValueHead(hidden).to(d.device), d), load=lambda: ValueHead(hidden))
    source = rm.model.name_or_path if rm is not None else config.model.name
    load = functools.partial(
        load_critic,
        source,
        from_reward_model=rm is not None,
        dtype=config.model.dtype,
        checkpointing=config.model.gradient_checkpointing,
        bf16_on=d.device if bf16_enabled(config.model.bf16, d.device) else None,
    )
    critic = load_sharded(lambda device: load(device=device), d.mesh) if d.sharded else load(device=d.device)
    return ValueFunction(critic=critic, load=load)


def policy_frozen(config: PPOConfig, step: int, d: Dist = SINGLE) -> bool:
    """Whether ``step`` is one of the critic warm-up's value-only steps (``ppo.critic_warmup_steps``): the policy's
    parameters are held."""
    warmup = config.ppo.critic_warmup_steps
    during = f"fit the value function only; the policy is held (critic_warmup_steps={warmup})"
    return updates.in_warmup(step, warmup, d, during, "the critic warm-up is over; the policy trains")


@distributed.entry
@rundir.claims_output_dir
def run(config: PPOConfig) -> Path:
    """Train ``config.model.name`` with PPO; returns the ``final/`` directory."""
    return train(config, PPO)


def fuses_first_update(config: PPOConfig) -> bool:
    """Whether the first update's forward can serve as the rollout's old-log-prob and value pass: with one minibatch
    in one micro-batch, it runs the unchanged policy on exactly the rollout's rows, so its log-probs and values
    *are* the old ones; taken detached, they save a whole no-grad forward per step for the same update."""
    one_micro_batch = config.effective_micro_batch_size >= config.batch.size and config.batch.micro_tokens is None
    return config.ppo.num_minibatches == 1 and one_micro_batch


def training_forward(config: PPOConfig, models: Models, ids: torch.Tensor, mask: torch.Tensor, T: int) -> ScoredTokens:
    """An update's forward: log-probs and values with gradients, and the entropy (with gradients only when it
    is in the loss)."""
    entropy_grad = config.ppo.entropy_coef != 0
    return models.trainable.forward(ids, mask, T, config.sampling.temperature, entropy=True, entropy_grad=entropy_grad)


@torch.no_grad()
def make_rollout(
    config: PPOConfig,
    models: Models,
    generated: generation.Generated,
    scores: torch.Tensor,
    kl_coef: float,
    fused: bool = False,
    d: Dist = SINGLE,
) -> tuple[PPORollout, dict[str, float], ScoredTokens | None]:
    """Phases 3-5: reference and old log-prob/value passes (`rollout.no_grad_pass`; ``fused``: the old log-probs and
    values are the first update's forward, returned with its graph: :func:`fuses_first_update`), KL-shaped rewards,
    GAE and whitening (one function: they share the rollout's masks), on the whole batch."""
    T = generated.responses.shape[1]

    def own_rows_forward(rows: torch.Tensor) -> ScoredTokens:  # the first update's forward over this rank's rows
        return training_forward(config, models, generated.query_responses[rows], generated.attention_mask[rows], T)

    passed = no_grad_pass(config, models, generated, unit=1, d=d, fused=own_rows_forward if fused else None)
    masks, logprobs, ref_logprobs = passed.masks, passed.logprobs, passed.ref_logprobs
    values = passed.values.masked_fill(masks.padding_mask_p1, 0.0)
    scores = scores.to(generated.query_responses.device)  # the reward sources answer on the CPU
    scored = ~scores.isnan()
    env = generated.env_mask if generated.env_mask is not None else torch.zeros_like(masks.padding_mask)
    policy_mask = ~masks.padding_mask & scored[:, None] & ~env  # multi-turn: the model's own tokens only
    value_mask = ~masks.padding_mask_p1 & scored[:, None] & ~env
    score = missing_eos_penalized(config, torch.nan_to_num(scores, nan=0.0), generated.has_stop)
    kl = kl_estimate(logprobs, ref_logprobs, config.kl.estimator)
    beta = kl_coef if config.kl.add_to == "reward" else 0.0
    index = score_index(masks.sequence_lengths, T, config.ppo.score_position)
    rewards, non_score = kl_shaped_rewards(score * scored, kl, beta, index, policy_mask)
    if config.ppo.whiten_rewards:
        rewards = masked_whiten(rewards, value_mask, shift_mean=False).masked_fill(~value_mask, 0.0)
    gae_mask = value_mask if config.ppo.score_position == "after_eos" else policy_mask
    advantages, returns = gae(rewards, values, gae_mask, config.ppo.gamma, config.ppo.lam, skip=env)
    if config.ppo.whiten_advantages:
        advantages = whiten_advantages(advantages, policy_mask, unbiased=True)
    keep, keep_stats = top_entropy_tokens(config, passed.entropy, policy_mask)
    stats = {
        **pass_stats(passed, generated, kl, policy_mask, scored),
        "reward/non_score_mean": non_score.sum(-1)[scored].mean().item(),
        "reward/score_mean": score[scored].mean().item(),
        "advantages/abs_mean": masked_mean(advantages.abs(), policy_mask).item(),
        "value/mean": masked_mean(values, value_mask).item(),
        "returns/mean": masked_mean(returns, value_mask).item(),
        **keep_stats,
    }
    value_side = {"values": values, "returns": returns, "policy_mask": policy_mask, "value_mask": value_mask}
    rollout = PPORollout.of(generated, passed, advantages=advantages, entropy_keep=keep, **value_side)
    return rollout, stats, passed.first


def ppo_update(
    config: PPOConfig,
    models: Models,
    rollout: PPORollout,
    state: TrainState,
    kl_coef: float,
    first: ScoredTokens | None = None,
    clipped: bool = True,
    frozen: bool = False,
) -> dict[str, float]:
    """Phase 6: ``ppo.epochs`` passes of minibatches (`update_passes`). ``kl_coef``: the current β (for the
    KL in the loss); ``first``: the first update's forward (:func:`fuses_first_update`); ``clipped`` False:
    ``ppo.warmup_pg_steps``' unclipped policy loss; ``frozen``: a ``ppo.critic_warmup_steps`` step, the value loss
    alone, the policy's parameters held (the gradients a shared trunk gets from the value loss are dropped)."""
    step = functools.partial(micro_step, config, models, rollout, kl_coef=kl_coef, clipped=clipped, frozen=frozen)
    held = [p for p in models.policy.parameters() if p.requires_grad] if frozen else []
    result = updates.update_passes(
        config, models, rollout, state, passes=config.ppo.epochs, unit=1, step=step, held=held, first=first
    )
    result |= {"policy/clipped": float(clipped), "policy/frozen": float(frozen)}
    result["value/explained_variance"] = explained_variance(rollout.values, rollout.returns, rollout.value_mask).item()
    return result


def micro_step(
    config: PPOConfig,
    models: Models,
    rollout: PPORollout,
    micro: update.MicroBatch,
    minibatch: torch.Tensor,
    forward: ScoredTokens | None = None,
    *,
    kl_coef: float,
    clipped: bool = True,
    frozen: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Forward (unless given) of one micro-batch of ``minibatch``: its loss, reduced with the minibatch's token
    counts, and its token-weighted share of the minibatch stats. ``frozen``: the value loss alone, without the
    policy's loss stats (the policy is held: they would only say that it did not move)."""
    rows, t = micro.rows, micro.response_length
    policy_mask, value_mask = rollout.policy_mask[rows, :t], rollout.value_mask[rows, :t]
    n_policy = rollout.policy_mask[minibatch].sum().clamp(min=1)
    n_value = rollout.value_mask[minibatch].sum().clamp(min=1)
    if forward is None:
        forward = training_forward(config, models, *rollout.micro_inputs(micro), t)
    elif forward.logprobs.shape != policy_mask.shape:
        shapes = f"{tuple(forward.logprobs.shape)}, not {tuple(policy_mask.shape)}"
        raise RuntimeError(f"the fused first forward covers {shapes}")
    logprobs, values, entropy = forward
    ref = rollout.ref_logprobs[rows, :t] if config.kl.add_to == "loss" else None
    old = rollout.logprobs[rows, :t]
    pg, pg_stats, is_stats = updates.policy_loss(
        config, rollout, micro, logprobs, old, policy_mask, ref=ref, kl_coef=kl_coef, clipped=clipped
    )
    vf, vf_stats = clipped_value_loss(
        values, rollout.values[rows, :t], rollout.returns[rows, :t], value_mask, clip=config.ppo.value_clip_range
    )
    policy_loss = aggregate(pg, policy_mask, config.loss_aggregation, num_tokens=n_policy)
    value_loss = aggregate(vf, value_mask, "token-mean", num_tokens=n_value)
    entropy_mean = aggregate(entropy, policy_mask, "token-mean", num_tokens=n_policy)
    share_p = (policy_mask.sum() / n_policy).item()  # this micro-batch's share of the minibatch's tokens
    share_v = (value_mask.sum() / n_value).item()
    stats = {
        "value/loss": value_loss.item(),
        "policy/entropy": entropy_mean.item(),
        "value/clipfrac": vf_stats["clipfrac"].item() * share_v,
        "ratio_dev_max": updates.ratio_dev_max(logprobs, old, policy_mask),
    }
    if frozen:
        return config.ppo.vf_coef * value_loss, stats
    loss = policy_loss + config.ppo.vf_coef * value_loss - config.ppo.entropy_coef * entropy_mean
    return loss, stats | {
        "policy/loss": policy_loss.item(),
        "policy/clipfrac": pg_stats["clipfrac"].item() * share_p,
        "policy/approx_kl": pg_stats["approx_kl"].item() * share_p,
        **updates.setting_stats(pg_stats, share_p),
        **{key: value * share_p for key, value in is_stats.items()},
    }
