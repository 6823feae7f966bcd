"""Generalised advantage estimation (GAE) and advantage whitening for PPO.

Shapes: ``B`` sequences, ``T`` response tokens; ``rewards``, ``values``, ``mask`` are ``(B, T)``; ``mask``
True/1 = a position that counts. Each row is one episode ending at its last column (no done flags).
Checklist items 27-29; vectors 2-C1, 2-C2, 2-C3.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlhf.core.masked import masked_whiten


class AdvantagesReturns(NamedTuple):
    """advantages: (B, T) float — GAE, not whitened. returns: (B, T) float — advantages + values (value targets)."""

    advantages: torch.Tensor
    returns: torch.Tensor


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    gamma: float,
    lam: float,
    skip: torch.Tensor | None = None,
) -> AdvantagesReturns:
    """GAE(γ, λ) by the backward recursion, vectorised over B (Schulman et al. 2016, eq. 16).

        δ_t = r_t + γ·V_{t+1} − V_t,   V_T := 0
        A_t = δ_t + γλ·A_{t+1},        A_T := 0
        R_t = A_t + V_t                (before any whitening of A)

    ``mask``: where it is False, the reward and the value are taken as 0 before the recursion (TRL/N+ zero
    the values at ``padding_mask_p1``, TRL-legacy masks both), and advantages and returns are set to 0
    there. So whatever sits at masked positions never changes a result. Pass ``~padding_mask_p1``
    with the TRL/N+ score placement (the score sits on the first PAD, 2-C2) and ``~padding_mask`` with
    the EOS placement (2-C3); None = every position counts (OAI fixed-length responses, 2-C1).

    ``skip`` (B, T) bool: positions that are not steps of the episode (a multi-turn episode's environment tokens):
    the recursion passes over them, so the step before a skipped block bootstraps from the value after it
    (V_{t+1} and A_{t+1} are the next unskipped position's), as if the block were not there (verl's multi-turn
    GAE); their advantages and returns are 0.

    Outputs carry no gradient (advantages and returns are constants of the update, checklist item 29).
    OAI ``train_policy.py`` L327-336; N+ ``ppo.py`` L693-702; TRL ``ppo_trainer.py`` L787-796.
    """
    if skip is not None:
        mask = ~skip if mask is None else mask.bool() & ~skip
    if mask is not None:
        keep = mask.bool()
        rewards = torch.where(keep, rewards, torch.zeros_like(rewards))
        values = torch.where(keep, values, torch.zeros_like(values))
    length = rewards.size(-1)
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[..., 0])  # V_T := 0
    next_advantage = torch.zeros_like(rewards[..., 0])  # A_T := 0
    for t in reversed(range(length)):
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        advantage = delta + gamma * lam * next_advantage
        value = values[..., t]
        if skip is not None:  # a skipped position carries the next step's value and advantage through
            advantage = torch.where(skip[..., t], next_advantage, advantage)
            value = torch.where(skip[..., t], next_value, value)
        next_advantage, next_value = advantage, value
        advantages[..., t] = advantage  # fills our own output tensor, not an input
    returns = advantages + values
    if mask is not None:
        advantages = torch.where(keep, advantages, torch.zeros_like(advantages))
        returns = torch.where(keep, returns, torch.zeros_like(returns))
    return AdvantagesReturns(advantages, returns)


def whiten_advantages(advantages: torch.Tensor, mask: torch.Tensor, unbiased: bool) -> torch.Tensor:
    """Whiten with mean shift over the real tokens, then 0 at padding.

    Shapes: ``advantages (B, T)``, ``mask (B, T)`` True/1 = real token (``~padding_mask``) → ``(B, T)``.

        A ← (A − μ) / sqrt(σ² + 1e-8)  with μ, σ² over mask;  A ← 0 where not mask

    ``unbiased`` has no default because the sources disagree: TRL/TRL-legacy use Bessel's correction
    (``True``), OAI, N-details and N+ the population variance (``False``) — checklist item 28, vector 2-C2.
    Whiten once per rollout batch (N+/TRL); OAI whitens per minibatch, equal only with one minibatch.
    N+ ``ppo.py`` L703-704; TRL ``ppo_trainer.py`` L797-798.
    """
    keep = mask.bool()
    whitened = masked_whiten(advantages, keep, shift_mean=True, unbiased=unbiased)
    return torch.where(keep, whitened, torch.zeros_like(whitened))
