"""The critic-free GRPO family (GRPO, Dr. GRPO, RLOO, REINFORCE++) with DAPO options: the algorithm `GRPO` inside the
RL loop of `rlhf.trainers.rl`, read top to bottom from `GRPO`.

One iteration: (1) sample G = ``group_size`` responses for each of ``batch_size`` prompts → (2) score them,
combine the rewards (weighted sum, or GDPO within each group), add the missing-EOS and DAPO overlong
penalties; with ``dynamic_sampling`` drop the groups whose rewards are all equal and sample more prompts until
``batch_size`` groups remain → (3) old log-probs (and reference log-probs when ``kl.coef > 0``) in one no-grad
pass (the policy's part skipped when `on_policy`) → (4) group-relative advantages from ``rlhf.core.group`` →
(5) ``num_iterations`` passes × minibatches × micro-batches of the clipped per-token loss (+ β·KL in the
loss), one optimizer step per minibatch → (6) metrics → (7) held-out samples, log, checkpoint. All math is
in ``rlhf.core``; each phase is one call. The loop (held-out evaluation, metrics, checkpoints, resume) is
ppo's: `rlhf.trainers.rl`.

Conventions (checklist numbers from ``docs/ppo_checklist.md``):
- the loss mask covers the response up to and including the first stop token (item 44); with
  ``mask_truncated_completions`` responses cut at ``max_new_tokens`` are left out of the loss (they still
  count in their group's mean and std); a sample no reward source could score (NaN) gets advantage 0 and is
  left out of the loss;
- sequence advantages are broadcast to every token (item 41); the loss is reduced by ``loss_aggregation``
  with the minibatch's global denominators, so micro-batching does not change the gradient (item 43);
- iteration 0 visits the rollout in the order it was scored, in the same micro-batches: the ratio of the
  first minibatch is exactly 1 (item 34; with ``num_iterations: 1`` and one minibatch it is 1 throughout,
  and without a reference the old log-probs are then taken from the training forward itself, `on_policy`);
- ``kl_coef: 0`` loads no reference model at all (no frozen copy, no reference forward);
- ``reward_aggregation: gdpo``: the combined value is GDPO's normalised advantage (each reward normalised in
  its group, weighted sum, normalised over the batch); the estimator still runs on it. It is already
  group-centred, so ``dr_grpo`` leaves it unchanged, ``rloo`` scales it by G/(G−1) and ``grpo`` (group
  scaling) also divides each group by its own std. Penalties (missing EOS, overlong) are added after GDPO.
- ``kl_in: reward``: the per-token −β·KL joins the rewards and the token-level advantage is the reward-to-go
  (γ = 1, ``rlhf.core.advantages.gae`` with zero values and λ = 1): A_t = A_seq − β·Σ_{k≥t} KL_k. For
  ``reinforce_pp`` this is REINFORCE++ (OpenRLHF ``reinforce_baseline``): group-centred scores, KL in the
  reward, then the token-level returns whitened over the batch (population variance).
Deviations from the references: dynamic sampling stops after ``MAX_SAMPLING_ROUNDS`` generation rounds and
fills the batch with zero-signal groups (verl raises an error instead); log-probs are recomputed by the
training model at the sampling temperature, never taken from the sampler (item 47).
"""

from __future__ import annotations

import dataclasses
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
from rlhf.core.logprobs import INVALID_LOGPROB
from rlhf.core.losses import aggregate, clipped_policy_loss
from rlhf.core.masked import masked_mean, masked_sum
from rlhf.core.sequences import penalize_missing_eos, response_masks, score_index
from rlhf.rollout import generation, scoring
from rlhf.runlog import distributed, rundir
from rlhf.runlog.distributed import Dist
from rlhf.runlog.train_state import TrainState
from rlhf.trainers import rl, update

MAX_SAMPLING_ROUNDS = 4
"""Dynamic sampling: most generation rounds (of ``batch.size`` prompts each) per iteration."""


