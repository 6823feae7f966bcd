"""PPO for RLHF (Ziegler et al. 2019; Stiennon et al. 2020; Ouyang et al. 2022): the algorithm `PPO` inside the RL
loop of `rlhf.trainers.rl` (`rl.train` runs the iterations; this file is read top to bottom from `PPO`).

One iteration: (1) roll out the policy → (2) score the responses → (3) reference log-probs, then
old log-probs and values (a no-grad pass, or with one minibatch in one micro-batch the first update's
own forward, detached: :func:`fuses_first_update`) → (4) per-token KL-shaped rewards → (5) GAE advantages and returns, whitening
→ (6) K epochs × minibatches × micro-batches of clipped policy + clipped value loss (+ entropy bonus),
gradient clipping, one optimizer step per minibatch → (7) KL controller → (8)-(9) the loop's: metrics,
held-out samples, log (the training doctor reads each row: `rlhf.runlog.health`), checkpoint.
All math is in ``rlhf.core``; each phase below is one call.

Conventions (checklist numbers from ``docs/ppo_checklist.md``):
- the score sits on the first PAD after EOS (TRL/N+, item 25) or on the EOS (``score_position: eos``);
- advantages are whitened once per rollout with Bessel's correction (TRL; N+ uses the population variance);
- the value loss and GAE use ``~padding_mask_p1``, the policy loss ``~padding_mask`` (item 24);
- epoch 0 visits the rollout in the order it was scored, in the same micro-batches, so the first
  minibatch's forward is the very computation that produced the old log-probs: the ratio is exactly 1
  (item 34). Later epochs shuffle.
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
from rlhf.core.logprobs import INVALID_LOGPROB
from rlhf.core.losses import aggregate, clipped_policy_loss, clipped_value_loss, explained_variance
from rlhf.core.masked import masked_mean, masked_sum, masked_whiten
from rlhf.core.sequences import penalize_missing_eos, response_masks, score_index
from rlhf.models.critic import load_critic
from rlhf.models.policy import ScoredTokens, ValueHead
from rlhf.models.sharding import load_sharded, shard_small
from rlhf.rollout import generation
from rlhf.rollout.rewards import RewardModelReward
from rlhf.runlog import distributed, rundir
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.runlog.train_state import TrainState
from rlhf.trainers import rl, update


@dataclass(frozen=True)
class Rollout(rl.Rollout):
    """`rl.Rollout` (old and reference log-probs always present) with the value function's side: ``values`` (B, T)
    float32, 0 beyond padding_mask_p1; ``returns`` (B, T) float32; ``policy_mask`` / ``value_mask`` (B, T) bool,
    the tokens of the policy loss (~padding_mask) and of the value loss (~padding_mask_p1), both False for
    unscored samples."""

    values: torch.Tensor
    returns: torch.Tensor
    policy_mask: torch.Tensor
    value_mask: torch.Tensor


class PPO(rl.Algorithm):
    """PPO inside the RL loop (`rlhf.trainers.rl.train`): one response per prompt, the rollout's passes and the
    clipped updates, then the KL controller; β is part of the checkpoint."""

    def __init__(self, config: PPOConfig, inputs: rl.Inputs):
        self.config, self.inputs = config, inputs
        self.models = build_models(config, inputs.rewards, inputs.d)
        self.updates_per_step = config.ppo.epochs * config.ppo.num_minibatches
        self.kl_coef = config.kl.coef

    def sample(self, stream: Any, generator: torch.Generator, trainer_state: Any) -> rl.Sampled:
        """Phases 1-2: roll out the current policy, one response per prompt, and score the finished responses."""
        return rl.sample_and_score(self.config, self.inputs, self.models.policy, next(stream), generator, trainer_state)

    def learn(self, step: int, sampled: rl.Sampled, state: Any, watch: Any) -> dict[str, float]:
        """Phases 3-6: old/ref log-probs and values, KL-shaped rewards, GAE and whitening; K epochs of clipped
        policy and value updates."""
        config, d = self.config, self.inputs.d
        with watch("logprobs"):
            rollout, stats, first = make_rollout(
                config, self.models, sampled.generated, sampled.rewards, self.kl_coef, fuses_first_update(config), d
            )
        with watch("train"):
            trained = ppo_update(
                config,
                self.models,
                rollout,
                state,
                self.kl_coef,
                first,
                clipped=rl.clipped_objective(config, step, d),
                frozen=policy_frozen(config, step, d),
            )
        return stats | trained

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


def build_models(config: PPOConfig, rewards: Any, d: Dist) -> rl.Models:
    """The policy, its reference (frozen, or moving with ``kl.reference_ema``) and the value function."""
    value = functools.partial(value_function, config, rewards, d)
    return rl.Models(config.model, d, reference=True, ema=config.kl.reference_ema, value=value)


def value_function(config: PPOConfig, rewards: Any, d: Dist, policy: nn.Module) -> rl.ValueFunction:
    """A value head on ``policy``'s trunk, or a separate critic started from the reward model (``ppo.critic``;
    ``auto``: :func:`critic_layout`, said on stderr)."""
    # The critic reads the policy's token ids: a reward model with another tokenizer cannot start it (its
    # embeddings would index other tokens, or run out of range), so it starts from the policy.
    reward_models = (s for s in rewards.sources if isinstance(s, RewardModelReward))
    rm = next((s for s in reward_models if s.shares_policy_tokenizer), None)
    layout = critic_layout(config.ppo.critic, rm is not None)
    if config.ppo.critic == "auto" and d.is_main:
        started = (
            f"started from the reward model {rm.model.name_or_path}"
            if rm is not None
            else ("no reward model reads the policy's tokens to start a separate one")
        )
        print(f"ppo: critic auto → {layout} ({started})", file=sys.stderr)
    if layout == "shared":
        return rl.ValueFunction(head=shard_small(ValueHead(policy.config.hidden_size).to(d.device), d))
    source = rm.model.name_or_path if rm is not None else config.model.name
    load = functools.partial(load_critic, source, from_reward_model=rm is not None, dtype=config.model.dtype)
    critic = load_sharded(lambda device: load(device=device), d.mesh) if d.sharded else load(device=d.device)
    return rl.ValueFunction(critic=critic, load=load)


def critic_layout(critic: str, reward_model_critic: bool) -> str:
    """``ppo.critic`` resolved: ``auto`` is a separate critic when a reward model that reads the policy's tokens
    can start it (it already knows what the score rewards: docs/ppo_study.md), else the shared head."""
    if critic != "auto":
        return critic
    return "separate" if reward_model_critic else "shared"


def policy_frozen(config: PPOConfig, step: int, d: Dist = SINGLE) -> bool:
    """Whether ``step`` is one of the critic warm-up's value-only steps (``ppo.critic_warmup_steps``): the policy's
    parameters are held."""
    warmup = config.ppo.critic_warmup_steps
    during = f"fit the value function only; the policy is held (critic_warmup_steps={warmup})"
    return rl.in_warmup(step, warmup, d, during, "the critic warm-up is over; the policy trains")


@distributed.entry
@rundir.claims_output_dir
def run(config: PPOConfig) -> Path:
    """Train ``config.model.name`` with PPO; returns the ``final/`` directory."""
    return rl.train(config, PPO)


def fuses_first_update(config: PPOConfig) -> bool:
    """Whether the first update's forward can serve as the rollout's old-log-prob and value pass.

    With one minibatch in one micro-batch, the first update runs the unchanged policy on exactly the rollout's
    rows (epoch 0 is not shuffled), so its log-probs and values *are* the old ones: taking them detached
    skips a whole no-grad forward per step and gives the same update (the first ratio is exactly 1).
    """
    one_micro_batch = config.effective_micro_batch_size >= config.batch.size and config.batch.micro_tokens is None
    return config.ppo.num_minibatches == 1 and one_micro_batch


def training_forward(
    config: PPOConfig, models: rl.Models, ids: torch.Tensor, mask: torch.Tensor, T: int
) -> ScoredTokens:
    """An update's forward: log-probs and values with gradients, and the entropy (with gradients only when it
    is in the loss)."""
    entropy_grad = config.ppo.entropy_coef != 0
    return models.trainable.forward(ids, mask, T, config.sampling.temperature, entropy=True, entropy_grad=entropy_grad)


@torch.no_grad()
def make_rollout(
    config: PPOConfig,
    models: rl.Models,
    generated: generation.Generated,
    scores: torch.Tensor,
    kl_coef: float,
    fused: bool = False,
    d: Dist = distributed.SINGLE,
) -> tuple[Rollout, dict[str, float], ScoredTokens | None]:
    """Phases 3-5: reference and old log-prob/value passes, KL-shaped rewards, GAE and whitening (all from
    rlhf.core). ``fused``: the old log-probs and values are the first update's forward (returned with its graph,
    see :func:`fuses_first_update`); it runs after the reference pass so the two never hold memory together.

    Each rank runs the passes on its rows in the micro-batches of the first update (so its first ratio is
    exactly 1); the results are summed over ranks (each row is filled by one rank, zeros elsewhere), and the
    rest runs on the whole batch on every rank, exactly as in one process.

    Phases 3-5 stay in one function because they share the rollout's masks and pass results straight on;
    every formula is a `rlhf.core` call.
    """
    ids, mask = generated.query_responses, generated.attention_mask
    (B, L), T = ids.shape, generated.responses.shape[1]
    logprobs, values, ref_logprobs = (torch.zeros(B, T, device=ids.device) for _ in range(3))
    split = rl.micro_plan(config, mask, T)
    for micro, real in update.first_pass(B, config.minibatch_size, 1, split, d):
        rows, cols, t = micro.rows, micro.columns(L - T), micro.response_length
        ref = models.reference.logprobs(ids[rows, cols], mask[rows, cols], t, config.sampling.temperature)
        old = None if fused else models.old_scores(ids[rows, cols], mask[rows, cols], t, config.sampling.temperature)
        if real:
            ref_logprobs[rows, :t] = ref
            if old is not None:
                logprobs[rows, :t], values[rows, :t] = old.logprobs, old.values
    first = None
    if fused:  # the first update's forward over this rank's rows of the rollout, graph kept
        own = torch.tensor(d.shard(B))
        with torch.enable_grad():
            first = training_forward(config, models, ids[own], mask[own], T)
        logprobs[own], values[own] = first.logprobs.detach(), first.values.detach()
    logprobs, values, ref_logprobs = d.sum(logprobs), d.sum(values), d.sum(ref_logprobs)
    masks = response_masks(generated.responses, pad_token_id=generated.pad_token_id)
    scored = ~scores.isnan()
    policy_mask = ~masks.padding_mask & scored[:, None]
    value_mask = ~masks.padding_mask_p1 & scored[:, None]
    # INVALID_LOGPROB on both sides at padding: KL = 0 and ratio = 1 there (checklist item 13); the columns a
    # micro-batch cut are padding of all its rows, filled here too
    logprobs = logprobs.masked_fill(masks.padding_mask, INVALID_LOGPROB)
    ref_logprobs = ref_logprobs.masked_fill(masks.padding_mask, INVALID_LOGPROB)
    values = values.masked_fill(masks.padding_mask_p1, 0.0)

    score = torch.nan_to_num(scores.to(logprobs.device), nan=0.0)
    if config.reward.missing_eos_penalty is not None:
        reward = config.reward
        score = penalize_missing_eos(score, generated.has_stop, reward.missing_eos_mode, reward.missing_eos_penalty)
    kl = kl_estimate(logprobs, ref_logprobs, config.kl.estimator)
    beta = kl_coef if config.kl.add_to == "reward" else 0.0
    index = score_index(masks.sequence_lengths, T, config.ppo.score_position)
    rewards, non_score = kl_shaped_rewards(score * scored, kl, beta, index, policy_mask)
    if config.ppo.whiten_rewards:
        rewards = masked_whiten(rewards, value_mask, shift_mean=False).masked_fill(~value_mask, 0.0)
    gae_mask = value_mask if config.ppo.score_position == "after_eos" else policy_mask
    advantages, returns = gae(rewards, values, gae_mask, config.ppo.gamma, config.ppo.lam)
    if config.ppo.whiten_advantages:
        advantages = whiten_advantages(advantages, policy_mask, unbiased=True)
    # kl/mean: per-sequence Σ (log π − log π_ref), averaged over scored sequences (the name users know it by)
    seq_kl = masked_sum(logprobs - ref_logprobs, policy_mask, dim=-1)[scored]
    stats = {
        "kl/mean": seq_kl.mean().item() if len(seq_kl) else math.nan,
        "kl/estimator_mean": masked_sum(kl, policy_mask, dim=-1)[scored].mean().item(),
        "reward/non_score_mean": non_score.sum(-1)[scored].mean().item(),
        "reward/score_mean": score[scored].mean().item(),
        "advantages/abs_mean": masked_mean(advantages.abs(), policy_mask).item(),
        "value/mean": masked_mean(values, value_mask).item(),
        "returns/mean": masked_mean(returns, value_mask).item(),
    }
    rollout = Rollout(
        ids,
        mask,
        logprobs,
        ref_logprobs,
        advantages,
        values=values,
        returns=returns,
        policy_mask=policy_mask,
        value_mask=value_mask,
    )
    return rollout, stats, first


def ppo_update(
    config: PPOConfig,
    models: rl.Models,
    rollout: Rollout,
    state: TrainState,
    kl_coef: float,
    first: ScoredTokens | None = None,
    clipped: bool = True,
    frozen: bool = False,
) -> dict[str, float]:
    """Phase 6: ``ppo_epochs`` passes; each shuffled into minibatches (one optimizer step each), each split into
    micro-batches whose losses are reduced with the minibatch's global token counts, so accumulation (and the
    ranks) give exactly the gradient of the whole minibatch (`rlhf.trainers.update`). ``kl_coef`` is the current
    β (used by ``kl_in: loss``; the adaptive controller changes it between iterations). ``first``: the forward
    of the first update, already run by the rollout (:func:`fuses_first_update`). ``clipped`` False: the
    unclipped policy-gradient loss of the warm-up (``ppo.warmup_pg_steps``); the value loss stays clipped.
    ``frozen``: a critic warm-up step (``ppo.critic_warmup_steps``): the loss is the value loss alone and the
    policy's parameters are held (their gradients, which a shared trunk still gets from the value loss, are
    dropped before each optimizer step)."""

    def step(
        micro: update.MicroBatch, minibatch: torch.Tensor, forward: ScoredTokens | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        n_policy = rollout.policy_mask[minibatch].sum().clamp(min=1)
        n_value = rollout.value_mask[minibatch].sum().clamp(min=1)
        return micro_step(
            config,
            models,
            rollout,
            micro,
            n_policy=n_policy,
            n_value=n_value,
            kl_coef=kl_coef,
            forward=forward,
            clipped=clipped,
            frozen=frozen,
        )

    held = [p for p in models.policy.parameters() if p.requires_grad] if frozen else []
    result = rl.update_passes(
        config, models, rollout, state, passes=config.ppo.epochs, unit=1, step=step, held=held, first=first
    )
    result["policy/clipped"] = float(clipped)
    result["policy/frozen"] = float(frozen)
    result["value/explained_variance"] = explained_variance(rollout.values, rollout.returns, rollout.value_mask).item()
    return result


def micro_step(
    config: PPOConfig,
    models: rl.Models,
    rollout: Rollout,
    micro: update.MicroBatch,
    *,
    n_policy: torch.Tensor,
    n_value: torch.Tensor,
    kl_coef: float,
    forward: ScoredTokens | None = None,
    clipped: bool = True,
    frozen: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Forward (unless given) of one micro-batch: its loss and its token-weighted share of the minibatch stats.
    Only the micro-batch's own columns run; the cut ones are padding, outside every mask. ``frozen`` (critic
    warm-up): the loss is the value loss alone, and the policy's loss statistics are left out (the policy is
    held, so they would only say that it did not move)."""
    rows, t = micro.rows, micro.response_length
    cols = micro.columns(rollout.query_responses.shape[1] - rollout.response_length)
    ids, mask = rollout.query_responses[rows, cols], rollout.attention_mask[rows, cols]
    policy_mask, value_mask = rollout.policy_mask[rows, :t], rollout.value_mask[rows, :t]
    if forward is None:
        forward = training_forward(config, models, ids, mask, t)
    elif forward.logprobs.shape != policy_mask.shape:
        shapes = f"{tuple(forward.logprobs.shape)}, not {tuple(policy_mask.shape)}"
        raise RuntimeError(f"the fused first forward covers {shapes}")
    logprobs, values, entropy = forward
    ref = rollout.ref_logprobs[rows, :t] if config.kl.add_to == "loss" else None
    pg, pg_stats = clipped_policy_loss(
        logprobs,
        rollout.logprobs[rows, :t],
        rollout.advantages[rows, :t],
        policy_mask,
        clip_low=config.ppo.clip_range,
        clip_high=config.clip_range_upper,
        ref_logp=ref,
        kl_coef=kl_coef,
        clipped=clipped,
    )
    vf, vf_stats = clipped_value_loss(
        values, rollout.values[rows, :t], rollout.returns[rows, :t], value_mask, clip=config.ppo.value_clip_range
    )
    policy_loss = aggregate(pg, policy_mask, "token-mean", num_tokens=n_policy)
    value_loss = aggregate(vf, value_mask, "token-mean", num_tokens=n_value)
    entropy_mean = aggregate(entropy, policy_mask, "token-mean", num_tokens=n_policy)
    share_p = (policy_mask.sum() / n_policy).item()  # this micro-batch's share of the minibatch's tokens
    share_v = (value_mask.sum() / n_value).item()
    with torch.no_grad():
        ratio_dev = (logprobs - rollout.logprobs[rows, :t]).exp().sub(1).abs().masked_fill(~policy_mask, 0).max()
    stats = {
        "value/loss": value_loss.item(),
        "policy/entropy": entropy_mean.item(),
        "value/clipfrac": vf_stats["clipfrac"].item() * share_v,
        "ratio_dev_max": ratio_dev.item(),
    }
    if frozen:
        return config.ppo.vf_coef * value_loss, stats
    loss = policy_loss + config.ppo.vf_coef * value_loss - config.ppo.entropy_coef * entropy_mean
    return loss, stats | {
        "policy/loss": policy_loss.item(),
        "policy/clipfrac": pg_stats["clipfrac"].item() * share_p,
        "policy/approx_kl": pg_stats["approx_kl"].item() * share_p,
    }
