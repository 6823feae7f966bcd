"""Hand-computed vectors for rlhf.core.preference (reference 2-I)."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core.preference import (
    bradley_terry_loss,
    ensemble_reward,
    normalization_gain_bias,
    pairwise_accuracy,
    ranking_loss,
)
from vectors import F64, close, t

# r_c − r_r = [1, 0, −1] → −log σ = [0.3132616875, 0.6931471806 (= log 2), 1.3132616875]
CHOSEN, REJECTED = t([2.0, 0.5, -1.0]), t([1.0, 0.5, 0.0])


def test_bradley_terry_loss_2i():
    loss, stats = bradley_terry_loss(CHOSEN, REJECTED)
    close(loss, 0.7732235185321303)
    close(loss, (math.log1p(math.exp(-1)) + math.log(2) + math.log1p(math.e)) / 3)
    close(stats["accuracy"], 1 / 3)
    close(stats["margin_mean"], 0.0)  # mean([1, 0, −1])
    close(stats["chosen_mean"], 0.5)
    close(stats["rejected_mean"], 0.5)


def test_bradley_terry_margin_2i():
    # margin [0.5, 0, 0] → −log σ(0.5) replaces −log σ(1) for pair 0
    loss, _ = bradley_terry_loss(CHOSEN, REJECTED, margin=t([0.5, 0.0, 0.0]))
    close(loss, 0.8268286174194248)


def test_bradley_terry_center_term_2i():
    # 0.01·mean((r_c + r_r)²) = 0.01·(9 + 1 + 1)/3 = 0.0366666667
    loss, _ = bradley_terry_loss(CHOSEN, REJECTED, center_coef=0.01)
    close(loss, 0.7732235185321303 + 0.03666666666666667)


def test_ranking_loss_with_mean_weights_is_the_pairwise_loss_of_its_pairs():
    # the three pairs above as indices into one reward per answer: answers [2, 1, 0.5, −1, 0]
    rewards = t([2.0, 1.0, 0.5, -1.0, 0.0])
    better, worse = torch.tensor([0, 2, 3]), torch.tensor([1, 2, 4])
    weights = t([1 / 3] * 3)
    margin = t([0.5, 0.0, 0.0])
    loss, stats = ranking_loss(rewards, better, worse, weights, margin, center_coef=0.01)
    close(loss, 0.8268286174194248 + 0.03666666666666667)  # the margin and centre vectors above, summed
    close(stats["correct"], 1.0)
    close(stats["margin_sum"], 0.0)


def test_ranking_loss_weighs_each_prompt_by_the_mean_of_its_pairs():
    # prompt 1 ranks answers [a0 > a1 > a2] with rewards [1, 0, 0]: pairs (0,1) diff 1, (0,2) diff 1, (1,2) diff 0;
    # prompt 2 has one pair (3 > 4) with rewards [0, 2]: diff −2. Prompt weighting: each prompt ½, its pairs
    # averaged: ½·(2·log(1+e⁻¹) + log 2)/3 + ½·log(1+e²)
    rewards = t([1.0, 0.0, 0.0, 0.0, 2.0])
    better, worse = torch.tensor([0, 0, 1, 3]), torch.tensor([1, 2, 2, 4])
    weights = t([1 / 6, 1 / 6, 1 / 6, 1 / 2])
    loss, stats = ranking_loss(rewards, better, worse, weights)
    expected = 0.5 * (2 * math.log1p(math.exp(-1)) + math.log(2)) / 3 + 0.5 * math.log1p(math.exp(2))
    close(loss, expected)
    close(loss, 1.2834090981208848)  # 0.5·1.3196797 / 3 + 0.5·2.1269280
    close(stats["correct"], 2.0)  # (0,1) and (0,2); the tie (1,2) and the reversed pair are wrong
    close(stats["margin_sum"], 0.0)  # 1 + 1 + 0 − 2


def test_pairwise_accuracy_ties_count_wrong_2i():
    acc = pairwise_accuracy(CHOSEN, REJECTED)
    close(acc, 1 / 3)  # only pair 0; the tie (0.5, 0.5) is wrong
    ties_right = (CHOSEN >= REJECTED).to(F64).mean()
    close(ties_right, 2 / 3)
    assert not torch.isclose(acc, ties_right)


def test_normalization_gain_bias_population_2i():
    # samples [1, 2, 3, 6]: mean 3, E[x²] = 50/4 → population std sqrt(12.5 − 9) = sqrt(3.5) = 1.8708286934
    samples = t([1.0, 2.0, 3.0, 6.0])
    gain, bias = normalization_gain_bias(samples)
    close(gain, 1 / math.sqrt(3.5))
    close(gain, 0.5345224838)
    close(bias, -1.6035674515)
    close(gain * samples + bias, [-1.0690449676, -0.5345224838, 0.0, 1.6035674515])
    # wrong variant (unbiased, torch.std default): std sqrt(14/3) = 2.1602468995 → gain 0.4629100499
    gain_u, bias_u = normalization_gain_bias(samples, unbiased=True)
    close(gain_u, 0.4629100499)
    close(bias_u, -1.3887301497)
    assert not torch.isclose(gain, gain_u)


def test_normalization_gain_bias_targets():
    samples = t([1.0, 2.0, 3.0, 6.0])
    gain, bias = normalization_gain_bias(samples, target_mean=2.0, target_std=3.0)
    out = gain * samples + bias
    close(out.mean(), 2.0)
    close(out.std(correction=0), 3.0)


# Three samples scored by M = 3 members; by hand:
#   [1, 2, 3]: mean 2, min 1, population variance ((−1)² + 0 + 1²)/3 = 2/3
#   [0, 0, 0]: mean 0, min 0, variance 0 (the members agree: no penalty)
#   [−1, 2, 5]: mean 2, min −1, variance (9 + 0 + 9)/3 = 6
MEMBERS = t([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [-1.0, 2.0, 5.0]])


def test_ensemble_objectives_by_hand():
    close(ensemble_reward(MEMBERS, "mean"), t([2.0, 0.0, 2.0]))
    close(ensemble_reward(MEMBERS, "wco"), t([1.0, 0.0, -1.0]))
    close(ensemble_reward(MEMBERS, "uwo", uwo_lambda=0.5), t([2.0 - 0.5 * 2 / 3, 0.0, 2.0 - 0.5 * 6]))
    close(ensemble_reward(MEMBERS, "uwo", uwo_lambda=0.0), ensemble_reward(MEMBERS, "mean"))


def test_ensemble_of_one_member_is_that_member_and_an_unscored_member_leaves_the_sample_unscored():
    one = t([[0.7], [-2.0]])
    for objective in ("mean", "wco", "uwo"):
        close(ensemble_reward(one, objective, uwo_lambda=3.0), t([0.7, -2.0]))
        out = ensemble_reward(t([[1.0, math.nan], [1.0, 2.0]]), objective, uwo_lambda=1.0)
        assert out[0].isnan() and not out[1].isnan()
    with pytest.raises(ValueError, match="unknown ensemble objective 'max'"):
        ensemble_reward(MEMBERS, "max")