@dataclass(frozen=True)
class Rollout(rl.Rollout):
    """`rl.Rollout` (``logprobs`` None when the update is `on_policy`, ``ref_logprobs`` None with ``kl.coef: 0``;
    ``advantages`` 0 outside ``mask``) with ``mask`` (B, T) bool, the tokens of the loss."""

    mask: torch.Tensor


class GRPO(rl.Algorithm):
    """The GRPO family inside the RL loop (`rlhf.trainers.rl.train`): groups of responses per prompt (with dynamic
    sampling, more rounds), then the rollout's pass and the clipped per-token updates."""

    def __init__(self, config: GRPOConfig, inputs: rl.Inputs):
        self.config, self.inputs = config, inputs
        self.models = build_models(config, inputs.d)
        self.updates_per_step = config.grpo.num_iterations * config.grpo.num_minibatches

    def sample(self, stream: Any, generator: torch.Generator, trainer_state: Any) -> rl.Sampled:
        """Phases 1-2: ``group_size`` responses to each of the next prompts, scored; with dynamic sampling more
        rounds until enough groups carry a signal (:func:`fill_batch`)."""

        def sample_round() -> rl.Sampled:
            return sample_groups(self.config, self.models, self.inputs, next(stream), generator, trainer_state)

        return fill_batch(self.config, sample_round)

    def learn(self, step: int, sampled: rl.Sampled, state: Any, watch: Any) -> dict[str, float]:
        """Phases 3-5: old (and reference) log-probs, group-relative advantages; ``num_iterations`` passes ×
        minibatches of the clipped per-token loss."""
        with watch("logprobs"):
            rollout, stats = make_rollout(self.config, self.models, sampled, self.inputs.d)
        with watch("train"):
            trained = grpo_update(
                self.config, self.models, rollout, state, clipped=rl.clipped_objective(self.config, step, self.inputs.d)
            )
        return stats | trained


def build_models(config: GRPOConfig, d: Dist) -> rl.Models:
    """The policy and, when ``kl.coef > 0``, its reference; with ``kl.coef: 0`` no reference at all (not even a
    frozen copy in memory)."""
    return rl.Models(config.model, d, reference=config.kl.coef > 0, ema=config.kl.reference_ema)


@distributed.entry
@rundir.claims_output_dir
def run(config: GRPOConfig) -> Path:
    """Train ``config.model.name`` with the GRPO family; returns the ``final/`` directory."""
    return rl.train(config, GRPO)


def sample_groups(
    config: GRPOConfig,
    models: rl.Models,
    inputs: rl.Inputs,
    batch: Any,
    generator: torch.Generator,
    trainer_state: Any = None,
) -> rl.Sampled:
    """Phases 1-2 for one prompt batch: G samples per prompt, scores (GDPO within each group), penalties."""
    G = config.grpo.group_size
    sampled = rl.sample_and_score(config, inputs, models.policy, batch, generator, trainer_state, repeat=G)
    return dataclasses.replace(sampled, rewards=shaped_rewards(config, sampled.scores.combined, sampled.generated))


def shaped_rewards(config: GRPOConfig, combined: torch.Tensor, generated: generation.Generated) -> torch.Tensor:
    """The combined score (B,) with the missing-EOS penalty and the DAPO overlong penalty; NaN stays NaN."""
    rewards = combined.float()
    if config.reward.missing_eos_penalty is not None:
        rewards = penalize_missing_eos(
            rewards, generated.has_stop.cpu(), config.reward.missing_eos_mode, config.reward.missing_eos_penalty
        )
    if config.grpo.overlong_buffer > 0:
        lengths = (generated.responses != generated.pad_token_id).sum(-1).cpu()
        rewards = rewards + dapo_overlong_penalty(
            lengths, config.sampling.max_new_tokens, config.grpo.overlong_buffer, config.grpo.overlong_penalty_factor
        )
    return rewards


