"""Reward-model losses and metrics on scalar rewards.

Shapes: ``chosen``, ``rejected``, ``margin`` are ``(B,)`` (one scalar reward per response of a preference
pair); `ranking_loss` reads ``(N,)`` rewards, one per answer, and ``(P,)`` index pairs into them; ``samples`` for
normalisation is ``(S,)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pairwise_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """``mean(r_c > r_r)`` over ``(B,)`` pairs, strict: a tie counts as wrong (reference 2-I: 1/3, not 2/3). Sources: N+
    reward.py L410, TRL reward_trainer L770; checklist item 17."""
    return (chosen > rejected).to(chosen.dtype).mean()


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None, center_coef: float = 0.0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Pairwise Bradley-Terry loss ``−mean log σ(r_c − r_r − margin) + center_coef · mean((r_c + r_r)²)``.

    Args:
        chosen, rejected: ``(B,)`` rewards of the preferred / dispreferred response.
        margin: optional ``(B,)`` required gap (TRL ``margin`` column; Llama-2 style).
        center_coef: TRL ``center_rewards_coefficient`` (recommended 0.01); pulls the reward mean to 0.

    Returns:
        ``(loss scalar, stats)`` with detached ``accuracy`` (strict, :func:`pairwise_accuracy`),
        ``margin_mean`` = mean(r_c − r_r), ``chosen_mean``, ``rejected_mean``.
        Sources: N+ reward.py L405-411, TRL reward_trainer L749-756; checklist item 16. Vector: reference 2-I.
    """
    diff = chosen - rejected
    logits = diff if margin is None else diff - margin
    # logsigmoid is stable for large |x| where log(sigmoid(x)) underflows to −inf.
    loss = -F.logsigmoid(logits).mean() + center_coef * ((chosen + rejected) ** 2).mean()
    with torch.no_grad():
        stats = {
            "accuracy": pairwise_accuracy(chosen, rejected),
            "margin_mean": diff.mean(),
            "chosen_mean": chosen.mean(),
            "rejected_mean": rejected.mean(),
        }
    return loss, stats


def ranking_loss(
    rewards: torch.Tensor,
    better: torch.Tensor,
    worse: torch.Tensor,
    weights: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Bradley–Terry over the pairs of rankings, every answer scored once (InstructGPT §3.5): ``Σ_p w_p ·
    [−log σ(r_b − r_w − m_p) + center_coef · (r_b + r_w)²]`` with ``b = better[p]``, ``w = worse[p]``.

    Args:
        rewards: ``(N,)`` one reward per answer (all the answers of the pairs' prompts).
        better, worse: ``(P,)`` int64 indices into ``rewards``: pair p prefers answer ``better[p]``.
        weights: ``(P,)`` each pair's weight; 1/P each is :func:`bradley_terry_loss` of the pairs (the mean),
            1/(G·n_g) each averages every prompt's n_g pairs and then the G prompts (InstructGPT's weighting).
        margin: optional ``(P,)`` required gap; center_coef: as in :func:`bradley_terry_loss`.

    Returns:
        ``(loss, stats)``, stats detached *sums* over the pairs (the caller divides by its pair count):
        ``correct`` (strict, r_b > r_w) and ``margin_sum`` = Σ (r_b − r_w). Vector: tests/core/test_preference.py.
    """
    chosen, rejected = rewards[better], rewards[worse]
    diff = chosen - rejected
    logits = diff if margin is None else diff - margin
    per_pair = -F.logsigmoid(logits) + center_coef * (chosen + rejected) ** 2
    loss = (weights * per_pair).sum()
    with torch.no_grad():
        stats = {"correct": (chosen > rejected).sum().to(rewards.dtype), "margin_sum": diff.sum()}
    return loss, stats


def normalization_gain_bias(
    samples: torch.Tensor, target_mean: float = 0.0, target_std: float = 1.0, unbiased: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gain and bias that map rewards of ``samples (S,)`` to mean ``target_mean`` and std ``target_std``.

    ``gain = σ_target / σ_D``, ``bias = μ_target − gain · μ_D``, so ``gain·r + bias`` is normalised; the
    samples are RM scores of responses from the fixed reference policy (OAI: 256), measured with gain 1,
    bias 0. ``unbiased=False`` is OAI's population std ``sqrt(E[x²] − μ²)``; N-details uses ``torch.std()``
    (unbiased) — a subtle mismatch (checklist item 19). Sources: OAI rewards.py L48-57, L73-89;
    N-details ``normalize()`` L357-413. Vector: reference 2-I.
    """
    mean = samples.mean()
    std = samples.std(correction=1 if unbiased else 0)
    gain = target_std / std
    return gain, target_mean - gain * mean


def ensemble_reward(scores: torch.Tensor, objective: str, uwo_lambda: float = 0.0) -> torch.Tensor:
    """One reward per sample from an ensemble's ``scores (B, M)`` (M members, each normalised on its own), by
    Coste et al.'s objectives (docs/ensembles.md): ``mean`` = (1/M)·Σ r_m; ``wco`` (worst case) = min_m r_m;
    ``uwo`` (uncertainty-weighted) = mean − λ·Var_m(r_m), the members' population variance (1/M), λ =
    ``uwo_lambda``. A NaN member score (unscored) makes the sample's reward NaN. Returns ``(B,)``."""
    mean = scores.mean(-1)
    if objective == "mean":
        return mean
    if objective == "wco":
        return scores.amin(-1)  # NaN propagates, as in the mean
    if objective == "uwo":
        return mean - uwo_lambda * scores.var(-1, correction=0)
    raise ValueError(f"unknown ensemble objective {objective!r} (mean, wco or uwo)")
