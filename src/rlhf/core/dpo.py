"""Offline preference optimisation: the DPO family of losses on sequence log-probabilities.

Shapes: every input is ``(B,)``, one number per preference pair. ``policy_*`` and ``ref_*`` are the summed
log-probabilities of the chosen / rejected response tokens (prompt excluded) under the policy being trained and
under the frozen reference; ``*_lengths`` count those response tokens.

With the log-ratios ``ρ_c = log π(y_c|x) − log π_ref(y_c|x)`` and ``ρ_r`` likewise, the four losses (``sigmoid``:
DPO and cDPO, ``robust``, ``ipo``, ``simpo``), their formulas and papers are docs/dpo.md's table, "The losses";
each branch of `dpo_loss` below is one of its rows.

The implicit rewards reported are ``β·ρ`` (``simpo``: ``β·log π(y)/|y|``); ``accuracy`` is the fraction of pairs
whose chosen reward is strictly higher. Losses are means over the B pairs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf.core.choices import DPOLoss

__all__ = ["DPOLoss", "dpo_loss"]


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    *,
    beta: float,
    loss_type: DPOLoss | str = DPOLoss.SIGMOID,
    label_smoothing: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
    simpo_gamma: float = 0.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The mean loss of ``loss_type`` over the pairs (``weights``: ``Σ_p w_p·loss_p`` instead, e.g. each prompt's
    pairs averaged, then the prompts: docs/rankings.md), and detached stats (see the module docstring). ``ref_*`` may
    be None for ``simpo`` only; ``*_lengths`` are needed by ``ipo`` and ``simpo``. Stats: ``rewards_chosen``,
    ``rewards_rejected``, ``margins`` (their difference) and ``accuracy``, each a mean over the pairs."""
    loss_type = DPOLoss(loss_type)
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if loss_type in (DPOLoss.IPO, DPOLoss.SIMPO) and (chosen_lengths is None or rejected_lengths is None):
        raise ValueError(
            f"loss_type={loss_type.value!r} normalises by length: pass chosen_lengths and rejected_lengths"
        )
    if loss_type == DPOLoss.SIMPO:
        chosen = policy_chosen / chosen_lengths
        rejected = policy_rejected / rejected_lengths
        z = beta * (chosen - rejected) - simpo_gamma
        losses = _smoothed_sigmoid(z, label_smoothing)
    else:
        if ref_chosen is None or ref_rejected is None:
            raise ValueError(f"loss_type={loss_type.value!r} needs the reference log-probs")
        chosen, rejected = policy_chosen - ref_chosen, policy_rejected - ref_rejected
        if loss_type == DPOLoss.IPO:
            h = chosen / chosen_lengths - rejected / rejected_lengths
            losses = (h - 1 / (2 * beta)) ** 2
        else:
            z = beta * (chosen - rejected)
            if loss_type == DPOLoss.SIGMOID:
                losses = _smoothed_sigmoid(z, label_smoothing)
            else:  # robust
                losses = (-(1 - label_smoothing) * F.logsigmoid(z) + label_smoothing * F.logsigmoid(-z)) / (
                    1 - 2 * label_smoothing
                )
    with torch.no_grad():
        rewards_chosen, rewards_rejected = beta * chosen, beta * rejected
        stats = {
            "rewards_chosen": rewards_chosen.mean(),
            "rewards_rejected": rewards_rejected.mean(),
            "margins": (rewards_chosen - rewards_rejected).mean(),
            "accuracy": (rewards_chosen > rewards_rejected).to(rewards_chosen.dtype).mean(),
        }
    return (losses.mean() if weights is None else (weights * losses).sum()), stats


def _smoothed_sigmoid(z: torch.Tensor, epsilon: float) -> torch.Tensor:
    # logsigmoid is stable for large |z| where log(sigmoid(z)) underflows to −inf
    return -(1 - epsilon) * F.logsigmoid(z) - epsilon * F.logsigmoid(-z)
