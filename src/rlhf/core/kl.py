"""KL estimators, KL-shaped per-token rewards, KL-coefficient controllers, and the moving reference.

Shapes: ``B`` sequences, ``T`` response tokens. ``logp`` are the policy's log-probs of the sampled tokens,
``ref_logp`` the reference model's; with ``log r = ref_logp − logp`` (r = π_ref/π_θ, tokens sampled from π_θ):

    k1 = −log r              unbiased, high variance, can be negative
    k2 = ½ (log r)²          biased, low variance
    k3 = (r − 1) − log r     unbiased, ≥ 0, low variance

J. Schulman, "Approximating KL Divergence" (2020); TRL ``ppo_trainer.py`` L771-775 (k1/k3 in the reward),
TRL ``grpo_trainer.py`` L3069-3076 (k3 in the loss). Checklist items 23, 39, 40; vectors 2-C, 2-G, 2-H.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlhf.core.choices import KLControl, KLEstimator


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = −log r = logp − ref_logp. Any shape → same shape. OAI ``train_policy.py`` L149-151, TRL L773."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log r)². Any shape → same shape. Schulman 2020."""
    return 0.5 * (ref_logp - logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = (e^{log r} − 1) − log r. Any shape → same shape. TRL L774-775; GRPO per-token KL L3071-3073. ``expm1``
    computes e^x − 1 without cancellation when log r ≈ 0, the common case near the reference."""
    log_r = ref_logp - logp
    return torch.expm1(log_r) - log_r


KL_ESTIMATORS: dict[KLEstimator, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    KLEstimator.K1: kl_k1,
    KLEstimator.K2: kl_k2,
    KLEstimator.K3: kl_k3,
}


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator | str) -> torch.Tensor:
    """Per-token KL estimate by ``estimator``. Any shape → same shape. Vector 2-G: logp ``[-1, -2, -0.5]``, ref
    ``[-1.5, -1, -0.5]`` → k1 ``[0.5, -1, 0]``, k2 ``[0.125, 0.5, 0]``, k3 ``[0.1065306597, 0.7182818285, 0]``."""
    return KL_ESTIMATORS[KLEstimator(estimator)](logp, ref_logp)


def kl_shaped_rewards(
    scores: torch.Tensor, kl: torch.Tensor, kl_coef: float, score_index: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: a −β·KL penalty on every real token plus the sequence score on one token.

    Shapes: ``scores (B,)``, ``kl (B, T)``, ``score_index (B,)`` long, ``mask (B, T)`` True/1 = real token
    (``~padding_mask``; None = all real) → ``(rewards (B, T), non_score_reward (B, T))``.

        non_score_reward[b, t] = −β · kl[b, t]  where mask, else 0
        rewards = non_score_reward;  rewards[b, score_index[b]] += scores[b]

    The score is added at ``score_index`` even where ``mask`` is False: the TRL/N+ convention puts it on the
    first PAD after EOS (see ``sequences.score_index``). OAI ``train_policy.py`` L149-154 (no mask,
    index T−1); N+ ``ppo.py`` L679-685; TRL ``ppo_trainer.py`` L771-779. Vectors 2-C2, 2-C3, 2-C4.
    """
    non_score_reward = -kl_coef * kl
    if mask is not None:
        # where, not multiply: garbage (even inf/NaN) in kl at padding must not reach the rewards
        non_score_reward = torch.where(mask.bool(), non_score_reward, torch.zeros_like(non_score_reward))
    # Plain loop replaced (out of place, rewards is a new tensor):
    #     for b in range(B): rewards[b, score_index[b]] += scores[b]
    rewards = non_score_reward.scatter_add(
        -1, score_index.long().unsqueeze(-1), scores.to(non_score_reward.dtype).unsqueeze(-1)
    )
    return rewards, non_score_reward


def adaptive_kl_coef(coef: float, observed_kl: float, target: float, horizon: float, n_steps: int) -> float:
    """Proportional controller of Ziegler et al. 2019, eq. (2).

        e = clip(KL_obs / KL_target − 1, −0.2, 0.2);   β ← β · (1 + e · n_steps / horizon)

    ``observed_kl``: mean over the rollout's sequences of Σ_t (logp − ref_logp), before the update;
    ``n_steps``: episodes in the rollout batch (all ranks). Called once per rollout. OAI ``train_policy.py``
    L115-124; TRL-legacy ``trainer/utils.py`` L58-73. Vector 2-H: 0.15, KL 8, n=512 → 0.151536.
    """
    error = min(max(float(observed_kl) / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * n_steps / horizon)


def update_kl_coef(
    kind: KLControl | str, coef: float, observed_kl: float, target: float, horizon: float, n_steps: int
) -> float:
    """Next β from the ``kind`` controller: ``fixed`` keeps it, ``adaptive`` is `adaptive_kl_coef` (its arguments)."""
    if KLControl(kind) is KLControl.FIXED:
        return coef
    return adaptive_kl_coef(coef, observed_kl, target, horizon, n_steps)


@torch.no_grad()
def follow_(reference: list[torch.Tensor], policy: list[torch.Tensor], decay: float) -> None:
    """Move a reference towards the policy, in place: θ_ref ← decay·θ_ref + (1 − decay)·θ for each pair. An exponential
    moving average of the policy as the KL anchor (Xu et al. 2024, "Is DPO superior to PPO for LLM alignment?"; the
    target network of deep Q-learning): the penalty then limits how fast the policy moves, not how far it may ever go
    from the SFT model. The reference may be kept in a lower dtype than the policy (``model.reference_dtype``): the
    average is taken in the reference's dtype."""
    if len(reference) != len(policy):
        raise ValueError(f"follow_: {len(reference)} reference tensors but {len(policy)} policy tensors")
    weight = 1.0 - decay
    for ref, new in zip(reference, policy, strict=True):
        ref.lerp_(new.detach().to(ref.dtype), weight)
