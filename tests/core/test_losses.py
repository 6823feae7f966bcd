"""Hand-computed vectors for rlhf.core.losses (cases 2-E, 2-F, 2-K; the arithmetic is in the comments below)."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core.losses import (
    LossAggregation,
    Objective,
    aggregate,
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
)
from vectors import F64, close, t

# ---------------------------------------------------------------- 2-E: clipped surrogate, clipfrac, approx-KL
# A = [1, −1, 0.5, −0.5, 2], ρ = [1.5, 1.5, 0.7, 0.7, 1.1], ε = 0.2
# pg1 = −Aρ = [−1.5, 1.5, −0.35, 0.35, −2.2]; pg2 = −A·clip(ρ, 0.8, 1.2) = [−1.2, 1.2, −0.4, 0.4, −2.2]
# max = [−1.2, 1.5, −0.35, 0.4, −2.2] → mean −1.85/5 = −0.37
E_A = t([[1.0, -1.0, 0.5, -0.5, 2.0]])
E_RATIO = t([[1.5, 1.5, 0.7, 0.7, 1.1]])
E_MASK = torch.ones(1, 5, dtype=torch.bool)


def e_loss(mask=E_MASK, clipped=True, is_weights=None, ref_logp=None, kl_coef=0.0, **objective):
    return clipped_policy_loss(
        torch.log(E_RATIO),
        torch.zeros_like(E_RATIO),
        E_A,
        mask,
        objective=Objective(**objective),
        clipped=clipped,
        is_weights=is_weights,
        ref_logp=ref_logp,
        kl_coef=kl_coef,
    )


def test_pg_loss_2e():
    per_token, stats = e_loss()
    close(per_token, [[-1.2, 1.5, -0.35, 0.4, -2.2]])
    close(aggregate(per_token, E_MASK, LossAggregation.TOKEN_MEAN), -0.37)
    close(stats["approx_kl"], 0.05923219694280594)  # ½·mean(log ρ²)


def test_clipfrac_is_pg2_gt_pg1_not_cleanrl_2e():
    _, stats = e_loss()
    # pg2 > pg1 at tokens 0 (−1.2 > −1.5) and 3 (0.4 > 0.35) → 2/5
    close(stats["clipfrac"], 0.4)
    cleanrl = ((E_RATIO - 1).abs() > 0.2).to(F64).mean()  # |ρ−1| > ε at tokens 0,1,2,3 → 0.8
    close(cleanrl, 0.8)
    assert not torch.isclose(stats["clipfrac"], cleanrl)
    cleanrl_k3 = ((E_RATIO - 1) - torch.log(E_RATIO)).mean()  # CleanRL approx_kl = 0.0614218984
    assert not torch.isclose(stats["approx_kl"], cleanrl_k3)


def test_masked_pg_loss_2e():
    mask = t([[1, 1, 1, 1, 0]]).bool()
    per_token, stats = e_loss(mask)
    # (−1.2 + 1.5 − 0.35 + 0.4)/4 = 0.35/4 = 0.0875; clipfrac 2/4
    close(aggregate(per_token, mask, "token-mean"), 0.0875)
    close(stats["clipfrac"], 0.5)
    assert per_token[0, 4] == 0
    unmasked_mean = per_token.mean()  # wrong: dividing by all 5 tokens → 0.07
    assert not torch.isclose(unmasked_mean, t(0.0875))


def test_clip_higher_2e():
    per_token, _ = e_loss(clip_high=0.28)
    # token 0: A > 0, clip at 1.28 → −1.28; the negative-advantage tokens still clip at 0.8
    close(per_token, [[-1.28, 1.5, -0.35, 0.4, -2.2]])
    close(aggregate(per_token, E_MASK, "token-mean"), -0.386)


def test_unclipped_warm_up_loss_is_minus_a_rho_2e():
    # clipped=False (warmup_pg_steps): ℓ = pg1 = −Aρ = [−1.5, 1.5, −0.35, 0.35, −2.2] → mean −2.2/5 = −0.44
    per_token, stats = e_loss(clipped=False)
    close(per_token, [[-1.5, 1.5, -0.35, 0.35, -2.2]])
    close(aggregate(per_token, E_MASK, "token-mean"), -0.44)
    close(stats["clipfrac"], 0.4)  # where the clip would have acted: the same stats as the clipped loss
    unclipped_dual, _ = e_loss(clipped=False, dual_clip=1.2)  # token 1: A < 0, −c·A = 1.2 < 1.5, not applied
    close(unclipped_dual, per_token)


def test_unclipped_gradient_is_reinforce_at_ratio_one():
    # At ρ = 1, ∂ℓ/∂logp = −A·ρ = −A per token: REINFORCE with the advantages as baseline-subtracted returns.
    # At ρ = 1.5 the clipped loss is flat where A > 0 (−A·1.2 beats −A·1.5), the unclipped one is not:
    # ∂(−Aρ)/∂logp = −Aρ = [−1.5, 1.5, −0.75]; clipped: [0, 1.5, 0] (A < 0 takes the unclipped branch).
    adv = t([[1.0, -1.0, 0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    logp = torch.zeros(1, 3, dtype=F64, requires_grad=True)
    per_token, _ = clipped_policy_loss(logp, torch.zeros(1, 3, dtype=F64), adv, mask, clipped=False)
    per_token.sum().backward()
    close(logp.grad, [[-1.0, 1.0, -0.5]])
    logp = torch.log(t([[1.5, 1.5, 1.5]])).requires_grad_()
    for clipped, expected in ((True, [[0.0, 1.5, 0.0]]), (False, [[-1.5, 1.5, -0.75]])):
        logp.grad = None
        per_token, _ = clipped_policy_loss(logp, torch.zeros(1, 3, dtype=F64), adv, mask, clipped=clipped)
        per_token.sum().backward()
        close(logp.grad, expected)


# ---------------------------------------------------------------- 2-K: GRPO loss aggregation
# lengths [2, 4, 3], L_max = 4, A = [0.8, −0.5, 0.3] (one per sequence), ref − logp as below.
K_RATIO = t([[1.0, 1.3, 1.0, 1.0], [0.9, 0.7, 1.1, 1.25], [1.25, 0.75, 1.0, 1.0]])
K_MASK = torch.arange(4) < torch.tensor([2, 4, 3]).unsqueeze(1)
K_A = t([0.8, -0.5, 0.3])
K_REF_MINUS_LOGP = t([[0.1, -0.2, 0.0, 0.0], [0.0, 0.3, -0.1, 0.05], [-0.05, 0.2, 0.0, 0.0]])


def k3(d: torch.Tensor) -> torch.Tensor:
    # Schulman k3 with log r = ref − logp: exp(d) − d − 1 (TRL grpo_trainer L3071-3073)
    return torch.exp(d) - d - 1


def k_loss(clip_high=None, beta=0.0):
    logp = torch.log(K_RATIO)
    ref_logp = logp + K_REF_MINUS_LOGP if beta else None
    return clipped_policy_loss(
        logp,
        torch.zeros_like(K_RATIO),
        K_A,
        K_MASK,
        ref_logp=ref_logp,
        kl_coef=beta,
        objective=Objective(clip_high=clip_high),
    )


K_SETTINGS = {
    # (ε_high, β): per-token loss, [grpo, dapo, dr_grpo (L=4), seq-mean-token-sum, dr_grpo (L=8)]
    (None, 0.0): (
        [[-0.8, -0.96, 0, 0], [0.45, 0.4, 0.55, 0.625], [-0.36, -0.225, -0.3, 0]],
        [-0.2229166667, -0.0688888889, -0.0516666667, -0.2066666667, -0.0258333333],
    ),
    (0.28, 0.0): (
        [[-0.8, -1.024, 0, 0], [0.45, 0.4, 0.55, 0.625], [-0.375, -0.225, -0.3, 0]],
        [-0.2352500000, -0.0776666667, -0.0582500000, -0.2330000000, -0.0291250000],
    ),
    (None, 0.04): (
        [
            [-0.7997931633, -0.9592507699, 0, 0],
            [0.45, 0.4019943523, 0.5501934967, 0.6250508439],
            [-0.359950823, -0.2241438897, -0.3, 0],
        ],
        [-0.2224701770, -0.0684333281, -0.0513249961, -0.2052999843, -0.0256624980],
    ),
}


@pytest.mark.parametrize(("clip_high", "beta"), list(K_SETTINGS))
def test_grpo_loss_types_2k(clip_high, beta):
    # Hand check, ε = 0.2, β = 0: row sums −1.76, 2.025, −0.885 (Σ = −0.62)
    #   grpo = (−1.76/2 + 2.025/4 − 0.885/3)/3 = −0.22291…; dapo = −0.62/9; dr_grpo = −0.62/(3·4);
    #   seq-mean-token-sum = −0.62/3; dr_grpo with L_max = 8: −0.62/24.
    table, expected = K_SETTINGS[(clip_high, beta)]
    per_token, _ = k_loss(clip_high, beta)
    close(per_token, table)
    got = [
        aggregate(per_token, K_MASK, LossAggregation.SEQ_MEAN_TOKEN_MEAN),
        aggregate(per_token, K_MASK, LossAggregation.TOKEN_MEAN),
        aggregate(per_token, K_MASK, LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM),
        aggregate(per_token, K_MASK, LossAggregation.SEQ_MEAN_TOKEN_SUM),
        aggregate(per_token, K_MASK, LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM, max_len=8),
    ]
    for value, want in zip(got, expected, strict=True):
        close(value, want)


def test_kl_term_changes_loss_and_is_logged_2k():
    (no_kl, _), (with_kl, stats) = k_loss(beta=0.0), k_loss(beta=0.04)
    assert not torch.allclose(no_kl, with_kl)
    close(stats["kl"], k3(K_REF_MINUS_LOGP)[K_MASK].mean())


@pytest.mark.parametrize(
    ("clip_high", "low", "high", "region"), [(None, 1 / 9, 2 / 9, 3 / 9), (0.28, 1 / 9, 1 / 9, 2 / 9)]
)
def test_clip_ratios_2k(clip_high, low, high, region):
    # low: ρ < 0.8 with A < 0 → row 1 token 1 (0.7). high: ρ > 1+ε_high with A > 0 → 1.3 (row 0) and 1.25
    # (row 2) for ε_high = 0.2; only 1.3 for 0.28. Row 1's 1.25 has A < 0: not clipped (it is "low" side).
    _, stats = k_loss(clip_high)
    close(stats["clip_ratio/low"], low)
    close(stats["clip_ratio/high"], high)
    close(stats["clip_ratio/region"], region)


def test_per_token_gradient_weights_2k():
    # ∂loss/∂ℓ_{i,t}: grpo 1/(G·|o_i|) = [1/6, 1/12, 1/9]; dapo 1/Σ|o| = 1/9; dr_grpo 1/(G·L_max) = 1/12
    want = {
        LossAggregation.SEQ_MEAN_TOKEN_MEAN: t([1 / 6, 1 / 12, 1 / 9]).unsqueeze(1).expand(3, 4),
        LossAggregation.TOKEN_MEAN: torch.full((3, 4), 1 / 9, dtype=F64),
        LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM: torch.full((3, 4), 1 / 12, dtype=F64),
        LossAggregation.SEQ_MEAN_TOKEN_SUM: torch.full((3, 4), 1 / 3, dtype=F64),
    }
    for mode, weight in want.items():
        per_token = torch.zeros(3, 4, dtype=F64, requires_grad=True)
        aggregate(per_token, K_MASK, mode).backward()
        close(per_token.grad, torch.where(K_MASK, weight, 0.0))


def test_trl_2995_sanity():
    # ρ = 1, β = 0, zero-mean A = [0.5, −0.5, 0], lengths [2, 4, 3]: per-token loss = −A
    # grpo: (−0.5 + 0.5 + 0)/3 = 0; dapo: (2·(−0.5) + 4·0.5 + 0)/9 = 1/9 (unequal lengths)
    logp = torch.zeros(3, 4, dtype=F64, requires_grad=True)
    per_token, stats = clipped_policy_loss(logp, logp.detach(), t([0.5, -0.5, 0.0]), K_MASK)
    close(stats["clipfrac"], 0.0)
    close(stats["approx_kl"], 0.0)
    grpo = aggregate(per_token, K_MASK, "seq-mean-token-mean")
    close(grpo, 0.0)
    close(aggregate(per_token, K_MASK, "token-mean"), 1 / 9)
    grpo.backward()
    assert logp.grad.abs().sum() > 0  # zero loss, non-zero gradient


def test_sequence_advantages_broadcast_equal_per_token():
    per_seq, _ = k_loss()
    per_tok, _ = clipped_policy_loss(
        torch.log(K_RATIO), torch.zeros_like(K_RATIO), K_A.unsqueeze(1).expand(3, 4), K_MASK
    )
    close(per_seq, per_tok)


# ---------------------------------------------------------------- dual clip (Ye et al. 2020)
def test_dual_clip_hand_computed():
    # A = [−1, −1, 1], ρ = [5, 1.1, 5], ε = 0.2, c = 3
    # token 0: max(−Aρ, −A·clip) = max(5, 1.2) = 5 → capped at −c·A = 3
    # token 1: max(1.1, 1.1) = 1.1 < 3 → 1.1;  token 2 (A > 0): max(−5, −1.2) = −1.2, never capped
    ratio = t([[5.0, 1.1, 5.0]])
    logp = torch.log(ratio).requires_grad_()
    mask = torch.ones(1, 3, dtype=torch.bool)
    per_token, stats = clipped_policy_loss(
        logp, torch.zeros_like(ratio), t([[-1.0, -1.0, 1.0]]), mask, objective=Objective(dual_clip=3.0)
    )
    close(per_token, [[3.0, 1.1, -1.2]])
    close(stats["clip_ratio/dual"], 1 / 3)
    plain, _ = clipped_policy_loss(torch.log(ratio), torch.zeros_like(ratio), t([[-1.0, -1.0, 1.0]]), mask)
    close(plain, [[5.0, 1.1, -1.2]])
    # wrong variant: capping positive advantages too would give min(−1.2, −3) = −3 at token 2
    assert per_token[0, 2] != -3.0
    per_token.sum().backward()
    # capped token and clipped token 2 are constants in logp; token 1: ∂(ρ)/∂logp = ρ = 1.1
    close(logp.grad, [[0.0, 1.1, 0.0]])


def test_importance_weights_scale_the_surrogate_not_the_kl_term():
    # 2-E's tokens with w = [1, 2, 0.5, 0, 3] (the sampler/trainer correction) and a KL term: ℓ = w·max(pg1, pg2) + β·k3
    # surrogate [−1.2, 1.5, −0.35, 0.4, −2.2] · w = [−1.2, 3.0, −0.175, 0, −6.6]; with ref = logp, k3 = 0 → as is
    weights = t([[1.0, 2.0, 0.5, 0.0, 3.0]])
    per_token, _ = e_loss(is_weights=weights)
    close(per_token, [[-1.2, 3.0, -0.175, 0.0, -6.6]])
    # ref − logp = −log ρ; k3 = exp(−log ρ) + log ρ − 1 = 1/ρ + log ρ − 1, added unweighted (TRL's order)
    logp = torch.log(E_RATIO)
    with_kl, _ = e_loss(is_weights=weights, ref_logp=torch.zeros_like(logp), kl_coef=0.5)
    k3 = 1 / E_RATIO + logp - 1
    close(with_kl, t([[-1.2, 3.0, -0.175, 0.0, -6.6]]) + 0.5 * k3)


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="dual_clip"):
        e_loss(dual_clip=1.0)


# ---------------------------------------------------------------- 2-F: clipped value loss
F_V, F_VOLD, F_R = t([[1.0, 0.0, 0.5]]), t([[0.5, 0.5, 0.5]]), t([[1.2, -1.0, 0.45]])
F_MASK = torch.ones(1, 3, dtype=torch.bool)


def test_value_loss_clip_2f():
    # V_clip = [0.7, 0.3, 0.5]; vf1 = (V−R)² = [0.04, 1, 0.0025]; vf2 = (V_clip−R)² = [0.25, 1.69, 0.0025]
    # ½·mean(max) = ½·(0.25 + 1.69 + 0.0025)/3 = 0.32375; vf2 > vf1 at 2 of 3 (tie at token 2 is not)
    per_token, stats = clipped_value_loss(F_V, F_VOLD, F_R, F_MASK, clip=0.2)
    close(per_token, [[0.125, 0.845, 0.00125]])
    close(aggregate(per_token, F_MASK, "token-mean"), 0.32375)
    close(stats["clipfrac"], 2 / 3)
    ties_count = ((torch.clamp(F_V, F_VOLD - 0.2, F_VOLD + 0.2) - F_R) ** 2 >= (F_V - F_R) ** 2).to(F64).mean()
    assert not torch.isclose(stats["clipfrac"], ties_count)  # ≥ would give 1


def test_value_loss_unclipped_2f():
    per_token, stats = clipped_value_loss(F_V, F_VOLD, F_R, F_MASK, clip=None)
    close(aggregate(per_token, F_MASK, "token-mean"), 0.17375)  # ½·(0.04 + 1 + 0.0025)/3
    close(stats["clipfrac"], 0.0)


def test_total_loss_2e_2f():
    pg, _ = e_loss()
    vf, _ = clipped_value_loss(F_V, F_VOLD, F_R, F_MASK)
    total = aggregate(pg, E_MASK, "token-mean") + 0.1 * aggregate(vf, F_MASK, "token-mean")
    close(total, -0.337625)  # −0.37 + 0.1·0.32375


# ---------------------------------------------------------------- explained variance
def test_explained_variance_hand_computed():
    # R − V = [0.2, −1, −0.05]: 3·SS = 3·1.0425 − 0.85² = 2.405; R: 3·SS = 3·2.6425 − 0.65² = 7.505
    # EV = 1 − 2.405/7.505 = 5.1/7.505 ≈ 0.6795470
    close(explained_variance(F_V, F_R, F_MASK), 5.1 / 7.505)
    close(explained_variance(F_R, F_R, F_MASK), 1.0)
    mask = t([[1, 1, 0]]).bool()
    garbage_v = t([[1.0, 0.0, math.nan]])
    # masked: R − V = [0.2, −1]: SS = 0.72; R: SS = 2.42 → 1 − 0.72/2.42
    close(explained_variance(garbage_v, F_R, mask), 1 - 0.72 / 2.42)
    assert torch.isnan(explained_variance(F_V, t([[1.0, 1.0, 1.0]]), F_MASK))


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError):
        aggregate(t([[1.0]]), F_MASK[:, :1], "grpo")