def fill_batch(config: GRPOConfig, sample_round: Callable[[], rl.Sampled]) -> rl.Sampled:
    """One round of ``batch.size`` groups; with ``grpo.dynamic_sampling`` (DAPO, checklist item 46) more rounds until
    ``batch_size`` groups have rewards that differ, at most ``MAX_SAMPLING_ROUNDS``; a batch still short is
    filled with zero-signal groups (advantage 0: only the KL term moves them) so every step has one size. The
    sampler's stats (``reward/zero_std_groups``, ``dynamic_sampling/*``) come with the batch."""
    G, N = config.grpo.group_size, config.batch.size
    first = sample_round()
    signal = groups_with_signal(first.rewards.view(-1, G))
    stats = {"reward/zero_std_groups": 1.0 - signal.float().mean().item()}
    if not config.grpo.dynamic_sampling:
        return dataclasses.replace(first, stats=stats)
    kept, spare, n_kept, rounds, part = [], [], 0, 0, first
    while True:
        rounds += 1
        signal = groups_with_signal(part.rewards.view(-1, G))
        kept.append(_select_groups(part, signal.nonzero().flatten(), G))
        spare.append(_select_groups(part, (~signal).nonzero().flatten(), G))
        n_kept += int(signal.sum())
        if n_kept >= N or rounds >= MAX_SAMPLING_ROUNDS:
            break
        part = sample_round()
    merged = _concat(kept + spare)
    stats.update(
        {
            "dynamic_sampling/rounds": rounds,
            "dynamic_sampling/dropped_groups": rounds * N - n_kept,
            "dynamic_sampling/filled_groups": max(0, N - n_kept),
        }
    )
    return dataclasses.replace(_select_groups(merged, torch.arange(N), G), stats=stats)


@torch.no_grad()
def make_rollout(
    config: GRPOConfig, models: rl.Models, sampled: rl.Sampled, d: Dist = distributed.SINGLE
) -> tuple[Rollout, dict[str, float]]:
    """Phases 3-4: one no-grad pass for old (and reference) log-probs, then the advantages (rlhf.core.group).

    When the update is `on_policy` the policy's pass is skipped (``Rollout.logprobs`` is None): the training
    forward supplies the old log-probs itself. Each rank runs the pass on its groups in the micro-batches of the
    first update; the log-probs are summed over ranks (each row filled by one rank) and the advantages are
    computed on the whole batch on every rank, as in one process.

    Phases 3-4 stay in one function because they share the rollout's masks and pass results straight on;
    every formula is a `rlhf.core` call.
    """
    generated = sampled.generated
    ids, mask = generated.query_responses, generated.attention_mask
    (B, L), T = ids.shape, generated.responses.shape[1]
    skip_policy = on_policy(config, models)
    logprobs = None if skip_policy else torch.zeros(B, T, device=ids.device)
    ref = torch.zeros(B, T, device=ids.device) if models.reference is not None else None
    # the same micro-batches as iteration 0 (unshuffled minibatches): its first ratio is exactly 1 (checklist 34)
    split = rl.micro_plan(config, mask, T)
    for micro, real in update.first_pass(B, config.minibatch_size, config.grpo.group_size, split, d):
        rows, cols, t = micro.rows, micro.columns(L - T), micro.response_length
        if logprobs is not None:
            old = models.old_scores(ids[rows, cols], mask[rows, cols], t, config.sampling.temperature).logprobs
            if real:
                logprobs[rows, :t] = old
        if ref is not None:
            reference = models.reference.logprobs(ids[rows, cols], mask[rows, cols], t, config.sampling.temperature)
            if real:
                ref[rows, :t] = reference
    logprobs = d.sum(logprobs) if logprobs is not None else None
    ref = d.sum(ref) if ref is not None else None
    masks = response_masks(generated.responses, pad_token_id=generated.pad_token_id)
    rewards = sampled.rewards.to(ids.device)
    scored = ~rewards.isnan()
    loss_mask = ~masks.padding_mask & scored[:, None]  # up to and including the stop token (checklist 44)
    if config.grpo.mask_truncated_completions:
        loss_mask = loss_mask & generated.has_stop[:, None]
    # INVALID_LOGPROB on both sides at padding: KL = 0 and ratio = 1 there (checklist item 13); the columns a
    # micro-batch cut are padding of all its rows, filled here too
    logprobs = logprobs.masked_fill(masks.padding_mask, INVALID_LOGPROB) if logprobs is not None else None
    ref = ref.masked_fill(masks.padding_mask, INVALID_LOGPROB) if ref is not None else None
    kl = kl_estimate(logprobs, ref, config.kl.estimator) if ref is not None else None
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

    stats = {
        "reward/score_mean": rewards[scored].mean().item() if scored.any() else math.nan,
        "advantages/abs_mean": masked_mean(advantages.abs(), loss_mask).item(),
        "response/masked_fraction": 1.0 - (loss_mask.any(-1) | ~scored).float().mean().item(),
    }
    if config.grpo.overlong_buffer > 0:
        lengths = (generated.responses != generated.pad_token_id).sum(-1)
        penalty = dapo_overlong_penalty(
            lengths, config.sampling.max_new_tokens, config.grpo.overlong_buffer, config.grpo.overlong_penalty_factor
        )
        stats["reward/overlong_penalty_mean"] = penalty.mean().item()
    if ref is not None:
        # kl/mean: per-sequence Σ (log π − log π_ref) over the loss tokens, averaged over scored sequences
        stats["kl/mean"] = masked_sum(logprobs - ref, loss_mask, dim=-1)[scored].mean().item()
        stats["kl/estimator_mean"] = masked_sum(kl, loss_mask, dim=-1)[scored].mean().item()
    return Rollout(ids, mask, logprobs, ref, advantages, mask=loss_mask), stats


