"""Critic-free, group-relative advantages (GRPO family), multi-reward combination, DAPO reward shaping.

Canonical shape: ``rewards (N, G)`` — N prompts × G samples each (reshape a flat ``(B,)`` batch laid out
prompt-major with ``rewards.view(-1, G)``); multi-reward inputs are ``(N, G, K)``. Outputs are ``(N, G)``
sequence-level advantages; :func:`token_advantages` spreads them over a batch's tokens ``(B, T)``, with the
KL penalty in the reward when asked.

A NaN reward means "could not be scored" (a reward function returned None): that sample gets advantage 0
and is left out of every mean and std. Advantages are constants; nothing here needs gradients.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlhf.core.advantages import gae
from rlhf.core.choices import GroupEstimator, RewardScale
from rlhf.core.kl import kl_shaped_rewards
from rlhf.core.masked import masked_whiten


def _valid(rewards: torch.Tensor) -> torch.Tensor:
    return ~torch.isnan(rewards)


def _nan_mean(x: torch.Tensor, valid: torch.Tensor, dim: int | tuple[int, ...]) -> torch.Tensor:
    """Mean of the valid entries over ``dim`` (kept as size 1); NaN where none is valid."""
    n = valid.sum(dim, keepdim=True).to(x.dtype)
    return torch.where(valid, x, torch.zeros_like(x)).sum(dim, keepdim=True) / n


def _nan_std(x: torch.Tensor, valid: torch.Tensor, dim: int | tuple[int, ...]) -> torch.Tensor:
    """Bessel-corrected std of the valid entries over ``dim`` (kept); 0 where fewer than two are valid. Plays TRL's
    ``nanstd`` (trainer/utils.py L857-890). A lone scored sample has no spread: returning 0 (not NaN) makes its
    advantage (r − r)/(0 + eps) = 0."""
    n = valid.sum(dim, keepdim=True).to(x.dtype)
    dev2 = torch.where(valid, (x - _nan_mean(x, valid, dim)) ** 2, torch.zeros_like(x))
    var = dev2.sum(dim, keepdim=True) / (n - 1).clamp(min=1)
    return torch.where(n > 1, var, torch.zeros_like(var)).sqrt()


def grpo_advantages(
    rewards: torch.Tensor, *, scale: RewardScale | str = RewardScale.GROUP, eps: float = 1e-4
) -> torch.Tensor:
    """GRPO: ``A_ij = (r_ij − mean_j r_ij) / (std_j r_ij + eps)``, ``rewards (N, G) → (N, G)``.

    ``std`` is Bessel-corrected (n − 1) and ``eps`` sits outside the square root, as in TRL (default 1e-4;
    the understand-r1-zero GRPO baseline uses 1e-8). ``scale``: ``"group"`` per-prompt std (TRL default),
    ``"batch"`` one std of all rewards, ``"none"`` no division (= Dr. GRPO). A zero-std group gives 0.
    Source: TRL grpo_trainer L2685-2708, L2730, grpo_config L779-790; DeepSeekMath (Shao et al. 2024).
    Vector: reference 2-J.
    """
    valid = _valid(rewards)
    centred = rewards - _nan_mean(rewards, valid, dim=1)
    scale = RewardScale(scale)
    if scale is RewardScale.NONE:  # no division and no eps: exactly r − mean_g (Dr. GRPO)
        adv = centred
    else:  # batch: the std of the raw rewards over all N·G samples, not the centred ones' (reference 2-J: 0.4438126823)
        adv = centred / (_nan_std(rewards, valid, dim=1 if scale is RewardScale.GROUP else (0, 1)) + eps)
    return torch.where(valid, adv, torch.zeros_like(adv))


def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO: ``A_ij = r_ij − mean_j r_ij`` (no std division), ``(N, G) → (N, G)``. Dividing by the group std
    up-weights prompts that are nearly always solved or failed (a difficulty bias). Source: Liu et al. 2025
    (arXiv 2503.20783), understand-r1-zero ``compute_monte_carlo_advantages``; TRL ``scale_rewards="none"``.
    Vector: reference 2-J ("none")."""
    return grpo_advantages(rewards, scale=RewardScale.NONE)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO: ``A_ij = r_ij − mean_{k≠j} r_ik`` (leave-one-out baseline), ``(N, G) → (N, G)``, G ≥ 2.

    The baseline excludes the sample itself, so it is independent of that sample and the estimate is
    unbiased; algebraically ``A = G/(G−1) · (r − mean_g)``. Computed as ``r − (Σ_k r_k − r_j)/(n − 1)`` over
    the n scored samples of the group (a lone scored sample gets 0). Source: Ahmadian et al. 2024
    ("Back to Basics: Revisiting REINFORCE Style Optimization"); OpenRLHF experience_maker.py
    ``compute_advantages_and_returns`` (``advantage_estimator == "rloo"``).
    """
    if rewards.shape[1] < 2:
        raise ValueError(f"rloo needs at least 2 samples per prompt (group_size >= 2), got {rewards.shape[1]}")
    valid = _valid(rewards)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    n = valid.sum(1, keepdim=True).to(rewards.dtype)
    baseline = (r.sum(1, keepdim=True) - r) / (n - 1).clamp(min=1)
    return torch.where(valid & (n > 1), r - baseline, torch.zeros_like(r))


def reinforce_pp_advantages(rewards: torch.Tensor, *, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ with a group baseline (OpenRLHF ``reinforce_baseline``), ``(N, G) → (N, G)``.

    ``c_ij = r_ij − mean_j r_ij``, then one whitening over the whole batch, ``A = (c − mean(c)) / sqrt(Var(c) + eps)``
    with the population variance, as OpenRLHF experience_maker.py ``compute_advantages_and_returns`` (commit
    89308a0b). Deviations: OpenRLHF whitens the per-token returns over ``action_mask`` (a sample weighs by its length;
    with no KL in the reward every token of a sample carries the same return) — here every sample counts once,
    identical for equal lengths; and eps is added inside the root instead of ``var.clamp(min=1e-8)`` (differs only when
    Var(c) ≲ 1e-8). Plain REINFORCE++ (no group baseline) is ``masked_whiten`` of the raw rewards. Source: Hu 2025
    (arXiv 2501.03262).
    """
    valid = _valid(rewards)
    centred = rewards - _nan_mean(rewards, valid, dim=1)
    adv = masked_whiten(centred, valid, shift_mean=True, unbiased=False, eps=eps)
    return torch.where(valid, adv, torch.zeros_like(adv))


