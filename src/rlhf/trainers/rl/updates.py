"""The update passes PPO and GRPO share: minibatches × micro-batches with one optimizer step each, what weights the
policy's surrogate (sampler correction, entropy and off-policy masks), the objective's settings and the warm-ups."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence

import torch
from torch import nn

from rlhf.config import PolicyGradientConfig
from rlhf.core.losses import Objective, clipped_policy_loss, off_policy_mask
from rlhf.core.masked import masked_mean
from rlhf.core.mismatch import importance_weights
from rlhf.models.policy import ScoredTokens
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.runlog.train_state import TrainState
from rlhf.trainers import update
from rlhf.trainers.rl.models import Models
from rlhf.trainers.rl.rollout import Rollout, micro_plan


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
    return weights, {
        "rollout/is_weight_mean": masked_mean(weights, mask).item(),
        "rollout/is_capped_frac": masked_mean(capped.float(), mask).item(),
    }


def objective(config: PolicyGradientConfig) -> Objective:
    """The policy objective of `rlhf.core.losses.clipped_policy_loss` as the algorithm's section sets it (clip,
    CISPO, SAPO or VESPO; token or sequence ratios; ``delta`` as the clip's dual cap; the KL term weighted by the
    ratio or not)."""
    section = config.algorithm
    return Objective(
        kind=config.policy_objective,
        clip_low=section.clip_range,
        clip_high=config.clip_range_upper,
        dual_clip=section.delta,
        importance_level=section.importance_sampling_level,
        sapo_temperatures=(section.sapo_temperature_pos, section.sapo_temperature_neg),
        vespo_kernels=(
            (section.vespo_k_pos, section.vespo_lambda_pos),
            (section.vespo_k_neg, section.vespo_lambda_neg),
        ),
        kl_bias_correction=section.use_bias_correction_kl,
    )


SETTING_STATS = {"clip_ratio/dual": "clip_ratio/dual", "vespo_phi_mean": "policy/vespo_phi_mean", "kl": "kl/loss_mean"}
"""The policy loss's stats that only some settings give (``delta``, ``loss_type: vespo``, the KL in the loss), by the
name they are logged under."""


def setting_stats(pg_stats: dict[str, torch.Tensor], share: float) -> dict[str, float]:
    """Those of :data:`SETTING_STATS` that `rlhf.core.losses.clipped_policy_loss` gave, times ``share`` (this
    micro-batch's share of the minibatch's tokens: the update sums them into the minibatch's means)."""
    return {key: pg_stats[name].item() * share for name, key in SETTING_STATS.items() if name in pg_stats}


def policy_loss(
    config: PolicyGradientConfig,
    rollout: Rollout,
    micro: update.MicroBatch,
    logprobs: torch.Tensor,
    old: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref: torch.Tensor | None,
    kl_coef: float,
    clipped: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, float]]:
    """The policy's per-token loss on ``micro``'s tokens (`rlhf.core.losses.clipped_policy_loss`: the algorithm's
    :func:`objective`, β·k3 against ``ref`` when given), its stats, and the stats of what weighs its surrogate: the
    sampler correction (:func:`is_weights`), the entropy mask (``rollout.entropy_keep``) and the off-policy mask
    (``off_policy_mask_threshold``: `rlhf.core.losses.off_policy_mask`, against the sampler's log-probs when known,
    else ``old``), as token means over ``mask`` (``policy/off_policy_masked``: the share of tokens it left out)."""
    rows, t = micro.rows, micro.response_length
    advantages, sampler = rollout.advantages[rows, :t], rollout.sampler_at(micro)
    weights, weight_stats = is_weights(config, old, sampler, mask)
    keep = None if rollout.entropy_keep is None else rollout.entropy_keep[rows, :t]
    threshold = config.algorithm.off_policy_mask_threshold
    if threshold is not None:
        behaviour = sampler if sampler is not None else old
        on_policy = off_policy_mask(logprobs, behaviour, advantages, mask, threshold)
        weight_stats["policy/off_policy_masked"] = masked_mean((~on_policy).float(), mask).item()
        keep = on_policy if keep is None else keep & on_policy
    if keep is not None:
        keep = keep.to(logprobs.dtype)
        weights = keep if weights is None else weights * keep
    loss, stats = clipped_policy_loss(
        logprobs,
        old,
        advantages,
        mask,
        ref_logp=ref,
        kl_coef=kl_coef,
        clipped=clipped,
        is_weights=weights,
        objective=objective(config),
    )
    return loss, stats, weight_stats


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
