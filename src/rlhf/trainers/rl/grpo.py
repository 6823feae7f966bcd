"""The critic-free GRPO family (GRPO, Dr. GRPO, RLOO, REINFORCE++; the objectives of DAPO, GSPO, CISPO, SAPO, LUSPO and
VESPO) with DAPO's options: the algorithm `GRPO` inside the RL loop of `rlhf.trainers.rl`, read top to bottom from
`GRPO`.

One iteration: (1)-(2) G = ``group_size`` scored responses per prompt (`GRPO.draw`, with dynamic sampling
`fill_batch`) → (3)-(4) old and reference log-probs, group-relative advantages (`make_rollout`) → (5)
``num_iterations`` passes of the clipped per-token loss (`grpo_update`) → the loop's metrics, log, checkpoint.
All math is in ``rlhf.core``; each phase is one call.

Conventions (checklist numbers from ``docs/ppo_checklist.md``):
- the loss mask covers the response up to and including the first stop token (item 44); with
  ``mask_truncated_completions`` responses cut at ``max_new_tokens`` are left out of the loss (they still
  count in their group's mean and std); a sample no reward source could score (NaN) gets advantage 0 and is
  left out of the loss;
- sequence advantages are broadcast to every token (item 41); the loss is reduced by the aggregation of
  ``loss_type`` (or ``loss_aggregation``) with the minibatch's global denominators, so micro-batching does not
  change the gradient (item 43);
- iteration 0 keeps the rollout's order and micro-batches: the first minibatch's ratio is exactly 1 (item 34;
  see also `on_policy`);
- ``reward.aggregation: gdpo``: the estimator still runs on GDPO's normalised advantage, which is already
  group-centred: ``dr_grpo`` leaves it unchanged, ``rloo`` scales it by G/(G−1), ``grpo`` (group scaling) also
  divides each group by its own std. Penalties (missing EOS, overlong) are added after GDPO.
- ``kl.add_to: reward``: the per-token −β·KL joins the rewards and the token-level advantage is the reward-to-go
  (γ = 1, ``rlhf.core.advantages.gae`` with zero values and λ = 1): A_t = A_seq − β·Σ_{k≥t} KL_k. For
  ``reinforce_pp`` this is REINFORCE++ (OpenRLHF ``reinforce_baseline``): group-centred scores, KL in the
  reward, then the token-level returns whitened over the batch (population variance).
Deviations from the references: dynamic sampling gives up after ``MAX_SAMPLING_ROUNDS`` (`fill_batch`);
log-probs are recomputed by the training model at the sampling temperature, never taken from the sampler (item 47).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rlhf.config import GRPOConfig
from rlhf.core.group import dapo_overlong_penalty, groups_with_signal, token_advantages
from rlhf.core.kl import kl_estimate
from rlhf.core.losses import aggregate
from rlhf.core.masked import masked_mean
from rlhf.core.sequences import score_index
from rlhf.data.stream import PromptBatch, PromptStream
from rlhf.rollout import generation, scoring
from rlhf.runlog import distributed, rundir
from rlhf.runlog.distributed import Dist
from rlhf.runlog.metrics import Stopwatch
from rlhf.runlog.train_state import TrainState
from rlhf.trainers import update
from rlhf.trainers.rl import updates
from rlhf.trainers.rl.inputs import Inputs
from rlhf.trainers.rl.loop import Algorithm, train
from rlhf.trainers.rl.models import Models
from rlhf.trainers.rl.rollout import (
    Rollout,
    Sampled,
    mismatch_stats,
    missing_eos_penalized,
    no_grad_pass,
    pass_stats,
    sample_and_score,
    top_entropy_tokens,
)

MAX_SAMPLING_ROUNDS = 4
"""Dynamic sampling: most generation rounds (of ``batch.size`` prompts each) per iteration."""


@dataclass(frozen=True)
class GRPORollout(Rollout):
    """`Rollout` (``logprobs`` None when the update is `on_policy`, ``ref_logprobs`` None with ``kl.coef: 0``;
    ``advantages`` 0 outside ``mask``) with ``mask`` (B, T) bool, the tokens of the loss."""

    mask: torch.Tensor


class GRPO(Algorithm):
    """The GRPO family inside the RL loop (`rlhf.trainers.train`): groups of responses per prompt (with dynamic
    sampling, more rounds), then the rollout's pass and the clipped per-token updates."""

    def __init__(self, config: GRPOConfig, inputs: Inputs):
        self.config, self.inputs = config, inputs
        self.models = Models(config, inputs.d)
        self.updates_per_step = config.grpo.num_iterations * config.grpo.num_minibatches

    @staticmethod
    def draw(
        config: GRPOConfig,
        inputs: Inputs,
        models: Models,
        stream: PromptStream,
        generator: torch.Generator,
        trainer_state: Any,
    ) -> Sampled:
        """Phases 1-2: ``group_size`` responses to each of the next prompts, scored; with dynamic sampling more
        rounds until enough groups carry a signal (:func:`fill_batch`)."""
        return fill_batch(config, lambda: sample_groups(config, models, inputs, next(stream), generator, trainer_state))

    def learn(self, step: int, sampled: Sampled, state: TrainState, watch: Stopwatch) -> dict[str, float]:
        """Phases 3-5: old (and reference) log-probs, group-relative advantages; ``num_iterations`` passes ×
        minibatches of the clipped per-token loss."""
        with watch("logprobs"):
            rollout, stats = make_rollout(self.config, self.models, sampled, self.inputs.d)
        with watch("train"):
            clipped = updates.clipped_objective(self.config, step, self.inputs.d)
            return stats | grpo_update(self.config, self.models, rollout, state, clipped)