GROUP_ESTIMATORS: dict[GroupEstimator, Callable[..., torch.Tensor]] = {
    GroupEstimator.GRPO: grpo_advantages,
    GroupEstimator.DR_GRPO: dr_grpo_advantages,
    GroupEstimator.RLOO: rloo_advantages,
    GroupEstimator.REINFORCE_PP: reinforce_pp_advantages,
}


def group_advantages(rewards: torch.Tensor, estimator: GroupEstimator | str, **options: object) -> torch.Tensor:
    """Advantages ``(N, G)`` from rewards ``(N, G)`` with the chosen estimator; ``options`` go to its function
    (``scale``/``eps`` for grpo, ``eps`` for reinforce_pp)."""
    return GROUP_ESTIMATORS[GroupEstimator(estimator)](rewards, **options)


def token_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    estimator: GroupEstimator | str,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    score_index: torch.Tensor | None = None,
    whiten: bool = False,
    **options: object,
) -> torch.Tensor:
    """Per-token advantages ``(B, T)`` from the rewards ``(B,)`` of prompt-major groups of ``group_size``; 0
    outside ``mask`` ``(B, T)`` (True = a token of the loss). ``options`` go to the estimator.

    Without ``kl``: the estimator's sequence advantage (:func:`group_advantages`) on every token. With the
    per-token ``kl`` ``(B, T)`` put in the reward (GRPO's ``kl_in: reward``): the sequence advantage is the
    score at ``score_index`` ``(B,)`` (the last real token), every token pays −β·KL, and each token's
    advantage is its reward-to-go, ``A_t = A_seq·[t ≤ index] − β·Σ_{k≥t} KL_k`` (GAE with γ = λ = 1 and zero
    values). REINFORCE++ then only centres the scores in their group (its ``dr_grpo`` form) and whitens the
    token-level returns over the batch instead of whitening per sequence (OpenRLHF ``reinforce_baseline``).
    ``whiten``: whiten the advantages over the masked tokens (population variance) at the end.
    """
    if kl is not None:
        if score_index is None:
            raise ValueError("token_advantages: score_index is needed with kl (where each sequence's score goes)")
        if GroupEstimator(estimator) is GroupEstimator.REINFORCE_PP:
            estimator, whiten = GroupEstimator.DR_GRPO, True  # centre only; the whitening comes after the KL
    per_sequence = group_advantages(rewards.view(-1, group_size), estimator, **options).view(-1)
    if kl is None:
        advantages = per_sequence[:, None].expand_as(mask)
    else:
        token_rewards, _ = kl_shaped_rewards(per_sequence, kl, kl_coef, score_index, mask)
        advantages, _ = gae(token_rewards, torch.zeros_like(token_rewards), mask, gamma=1.0, lam=1.0)
    if whiten:
        advantages = masked_whiten(advantages, mask, unbiased=False)
    return advantages.masked_fill(~mask, 0.0)