def on_policy(config: GRPOConfig, models: rl.Models) -> bool:
    """One optimizer step per rollout and no reference: the policy has not moved when the loss is computed,
    so the old log-probs equal the training forward's own (detached) and their no-grad pass is skipped —
    one policy forward less per step, the same update (TRL's GRPO does the same)."""
    return config.grpo.num_iterations == 1 and config.grpo.num_minibatches == 1 and models.reference is None


def grpo_update(
    config: GRPOConfig, models: rl.Models, rollout: Rollout, state: TrainState, clipped: bool = True
) -> dict[str, float]:
    """Phase 5: ``grpo.num_iterations`` passes over the rollout (later ones shuffled), each in ``num_minibatches``
    minibatches (one optimizer step each) of micro-batches whose losses use the minibatch's global
    denominators, so accumulation (and the ranks) give exactly the minibatch's gradient
    (`rlhf.trainers.update`). ``clipped`` False: the unclipped loss of the warm-up (``grpo.warmup_pg_steps``)."""

    def step(micro: update.MicroBatch, minibatch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        denominators = {
            "num_tokens": rollout.mask[minibatch].sum().clamp(min=1),
            "num_seqs": len(minibatch),
            "max_len": config.sampling.max_new_tokens,
        }
        return micro_step(config, models, rollout, micro, denominators, clipped)

    passes, unit = config.grpo.num_iterations, config.grpo.group_size
    result = rl.update_passes(config, models, rollout, state, passes=passes, unit=unit, step=step)
    result["policy/clipped"] = float(clipped)
    return result


def micro_step(
    config: GRPOConfig,
    models: rl.Models,
    rollout: Rollout,
    micro: update.MicroBatch,
    denominators: dict[str, Any],
    clipped: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Forward of one micro-batch: its loss and its share of the minibatch stats. Only the micro-batch's own
    columns run; the cut ones are padding, outside the loss mask."""
    rows, t = micro.rows, micro.response_length
    cols = micro.columns(rollout.query_responses.shape[1] - rollout.response_length)
    ids, mask = rollout.query_responses[rows, cols], rollout.attention_mask[rows, cols]
    loss_mask = rollout.mask[rows, :t]
    logprobs, _, entropy = models.trainable.forward(
        ids, mask, t, config.sampling.temperature, entropy=True, entropy_grad=config.grpo.entropy_coef != 0
    )
    # on-policy (see `on_policy`): the old log-probs are this forward's own, detached — the ratio is exactly 1
    old_logprobs = rollout.logprobs[rows, :t] if rollout.logprobs is not None else logprobs.detach()
    in_loss = rollout.ref_logprobs is not None and config.kl.add_to == "loss"
    pg, pg_stats = clipped_policy_loss(
        logprobs,
        old_logprobs,
        rollout.advantages[rows, :t],
        loss_mask,
        clip_low=config.grpo.clip_range,
        clip_high=config.clip_range_upper,
        ref_logp=rollout.ref_logprobs[rows, :t] if in_loss else None,
        kl_coef=config.kl.coef,
        clipped=clipped,
    )
    policy_loss = aggregate(pg, loss_mask, config.grpo.loss_aggregation, **denominators)
    entropy_mean = aggregate(entropy, loss_mask, "token-mean", num_tokens=denominators["num_tokens"])
    share = (loss_mask.sum() / denominators["num_tokens"]).item()  # this micro-batch's share of the tokens
    with torch.no_grad():
        ratio_dev = (logprobs - old_logprobs).exp().sub(1).abs().masked_fill(~loss_mask, 0).max()
    stats = {
        "policy/loss": policy_loss.item(),
        "policy/entropy": entropy_mean.item(),
        "ratio_dev_max": ratio_dev.item(),
    }
    names = ["clipfrac", "approx_kl", "clip_ratio/low", "clip_ratio/high", "clip_ratio/region"]
    names += ["kl"] if in_loss else []
    for name in names:
        key = "kl/loss_mean" if name == "kl" else name if name.startswith("clip_ratio") else f"policy/{name}"
        stats[key] = pg_stats[name].item() * share
    return policy_loss - config.grpo.entropy_coef * entropy_mean, stats


def _select_groups(sampled: rl.Sampled, groups: torch.Tensor, G: int) -> rl.Sampled:
    """The rows of whole groups ``groups`` (indices into the N groups), in that order."""
    rows = (groups[:, None] * G + torch.arange(G)).flatten()
    generated, s = sampled.generated.select(rows), sampled.scores
    prompts = [sampled.prompts[i] for i in rows.tolist()]
    return rl.Sampled(generated, s.select(rows), sampled.rewards[rows], prompts)


def _concat(parts: list[rl.Sampled]) -> rl.Sampled:
    """Rows of several rounds in one batch: prompts re-left-padded, responses re-right-padded to common widths."""
    parts = [p for p in parts if len(p.generated.completions)]
    if len(parts) == 1:
        return parts[0]
    pad = parts[0].generated.pad_token_id
    T = max(p.generated.responses.shape[1] for p in parts)
    C = max(p.generated.query_responses.shape[1] - p.generated.responses.shape[1] for p in parts)
    queries, query_masks, responses = [], [], []
    for p in parts:
        g = p.generated
        c = g.query_responses.shape[1] - g.responses.shape[1]
        queries.append(F.pad(g.query_responses[:, :c], (C - c, 0), value=pad))
        query_masks.append(F.pad(g.attention_mask[:, :c], (C - c, 0), value=0))
        responses.append(F.pad(g.responses, (0, T - g.responses.shape[1]), value=pad))
    response = torch.cat(responses)
    generated = generation.Generated(
        query_responses=torch.cat([torch.cat(queries), response], dim=1),
        attention_mask=torch.cat([torch.cat(query_masks), (response != pad).long()], dim=1),
        responses=response,
        completions=[c for p in parts for c in p.generated.completions],
        has_stop=torch.cat([p.generated.has_stop for p in parts]),
        pad_token_id=pad,
    )
    scores = scoring.concat_scores([p.scores for p in parts])
    prompts = [text for p in parts for text in p.prompts]
    return rl.Sampled(generated, scores, torch.cat([p.rewards for p in parts]), prompts)
