"""Hand-computed vectors for rlhf.core.group (reference 2-J, 2-L; rloo, reinforce_pp, gdpo by hand)."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core.group import (
    GROUP_ESTIMATORS,
    GroupEstimator,
    dapo_overlong_penalty,
    dr_grpo_advantages,
    gdpo_advantages,
    group_advantages,
    groups_with_signal,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    sum_rewards,
    token_advantages,
)
from vectors import F64, close, t

NAN = math.nan


# 2-J: 3 prompts × G = 4; group mean [0.5, 0.5, 1]; unbiased std [1/√3, 1/√6, 0]
J = t([[1.0, 0.0, 0.0, 1.0], [0.0, 0.5, 1.0, 0.5], [1.0, 1.0, 1.0, 1.0]])


def test_grpo_group_scale_2j():
    # 0.5/(0.5773502692 + 1e-4) = 0.8658754298; 0.5/(0.4082482905 + 1e-4) = 1.2244449449
    a, b = 0.8658754298, 1.2244449449
    close(grpo_advantages(J), [[a, -a, -a, a], [-b, 0, b, 0], [0, 0, 0, 0]])
    close(group_advantages(J, "grpo", scale="group", eps=1e-4), grpo_advantages(J))


def test_grpo_std_is_bessel_corrected_2j():
    # wrong variant: population std 0.5 → 0.5/(0.5 + 1e-4) = 0.9998
    population = (J - J.mean(1, keepdim=True)) / (J.std(1, correction=0, keepdim=True) + 1e-4)
    assert not torch.isclose(grpo_advantages(J)[0, 0], population[0, 0])


def test_grpo_eps_2j():
    # understand-r1-zero: ÷(std + 1e-8) → 0.8660253888, 1.2247448414
    a, b = 0.8660253888, 1.2247448414
    adv = grpo_advantages(J, eps=1e-8)
    close(adv, [[a, -a, -a, a], [-b, 0, b, 0], [0, 0, 0, 0]])
    assert not torch.isclose(adv[0, 0], grpo_advantages(J)[0, 0], rtol=1e-9, atol=0)  # 1e-4 default differs


def test_grpo_batch_scale_2j():
    # one unbiased std of all 12 rewards = 0.4438126823; 0.5/(0.4438126823 + 1e-4) = 1.1263476353
    c = 1.1263476353
    close(grpo_advantages(J, scale="batch"), [[c, -c, -c, c], [-c, 0, c, 0], [0, 0, 0, 0]])


def test_grpo_none_and_dr_grpo_2j():
    centred = [[0.5, -0.5, -0.5, 0.5], [-0.5, 0, 0.5, 0], [0, 0, 0, 0]]
    close(grpo_advantages(J, scale="none"), centred)
    close(dr_grpo_advantages(J), centred)  # no eps: exactly r − mean
    close(group_advantages(J, GroupEstimator.DR_GRPO), centred)


def test_grpo_nan_rewards_are_unscorable():
    # row 0: valid [1, 0, 1]: mean 2/3, Bessel var (1/9 + 4/9 + 1/9)/2 = 1/3
    # row 1: one valid sample → no spread → 0;  row 2: nothing valid → 0
    r = t([[1.0, NAN, 0.0, 1.0], [NAN, 2.0, NAN, NAN], [NAN, NAN, NAN, NAN]])
    s = math.sqrt(1 / 3) + 1e-4
    want = [[(1 / 3) / s, 0, (-2 / 3) / s, (1 / 3) / s], [0, 0, 0, 0], [0, 0, 0, 0]]
    close(grpo_advantages(r), want)
    assert torch.isfinite(grpo_advantages(r, scale="batch")).all()
    close(grpo_advantages(r, scale="none"), [[1 / 3, 0, -2 / 3, 1 / 3], [0, 0, 0, 0], [0, 0, 0, 0]])


def test_rloo_hand_computed():
    # baseline_j = (Σ r − r_j)/(G − 1). Row 0 (Σ 2): 1 − 1/3 = 2/3, 0 − 2/3 = −2/3.
    # Row 1 (Σ 2): 0 − 2/3, 0.5 − 1.5/3 = 0, 1 − 1/3 = 2/3, 0. Row 2: 1 − 1 = 0.
    w = 2 / 3
    adv = rloo_advantages(J)
    close(adv, [[w, -w, -w, w], [-w, 0, w, 0], [0, 0, 0, 0]])
    close(adv, 4 / 3 * dr_grpo_advantages(J))  # = G/(G−1)·(r − mean)
    assert not torch.isclose(adv[0, 0], dr_grpo_advantages(J)[0, 0])  # wrong: baseline includes itself → 0.5


def test_rloo_nan_and_group_size():
    # n = 3 scored samples [1, ·, 0, 1], Σ = 2: baseline_j = (2 − r_j)/2
    # r_0 = 1: 1 − 0.5 = 0.5;  r_2 = 0: 0 − 1 = −1;  r_3 = 1: 0.5;  the NaN sample gets 0
    close(rloo_advantages(t([[1.0, NAN, 0.0, 1.0]])), [[0.5, 0.0, -1.0, 0.5]])
    with pytest.raises(ValueError, match="group_size"):
        rloo_advantages(t([[1.0], [2.0]]))


def test_reinforce_pp_is_group_centred_then_batch_whitened():
    # c = r − mean_g = [[.5,−.5,−.5,.5], [−.5,0,.5,0], [0,0,0,0]]; mean(c) = 0;
    # population Var(c) = (6·0.25)/12 = 0.125 → A = c/sqrt(0.125 + 1e-8) ≈ ±1.41421351
    a = 0.5 / math.sqrt(0.125 + 1e-8)
    adv = reinforce_pp_advantages(J)
    close(adv, [[a, -a, -a, a], [-a, 0, a, 0], [0, 0, 0, 0]])
    close(group_advantages(J, "reinforce_pp"), adv)
    # wrong variant: unbiased variance 1.5/11 → 0.5/sqrt(0.13636) ≈ 1.354
    assert not torch.isclose(adv[0, 0], t(0.5 / math.sqrt(1.5 / 11 + 1e-8)))
    # unlike grpo, the scale is one for the batch: rows 0 and 1 get the same magnitude
    assert adv[0, 0] == adv[1, 2]


def test_reinforce_pp_ignores_nan():
    r = t([[1.0, 0.0, NAN], [3.0, 1.0, 2.0]])
    # c over valid: [.5, −.5, ·, 1, −1, 0]; Var = (0.25·2 + 1 + 1)/5 = 0.5
    s = math.sqrt(0.5 + 1e-8)
    close(reinforce_pp_advantages(r), [[0.5 / s, -0.5 / s, 0.0], [1 / s, -1 / s, 0.0]])


def test_estimator_registry_covers_every_name():
    assert set(GROUP_ESTIMATORS) == set(GroupEstimator)
    assert [e.value for e in GroupEstimator] == ["grpo", "dr_grpo", "rloo", "reinforce_pp"]
    with pytest.raises(ValueError):
        group_advantages(J, "ppo")


# ---------------------------------------------------------------- GDPO vs sum
# Prompt 0: r1 (correctness, scale 1) = [1, 0, 1, 0]; r2 (format, scale 10) = [10, 10, 0, 0].
# Prompt 1: constant rewards (1, 10) → zero advantage from both.
# Per reward: a = 0.5/(1/√3 + 1e-4) ≈ 0.86588, b = 5/(10/√3 + 1e-4) ≈ 0.86601
#   A1 = [a, −a, a, −a], A2 = [b, b, −b, −b]; S = A1 + A2 = [a+b, b−a, a−b, −a−b, 0, 0, 0, 0]
#   mean S = 0; unbiased var = (2(a+b)² + 2(a−b)²)/7 = 4(a² + b²)/7 → A = S/(sqrt(·) + 1e-4)
#   ≈ [1.8706, 0.0001, −0.0001, −1.8706, 0, 0, 0, 0]
GDPO_R = t([[[1.0, 10.0], [0.0, 10.0], [1.0, 0.0], [0.0, 0.0]], [[1.0, 10.0], [1.0, 10.0], [1.0, 10.0], [1.0, 10.0]]])


def test_gdpo_hand_computed():
    a = 0.5 / (1 / math.sqrt(3) + 1e-4)
    b = 5 / (10 / math.sqrt(3) + 1e-4)
    s = math.sqrt(4 * (a * a + b * b) / 7) + 1e-4
    want = [[(a + b) / s, (b - a) / s, (a - b) / s, -(a + b) / s], [0, 0, 0, 0]]
    close(gdpo_advantages(GDPO_R, t([1.0, 1.0])), want)


def test_gdpo_differs_from_sum_then_normalise():
    gdpo = gdpo_advantages(GDPO_R, t([1.0, 1.0]))
    # sum first: [11, 10, 1, 0], mean 5.5, unbiased std sqrt(101/3) ≈ 5.802 → [0.948, 0.776, −0.776, −0.948]:
    # the scale-10 format reward decides; sample 1 (wrong answer, good format) gets +0.78 and sample 2
    # (right answer, bad format) −0.78. GDPO gives both ≈ 0: one reward up, one down.
    summed = grpo_advantages(sum_rewards(GDPO_R, t([1.0, 1.0])))
    s = math.sqrt(101 / 3) + 1e-4
    close(summed[0], [5.5 / s, 4.5 / s, -4.5 / s, -5.5 / s])
    assert abs(gdpo[0, 1]) < 1e-3 and abs(gdpo[0, 2]) < 1e-3
    assert summed[0, 1] > 0.7 and summed[0, 2] < -0.7


def test_gdpo_weights_and_all_nan_samples():
    # weight 0 on the format reward: S = A1 = [a, −a, a, −a, 0, 0, 0, 0] → ±a/(sqrt(4a²/7) + 1e-4)
    a = 0.5 / (1 / math.sqrt(3) + 1e-4)
    v = a / (math.sqrt(4 * a * a / 7) + 1e-4)
    close(gdpo_advantages(GDPO_R, t([1.0, 0.0])), [[v, -v, v, -v], [0, 0, 0, 0]])
    r = GDPO_R.clone()
    r[1, 0] = NAN  # one sample of the constant prompt is unscorable: 0, and out of the batch statistics
    adv = gdpo_advantages(r, t([1.0, 1.0]))
    assert adv[1, 0] == 0
    b = 5 / (10 / math.sqrt(3) + 1e-4)
    s = math.sqrt(4 * (a * a + b * b) / 6) + 1e-4  # 7 valid samples → n − 1 = 6
    close(adv[0], [(a + b) / s, (b - a) / s, (a - b) / s, -(a + b) / s])


def test_sum_rewards_nan_handling():
    r = t([[[1.0, 10.0], [0.0, NAN], [NAN, NAN]]])
    close(sum_rewards(r, t([1.0, 0.5])), [[6.0, 0.0, NAN]])


# ---------------------------------------------------------------- 2-L: DAPO overlong penalty
def test_dapo_overlong_penalty_2l():
    # expected = 20480 − 4096 = 16384; 18432 → −2048/4096 = −0.5; 20480 → −1
    close(dapo_overlong_penalty(torch.tensor([16000, 16384, 18432, 20480]), 20480, 4096).to(F64), [0, 0, -0.5, -1])
    # max 10, buffer 4: expected 6; 7 → −0.25, 8 → −0.5, 10 → −1
    close(dapo_overlong_penalty(t([5, 6, 7, 8, 10]), 10, 4), [0, 0, -0.25, -0.5, -1])
    close(dapo_overlong_penalty(t([8]), 10, 4, factor=2.0), [-1.0])


def test_groups_with_signal():
    assert groups_with_signal(J).tolist() == [True, True, False]
    r = t([[1.0, NAN, 1.0], [NAN, NAN, NAN], [0.0, NAN, 1.0]])
    assert groups_with_signal(r).tolist() == [False, False, True]


# token_advantages: one group of G = 2, T = 3; row 0 has 3 real tokens, row 1 has 2 (its last column is not in
# the loss). Rewards [1, 0]: dr_grpo centres them to [0.5, −0.5]; grpo divides by the group std √0.5.
TOKEN_MASK = torch.tensor([[True, True, True], [True, True, False]])
TOKEN_KL = t([[0.1, 0.2, 0.0], [0.0, 0.1, 9.0]])  # the 9 sits outside the mask and must not count
LAST = torch.tensor([2, 1])  # the last real token of each row


def test_token_advantages_broadcast_the_sequence_advantage():
    advantages = token_advantages(t([1.0, 0.0]), TOKEN_MASK, 2, "dr_grpo")
    assert advantages.tolist() == [[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]]
    grpo = token_advantages(t([1.0, 0.0]), TOKEN_MASK, 2, "grpo", scale="group", eps=0.0)
    s = 1 / math.sqrt(0.5)  # (r − mean) / std: ±0.5 / √0.5
    # a mean, a std of two float64 numbers and one division: a few ulp of values near 0.7
    torch.testing.assert_close(grpo, t([[0.5 * s] * 3, [-0.5 * s, -0.5 * s, 0.0]]), rtol=0, atol=1e-15)


def test_token_advantages_with_the_kl_in_the_reward():
    """β = 0.5: token rewards −β·KL plus the sequence advantage at the last real token, summed to the end.
    row 0: [−0.05, −0.1, 0 + 0.5] → to go [0.35, 0.4, 0.5]
    row 1: [0, −0.05 − 0.5, ·] → [−0.55, −0.55, 0]"""
    advantages = token_advantages(t([1.0, 0.0]), TOKEN_MASK, 2, "dr_grpo", kl=TOKEN_KL, kl_coef=0.5, score_index=LAST)
    # each entry is a sum of ≤ 3 float64 terms: a few ulp
    torch.testing.assert_close(advantages, t([[0.35, 0.4, 0.5], [-0.55, -0.55, 0.0]]), rtol=0, atol=1e-15)


def test_token_advantages_reinforce_pp_whitens_the_token_returns():
    """REINFORCE++ with the KL in the reward: centred like dr_grpo, then the five returns above are whitened
    (population variance): mean 0.03, deviations [0.32, 0.37, 0.47, −0.58, −0.58], variance 1.133 / 5."""
    advantages = token_advantages(
        t([1.0, 0.0]), TOKEN_MASK, 2, "reinforce_pp", kl=TOKEN_KL, kl_coef=0.5, score_index=LAST
    )
    std = math.sqrt(1.133 / 5 + 1e-8)  # masked_whiten's eps
    expected = t([[0.32, 0.37, 0.47], [-0.58, -0.58, 0.0]]) / std
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-14)  # a mean and a variance of 5 terms


def test_token_advantages_need_the_score_index_with_kl():
    with pytest.raises(ValueError, match="score_index"):
        token_advantages(t([1.0, 0.0]), TOKEN_MASK, 2, "grpo", kl=TOKEN_KL, kl_coef=0.5)
