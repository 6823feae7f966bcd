"""Hand-computed vectors for rlhf.core.dpo: every loss of the DPO family, and which way its gradient pushes.

Two pairs, β = 0.5 (IPO too). Policy log-probs: chosen [−1, −5], rejected [−3, −4]; reference [−2, −4.5] for
both. Log-ratios ρ_c = [1, −0.5], ρ_r = [−1, 0.5], so z = β(ρ_c − ρ_r) = [1, −0.5].
Per pair a_i = −log σ(z_i) = log(1 + e^(−z_i)): a = [0.3132616875182228, 0.9740769841801067], and since
log(1 + e^z) − log(1 + e^(−z)) = z, −log σ(−z_i) = a_i + z_i.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core.dpo import DPOLoss, dpo_loss
from vectors import close, t

POLICY_C, POLICY_R = t([-1.0, -5.0]), t([-3.0, -4.0])
REF_C, REF_R = t([-2.0, -4.5]), t([-2.0, -4.5])
LEN_C, LEN_R = t([2.0, 5.0]), t([4.0, 1.0])
A = [math.log1p(math.exp(-1.0)), math.log1p(math.exp(0.5))]
Z = [1.0, -0.5]


def loss(kind, **kwargs):
    return dpo_loss(POLICY_C, POLICY_R, REF_C, REF_R, beta=kwargs.pop("beta", 0.5), loss_type=kind,
                    chosen_lengths=LEN_C, rejected_lengths=LEN_R, **kwargs)  # fmt: skip


def test_sigmoid_is_dpo():
    value, stats = loss("sigmoid")
    close(value, (A[0] + A[1]) / 2)  # 0.6436693358491648
    close(value, 0.6436693358491648)
    # implicit rewards β·ρ: chosen [0.5, −0.25], rejected [−0.5, 0.25]
    close(stats["rewards_chosen"], 0.125)
    close(stats["rewards_rejected"], -0.125)
    close(stats["margins"], 0.25)
    close(stats["accuracy"], 0.5)  # pair 2's chosen reward is lower


def test_weights_sum_the_weighted_pair_losses():
    # each pair its own prompt of a step of 2: weights ½ give the mean; weights [0.25, 0.75] give
    # 0.25·log(1 + e⁻¹) + 0.75·log(1 + e^0.5) = 0.0783154222 + 0.7305577378 = 0.8088731600
    value, stats = loss("sigmoid", weights=t([0.5, 0.5]))
    close(value, 0.6436693358491648)
    value, stats = loss("sigmoid", weights=t([0.25, 0.75]))
    close(value, 0.25 * A[0] + 0.75 * A[1])
    close(value, 0.8088731600146358)
    close(stats["margins"], 0.25)  # stats stay plain means over the pairs


def test_label_smoothing_is_conservative_dpo():
    # (1 − ε)·a + ε·(a + z) = a + ε·z → mean 0.6436693358 + 0.1·(1 − 0.5)/2 = 0.6686693358
    value, _ = loss("sigmoid", label_smoothing=0.1)
    close(value, 0.6686693358491648)


def test_robust():
    # ((1 − ε)·a − ε·(a + z)) / (1 − 2ε) = a − ε·z/(1 − 2ε) = a − z/8 → 0.6436693358 − 0.5/16 = 0.6124193358
    value, _ = loss("robust", label_smoothing=0.1)
    close(value, 0.6124193358491648)
    close(loss("robust")[0], loss("sigmoid")[0])  # ε = 0: plain DPO


def test_ipo_normalises_by_length():
    # h = ρ_c/|y_c| − ρ_r/|y_r| = [1/2 + 1/4, −0.5/5 − 0.5/1] = [0.75, −0.6]; target 1/(2β) = 1
    # (h − 1)² = [0.0625, 2.56] → 1.31125
    value, stats = loss("ipo")
    close(value, 1.31125)
    close(stats["margins"], 0.25)  # rewards are β·ρ, as for DPO


def test_simpo_needs_no_reference_and_subtracts_its_margin():
    # β = 2, γ = 0.5: log π/|y|: chosen [−0.5, −1], rejected [−0.75, −4]; z = 2·[0.25, 3] − 0.5 = [0, 5.5]
    value, stats = dpo_loss(POLICY_C, POLICY_R, None, None, beta=2.0, loss_type="simpo", simpo_gamma=0.5,
                            chosen_lengths=LEN_C, rejected_lengths=LEN_R)  # fmt: skip
    close(value, (math.log(2) + math.log1p(math.exp(-5.5))) / 2)
    close(stats["rewards_chosen"], -1.5)  # β·[−0.5, −1]
    close(stats["rewards_rejected"], -4.75)  # β·[−0.75, −4]
    close(stats["accuracy"], 1.0)


@pytest.mark.parametrize("kind", list(DPOLoss))
def test_the_gradient_pushes_chosen_up_and_rejected_down(kind):
    chosen, rejected = POLICY_C.clone().requires_grad_(), POLICY_R.clone().requires_grad_()
    value, _ = dpo_loss(chosen, rejected, REF_C, REF_R, beta=0.5, loss_type=kind, label_smoothing=0.1,
                        chosen_lengths=LEN_C, rejected_lengths=LEN_R)  # fmt: skip
    value.backward()
    # gradient descent moves against the gradient: log π(chosen) rises, log π(rejected) falls (for IPO: while
    # h is below its target 1/(2β), as in both pairs here; above it, IPO pulls the pair back)
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all(), (chosen.grad, rejected.grad)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="label_smoothing"):
        loss("sigmoid", label_smoothing=0.5)
    with pytest.raises(ValueError, match="lengths"):
        dpo_loss(POLICY_C, POLICY_R, REF_C, REF_R, beta=0.5, loss_type="ipo")
    with pytest.raises(ValueError, match="reference"):
        dpo_loss(POLICY_C, POLICY_R, None, None, beta=0.5)
    assert (
        dpo_loss(POLICY_C.float(), POLICY_R.float(), REF_C.float(), REF_R.float(), beta=0.5)[0].dtype == torch.float32
    )