@distributed.entry
@rundir.claims_output_dir
def run(config: GRPOConfig) -> Path:
    """Train ``config.model.name`` with the GRPO family; returns the ``final/`` directory."""
    return train(config, GRPO)


def sample_groups(
    config: GRPOConfig,
    models: Models,
    inputs: Inputs,
    batch: PromptBatch,
    generator: torch.Generator,
    trainer_state: Any,
) -> Sampled:
    """Phases 1-2 for one prompt batch: G samples per prompt, scores (GDPO within each group), and as ``rewards``
    the combined score (B,) with the missing-EOS and DAPO overlong penalties (NaN stays NaN)."""
    sampled = sample_and_score(config, inputs, models, batch, generator, trainer_state, repeat=config.grpo.group_size)
    generated = sampled.generated
    rewards = missing_eos_penalized(config, sampled.scores.combined.float(), generated.has_stop.cpu())
    if config.grpo.overlong_buffer > 0:
        rewards = rewards + overlong_penalty(config, generated.responses.cpu(), generated.pad_token_id)
    return dataclasses.replace(sampled, rewards=rewards)


def overlong_penalty(config: GRPOConfig, responses: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """DAPO's soft overlong penalty (B,) of each response, by its length (``grpo.overlong_buffer``)."""
    lengths = (responses != pad_token_id).sum(-1)
    return dapo_overlong_penalty(
        lengths, config.sampling.max_new_tokens, config.grpo.overlong_buffer, config.grpo.overlong_penalty_factor
    )


def fill_batch(config: GRPOConfig, sample_round: Callable[[], Sampled]) -> Sampled:
    """One round of ``batch.size`` groups; with ``grpo.dynamic_sampling`` (DAPO, checklist item 46) more rounds, at
    most ``MAX_SAMPLING_ROUNDS``, until ``batch_size`` groups have rewards that differ; a batch still short is
    filled with zero-signal groups (advantage 0: only the KL term moves them; verl raises an error instead), with
    the sampler's stats (``reward/zero_std_groups``, ``dynamic_sampling/*``)."""
    G, N = config.grpo.group_size, config.batch.size
    rounds = [sample_round()]
    signals = [groups_with_signal(rounds[0].rewards.view(-1, G))]
    stats = {"reward/zero_std_groups": 1.0 - signals[0].float().mean().item()}
    if not config.grpo.dynamic_sampling:
        return dataclasses.replace(rounds[0], stats=stats)
    while sum(int(signal.sum()) for signal in signals) < N and len(rounds) < MAX_SAMPLING_ROUNDS:
        rounds.append(sample_round())
        signals.append(groups_with_signal(rounds[-1].rewards.view(-1, G)))
    n_kept = sum(int(signal.sum()) for signal in signals)
    pairs = list(zip(rounds, signals, strict=True))
    kept = [_select_groups(part, signal.nonzero().flatten(), G) for part, signal in pairs]
    spare = [_select_groups(part, (~signal).nonzero().flatten(), G) for part, signal in pairs]
    stats |= {
        "dynamic_sampling/rounds": len(rounds),
        "dynamic_sampling/dropped_groups": len(rounds) * N - n_kept,
        "dynamic_sampling/filled_groups": max(0, N - n_kept),
    }
    return dataclasses.replace(_select_groups(_concat(kept + spare), torch.arange(N), G), stats=stats)


@torch.no_grad()
def make_rollout(
    config: GRPOConfig, models: Models, sampled: Sampled, d: Dist = distributed.SINGLE
) -> tuple[GRPORollout, dict[str, float]]:
    """Phases 3-4: one no-grad pass for old (and reference) log-probs (`rollout.no_grad_pass`; `on_policy`: no
    policy pass, ``logprobs`` None), then the advantages on the whole batch (one function: they share the
    rollout's masks)."""
    generated = sampled.generated
    T = generated.responses.shape[1]
    unit = config.grpo.group_size  # a group's rows share a rank
    passed = no_grad_pass(config, models, generated, unit=unit, d=d, policy=not on_policy(config, models))
    masks, ref = passed.masks, passed.ref_logprobs
    rewards = sampled.rewards.to(generated.query_responses.device)
    scored = ~rewards.isnan()
    loss_mask = ~masks.padding_mask & scored[:, None]  # up to and including the stop token (checklist 44)
    if generated.env_mask is not None:  # multi-turn: the model's own tokens only
        loss_mask = loss_mask & ~generated.env_mask
    if config.grpo.mask_truncated_completions:
        loss_mask = loss_mask & generated.has_stop[:, None]
    kl = kl_estimate(passed.logprobs, ref, config.kl.estimator) if ref is not None else None
    in_reward = config.kl.add_to == "reward" and kl is not None  # else the KL goes into the loss (or nowhere)
    advantages = token_advantages(
        rewards,
        loss_mask,
        config.grpo.group_size,
        config.grpo.estimator,
        whiten=config.grpo.whiten_advantages,
        kl=kl if in_reward else None,
        kl_coef=config.kl.coef,
        score_index=score_index(masks.sequence_lengths, T, "eos"),
        **({"scale": config.reward_scaling} if config.grpo.estimator == "grpo" else {}),
    )
    keep, keep_stats = top_entropy_tokens(config, passed.entropy, loss_mask)
    stats = {
        "reward/score_mean": rewards[scored].mean().item() if scored.any() else math.nan,
        "advantages/abs_mean": masked_mean(advantages.abs(), loss_mask).item(),
        "response/masked_fraction": 1.0 - (loss_mask.any(-1) | ~scored).float().mean().item(),
        **pass_stats(passed, generated, kl, loss_mask, scored),  # else measured by the update's forward (`micro_step`)
        **keep_stats,
    }
    if config.grpo.overlong_buffer > 0:
        penalty = overlong_penalty(config, generated.responses, generated.pad_token_id)
        stats["reward/overlong_penalty_mean"] = penalty.mean().item()
    rollout = GRPORollout.of(generated, passed, advantages=advantages, entropy_keep=keep, mask=loss_mask)
    return rollout, stats


def on_policy(config: GRPOConfig, models: Models) -> bool:
    """One optimizer step per rollout and no reference: the policy has not moved when the loss is computed,
    so the old log-probs equal the training forward's own (detached) and their no-grad pass is skipped —
    one policy forward less per step, the same update (TRL's GRPO does the same). At sampling.max_staleness > 0 too:
    the proximal policy of the decoupled objective is the weights at the update's start, which that forward has, and
    the importance weight against the behaviour policy comes from the engine's log-probs. Not under
    ``top_entropy_quantile``, whose mask is chosen from that pass's entropies before any update."""
    one_update = config.grpo.num_iterations == 1 and config.grpo.num_minibatches == 1
    return one_update and models.reference is None and config.grpo.top_entropy_quantile == 1


def grpo_update(
    config: GRPOConfig, models: Models, rollout: GRPORollout, state: TrainState, clipped: bool = True
) -> dict[str, float]:
    """Phase 5: ``grpo.num_iterations`` passes of ``num_minibatches`` minibatches (`update_passes`). ``clipped``
    False: the unclipped loss of the warm-up (``grpo.warmup_pg_steps``)."""
    step = functools.partial(micro_step, config, models, rollout, clipped=clipped)
    passes, unit = config.grpo.num_iterations, config.grpo.group_size
    result = updates.update_passes(config, models, rollout, state, passes=passes, unit=unit, step=step)
    return result | {"policy/clipped": float(clipped)}


def micro_step(
    config: GRPOConfig,
    models: Models,
    rollout: GRPORollout,
    micro: update.MicroBatch,
    minibatch: torch.Tensor,
    clipped: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Forward of one micro-batch of ``minibatch``: its loss, reduced with the minibatch's denominators, and its
    share of the minibatch stats."""
    rows, t = micro.rows, micro.response_length
    loss_mask = rollout.mask[rows, :t]
    denominators = {
        "num_tokens": rollout.mask[minibatch].sum().clamp(min=1),
        "num_seqs": len(minibatch),
        "max_len": config.response_tokens,
    }
    ids, mask = rollout.micro_inputs(micro)
    logprobs, _, entropy = models.trainable.forward(
        ids, mask, t, config.sampling.temperature, entropy=True, entropy_grad=config.grpo.entropy_coef != 0
    )
    # on-policy (see `on_policy`): the old log-probs are this forward's own, detached — the ratio is exactly 1
    old_logprobs = rollout.logprobs[rows, :t] if rollout.logprobs is not None else logprobs.detach()
    in_loss = rollout.ref_logprobs is not None and config.kl.add_to == "loss"
    ref = rollout.ref_logprobs[rows, :t] if in_loss else None
    pg, pg_stats, is_stats = updates.policy_loss(
        config, rollout, micro, logprobs, old_logprobs, loss_mask, ref=ref, kl_coef=config.kl.coef, clipped=clipped
    )
    policy_loss = aggregate(pg, loss_mask, config.loss_aggregation, **denominators)
    entropy_mean = aggregate(entropy, loss_mask, "token-mean", num_tokens=denominators["num_tokens"])
    share = (loss_mask.sum() / denominators["num_tokens"]).item()  # this micro-batch's share of the tokens
    stats = {
        "policy/loss": policy_loss.item(),
        "policy/entropy": entropy_mean.item(),
        "ratio_dev_max": updates.ratio_dev_max(logprobs, old_logprobs, loss_mask),
    }
    for name in ["clipfrac", "approx_kl", "clip_ratio/low", "clip_ratio/high", "clip_ratio/region"]:
        key = name if name.startswith("clip_ratio") else f"policy/{name}"
        stats[key] = pg_stats[name].item() * share
    stats |= updates.setting_stats(pg_stats, share)
    if rollout.logprobs is None:  # on-policy: this forward's own log-probs are the trainer's side of the mismatch
        is_stats |= mismatch_stats(old_logprobs, rollout.sampler_at(micro), loss_mask)
    stats |= {key: value if key.endswith("_max") else value * share for key, value in is_stats.items()}
    return policy_loss - config.grpo.entropy_coef * entropy_mean, stats


def _select_groups(sampled: Sampled, groups: torch.Tensor, G: int) -> Sampled:
    """The rows of whole groups ``groups`` (indices into the N groups), in that order."""
    rows = (groups[:, None] * G + torch.arange(G)).flatten()
    prompts = [sampled.prompts[i] for i in rows.tolist()]
    return Sampled(sampled.generated.select(rows), sampled.scores.select(rows), sampled.rewards[rows], prompts)


def _concat(parts: list[Sampled]) -> Sampled:
    """Rows of several rounds in one batch: prompts re-left-padded, responses re-right-padded to common widths."""
    parts = [p for p in parts if len(p.generated.completions)]
    if len(parts) == 1:
        return parts[0]
    pad = parts[0].generated.pad_token_id
    T = max(p.generated.responses.shape[1] for p in parts)
    C = max(p.generated.query_responses.shape[1] - p.generated.responses.shape[1] for p in parts)
    queries, query_masks, responses, logprobs, env_masks = [], [], [], [], []
    for p in parts:
        g = p.generated
        c, t = g.query_responses.shape[1] - g.responses.shape[1], g.responses.shape[1]
        queries.append(F.pad(g.query_responses[:, :c], (C - c, 0), value=pad))
        query_masks.append(F.pad(g.attention_mask[:, :c], (C - c, 0), value=0))
        responses.append(F.pad(g.responses, (0, T - t), value=pad))
        logprobs.append(None if g.sampler_logprobs is None else F.pad(g.sampler_logprobs, (0, T - t)))
        env_masks.append(None if g.env_mask is None else F.pad(g.env_mask, (0, T - t), value=False))
    response = torch.cat(responses)
    generated = generation.Generated(
        query_responses=torch.cat([torch.cat(queries), response], dim=1),
        attention_mask=torch.cat([torch.cat(query_masks), (response != pad).long()], dim=1),
        responses=response,
        completions=[c for p in parts for c in p.generated.completions],
        has_stop=torch.cat([p.generated.has_stop for p in parts]),
        pad_token_id=pad,
        sampler_logprobs=None if any(x is None for x in logprobs) else torch.cat(logprobs),
        env_mask=None if any(x is None for x in env_masks) else torch.cat(env_masks),
        episodes=None if parts[0].generated.episodes is None else [e for p in parts for e in p.generated.episodes],
    )
    scores = scoring.concat_scores([p.scores for p in parts])
    prompts = [text for p in parts for text in p.prompts]
    return Sampled(generated, scores, torch.cat([p.rewards for p in parts]), prompts)