def sum_rewards(rewards: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum of K rewards, ``(N, G, K), (K,) → (N, G)``: the plain combination, normalised afterwards. NaN
    rewards are skipped (TRL ``(rewards_per_func * weights).nansum(dim=1)``, grpo_trainer); a sample with every reward
    NaN stays NaN (TRL gives 0) so the group estimator treats it as unscorable."""
    valid = _valid(rewards)
    total = torch.where(valid, rewards * weights, torch.zeros_like(rewards)).sum(-1)
    return torch.where(valid.any(-1), total, torch.full_like(total, float("nan")))


def gdpo_advantages(rewards: torch.Tensor, weights: torch.Tensor, *, eps: float = 1e-4) -> torch.Tensor:
    """GDPO: normalise each reward within its group, take the weighted sum, normalise over the batch.

    ``A_k = (r_k − mean_g r_k) / (std_g r_k + eps)`` for each of the K rewards (:func:`grpo_advantages`,
    scale "group"); ``S = Σ_k w_k A_k``; ``A = (S − mean S) / (std S + eps)`` over all N·G samples
    (Bessel-corrected std, eps outside the root). Shapes ``(N, G, K), (K,) → (N, G)``. Summing first lets
    the reward with the largest spread decide the sign for everyone ("reward advantage collapse").
    A NaN reward contributes 0 to its term; a sample with all K rewards NaN gets 0 and is left out of the
    batch statistics (the reference ``nan_to_num``s rewards to 0 instead).
    Source: "GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL
    Optimization" (NVlabs, 2026, arXiv 2601.05242); NVlabs/GDPO ``trl-GDPO`` grpo_trainer
    ``_generate_and_score_completions`` (eps 1e-4 in both places).
    """
    per_reward = torch.stack([grpo_advantages(rewards[..., k], eps=eps) for k in range(rewards.shape[-1])], dim=-1)
    combined = (per_reward * weights).sum(-1)
    valid = _valid(rewards).any(-1)
    adv = (combined - _nan_mean(combined, valid, dim=(0, 1))) / (_nan_std(combined, valid, dim=(0, 1)) + eps)
    return torch.where(valid, adv, torch.zeros_like(adv))


def dapo_overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment, ``lengths (B,) → (B,)``, added to the task reward.

    ``R_len(|y|) = min(−(|y| − (L_max − L_buf)) / L_buf · factor, 0)``: 0 up to ``L_max − L_buf``, then linear
    to −factor at ``L_max``. Paper: ``L_max = 20480, L_buf = 4096``. Source: Yu et al. 2025 (arXiv
    2503.14476) Eq. R_length; verl ``recipe/dapo`` README "Overlong Reward Shaping". Responses longer than
    ``L_max`` (impossible when ``L_max`` is the generation limit) go below −factor; OpenRLHF caps at −factor.
    Vector: reference 2-L.
    """
    lengths = lengths if lengths.is_floating_point() else lengths.to(torch.get_default_dtype())
    excess = lengths - (max_len - buffer)
    return torch.clamp(-excess / buffer * factor, max=0.0)


def groups_with_signal(rewards: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling filter: ``(N, G) → (N,)`` bool, True where the group's scored rewards differ. A group whose
    rewards are all equal has zero advantage for every sample and no gradient; DAPO drops it and samples more prompts.
    NaNs are ignored; an all-NaN group is False. Source: DAPO (arXiv 2503.14476) "Dynamic Sampling"; verl
    ``recipe/dapo`` README; checklist item 46."""
    valid = _valid(rewards)
    hi = torch.where(valid, rewards, torch.full_like(rewards, -float("inf"))).amax(1)
    lo = torch.where(valid, rewards, torch.full_like(rewards, float("inf"))).amin(1)
    return hi > lo
