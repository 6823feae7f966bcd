"""KL estimators, KL-shaped rewards and KL controllers (reference vectors 2-G, 2-C2, 2-C3, 2-C4, 2-H)."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core.kl import (
    KLControl,
    KLEstimator,
    adaptive_kl_coef,
    follow_,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_shaped_rewards,
    update_kl_coef,
)
from rlhf.core.logprobs import INVALID_LOGPROB
from rlhf.core.sequences import response_masks, score_index

F64 = torch.float64


def _t(x, dtype=F64) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype)


def _close(actual: torch.Tensor, expected, rtol: float = 1e-9, atol: float = 1e-10) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=rtol, atol=atol)


# ---- 2-G -------------------------------------------------------------------------------------------------

LOGP_G, REF_G = [-1.0, -2.0, -0.5], [-1.5, -1.0, -0.5]  # log r = ref − logp = [−0.5, 1, 0]


def test_kl_estimators_vectors():
    logp, ref = _t(LOGP_G), _t(REF_G)
    _close(kl_estimate(logp, ref, "k1"), [0.5, -1.0, 0.0])  # −log r
    _close(kl_estimate(logp, ref, KLEstimator.K2), [0.125, 0.5, 0.0])  # ½·0.25, ½·1
    # k3: (e^{−0.5} − 1) + 0.5 = 0.1065306597; (e − 1) − 1 = 0.7182818285
    _close(kl_estimate(logp, ref, "k3"), [0.1065306597, 0.7182818285, 0.0])
    assert torch.equal(kl_estimate(logp, ref, "k1"), kl_k1(logp, ref))
    assert torch.equal(kl_estimate(logp, ref, "k2"), kl_k2(logp, ref))
    assert torch.equal(kl_estimate(logp, ref, "k3"), kl_k3(logp, ref))
    # Wrong sign convention (log r = logp − ref) flips k1 and changes k3.
    _close(kl_k1(ref, logp), [-0.5, 1.0, 0.0])
    assert not torch.allclose(kl_k3(ref, logp), kl_k3(logp, ref))
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "k4")


def test_k3_equals_grpo_per_token_kl():
    gen = torch.Generator().manual_seed(0)
    logp, ref = -torch.rand(64, generator=gen, dtype=F64) * 5, -torch.rand(64, generator=gen, dtype=F64) * 5
    grpo = torch.exp(ref - logp) - (ref - logp) - 1  # TRL grpo_trainer L3071-3073
    torch.testing.assert_close(kl_k3(logp, ref), grpo, rtol=1e-12, atol=1e-12)
    assert (kl_k3(logp, ref) >= 0).all()


def test_kl_estimators_gaussian_bias():
    # q = N(0,1) samples, p = N(μ,1): log r = μx − μ²/2, true KL(q‖p) = μ²/2 = 0.5 at μ=1;
    # E[k2] = ½(μ² + μ⁴/4) = 0.625 (bias/true = μ²/4), k1 and k3 unbiased. 2e5 samples: std of the mean ≤ 0.002.
    gen = torch.Generator().manual_seed(0)
    mu, x = 1.0, torch.randn(200_000, generator=gen, dtype=F64)
    logp = -0.5 * x**2
    ref = -0.5 * (x - mu) ** 2
    assert abs(kl_k1(logp, ref).mean().item() - 0.5) < 0.02
    assert abs(kl_k2(logp, ref).mean().item() - 0.625) < 0.02
    assert abs(kl_k3(logp, ref).mean().item() - 0.5) < 0.02


# ---- 2-C2 / 2-C3 / 2-C4 ----------------------------------------------------------------------------------

POST = torch.tensor([[11, 12, 2, 0, 0], [11, 12, 13, 14, 15]])
LOGPROBS = [[-1.0, -0.5, -0.2, -3.0, -3.0], [-0.7, -0.9, -1.1, -0.6, -0.8]]
REF_LOGPROBS = [[-1.2, -0.4, -0.3, -2.0, -2.0], [-0.9, -1.0, -1.0, -0.6, -1.0]]
SCORES = [1.0, -0.5]  # after missing_eos_penalty=1 (subtract)
KL_COEF = 0.05
KL_K1 = [[0.2, -0.1, 0.1, 0.0, 0.0], [0.2, 0.1, -0.1, 0.0, 0.2]]
KL_K3 = [
    [0.0187307531, 0.0051709181, 0.004837418, 0.0, 0.0],
    [0.0187307531, 0.004837418, 0.0051709181, 0.0, 0.0187307531],
]
REWARDS_K1 = [[-0.01, 0.005, -0.005, 1.0, 0.0], [-0.01, -0.005, 0.005, 0.0, -0.51]]
REWARDS_K3 = [
    [-0.0009365377, -0.0002585459, -0.0002418709, 1.0, 0.0],
    [-0.0009365377, -0.0002418709, -0.0002585459, 0.0, -0.5009365377],
]


def _c2_kl(estimator: str, dtype=F64) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token KL with INVALID_LOGPROB at padding (checklist item 13), and the real-token mask."""
    masks = response_masks(POST, 0)
    real = ~masks.padding_mask
    logp = _t(LOGPROBS, dtype).masked_fill(masks.padding_mask, INVALID_LOGPROB)
    ref = _t(REF_LOGPROBS, dtype).masked_fill(masks.padding_mask, INVALID_LOGPROB)
    return kl_estimate(logp, ref, estimator), real


@pytest.mark.parametrize(
    ("estimator", "kl_expected", "rewards_expected"), [("k1", KL_K1, REWARDS_K1), ("k3", KL_K3, REWARDS_K3)]
)
def test_kl_shaped_rewards_trl_convention(estimator, kl_expected, rewards_expected):
    kl, real = _c2_kl(estimator)
    _close(kl, kl_expected)
    seq = response_masks(POST, 0).sequence_lengths  # [2, 4]
    idx = score_index(seq, 5, "after_eos")  # [3, 4]
    scores = _t(SCORES)
    rewards, non_score = kl_shaped_rewards(scores, kl, KL_COEF, idx, real)
    # row 0: −0.05·[0.2, −0.1, 0.1] = [−0.01, 0.005, −0.005], score 1.0 on the first PAD (index 3)
    _close(rewards, rewards_expected)
    _close(non_score, -KL_COEF * torch.as_tensor(kl_expected, dtype=F64))
    assert scores.tolist() == SCORES  # inputs untouched
    # Score on the wrong token (EOS convention) gives different rewards.
    wrong, _ = kl_shaped_rewards(scores, kl, KL_COEF, score_index(seq, 5, "eos"), real)
    assert not torch.allclose(wrong, torch.as_tensor(rewards_expected, dtype=F64))


def test_kl_shaped_rewards_float32():
    kl, real = _c2_kl("k1", torch.float32)
    idx = torch.tensor([3, 4])
    rewards, _ = kl_shaped_rewards(torch.tensor(SCORES), kl, KL_COEF, idx, real)
    assert rewards.dtype == torch.float32
    _close(rewards, REWARDS_K1, rtol=1e-6, atol=1e-7)


def test_kl_objective_stats():
    # objective/kl = kl.sum(1).mean(): k1 (0.2 + 0.3)/2 = 0.3 (row0 0.2, row1 0.4); k3 0.0381044657.
    kl1, real = _c2_kl("k1")
    kl3, _ = _c2_kl("k3")
    _close(kl1.sum(1).mean(), 0.3)
    _close(kl3.sum(1).mean(), 0.038104465728580006)
    _, non_score = kl_shaped_rewards(_t(SCORES), kl1, KL_COEF, torch.tensor([3, 4]), real)
    _close(non_score.sum(1).mean(), -0.015)
    _, non_score3 = kl_shaped_rewards(_t(SCORES), kl3, KL_COEF, torch.tensor([3, 4]), real)
    _close(non_score3.sum(1).mean(), -0.0019052232864290005)
    # Without the INVALID_LOGPROB fill, padding (−3 vs −2 → kl −1, twice) leaks into the statistic.
    raw = kl_estimate(_t(LOGPROBS), _t(REF_LOGPROBS), "k1")
    _close(raw.sum(1).mean(), 0.3 - 1.0)


def test_kl_shaped_rewards_eos_convention_c3():
    kl, real = _c2_kl("k1")
    idx = score_index(response_masks(POST, 0).sequence_lengths, 5, "eos")  # [2, 4]
    rewards, _ = kl_shaped_rewards(_t(SCORES), kl, KL_COEF, idx, real)
    # row 0: −0.005 + 1.0 = 0.995 on the EOS itself
    _close(rewards, [[-0.01, 0.005, 0.995, 0.0, 0.0], [-0.01, -0.005, 0.005, 0.0, -0.51]])


def test_kl_shaped_rewards_oai_c4():
    kl = _t([[-0.3315, -0.0426, 0.6351]])
    rewards, non_score = kl_shaped_rewards(_t([0.4]), kl, 0.15, torch.tensor([2]))  # OAI: last token, no mask
    # −0.15·[−0.3315, −0.0426, 0.6351] = [0.049725, 0.00639, −0.095265]; +0.4 on the last → 0.304735
    _close(rewards, [[0.049725, 0.00639, 0.304735]])
    _close(non_score, [[0.049725, 0.00639, -0.095265]])
    # The N-blog's sign slip (+β·kl) would give [−0.049725, −0.00639, 0.495265].
    _close(-(-0.15 * kl) + _t([[0.0, 0.0, 0.4]]), [[-0.049725, -0.00639, 0.495265]])
    assert not torch.allclose(rewards, -(-0.15 * kl) + _t([[0.0, 0.0, 0.4]]))


def test_kl_shaped_rewards_mask_blocks_non_finite_kl():
    kl = _t([[0.2, float("nan"), float("inf")]])
    mask = torch.tensor([[True, False, False]])
    rewards, non_score = kl_shaped_rewards(_t([1.0]), kl, 0.1, torch.tensor([1]), mask)
    _close(rewards, [[-0.02, 1.0, 0.0]])
    assert torch.isfinite(non_score).all()


# ---- 2-H -------------------------------------------------------------------------------------------------


def test_adaptive_kl_sequence():
    # e = clip(8/6 − 1, ±0.2) = 0.2 → 0.15·(1 + 0.2·512/1e4) = 0.15·1.01024 = 0.151536
    coef = 0.15
    expected = [(8.0, 0.151536), (3.0, 0.1499842714), (6.6, 0.1507521908), (6.0, 0.1507521908)]
    for observed, new in expected:
        coef = adaptive_kl_coef(coef, observed, target=6.0, horizon=10_000, n_steps=512)
        assert math.isclose(coef, new, rel_tol=1e-9)
    # Without the ±0.2 clip the first step would be 0.15·(1 + (1/3)·0.0512) = 0.15256.
    unclipped = 0.15 * (1 + (8.0 / 6.0 - 1) * 512 / 10_000)
    assert not math.isclose(adaptive_kl_coef(0.15, 8.0, 6.0, 10_000, 512), unclipped, rel_tol=1e-6)


def test_adaptive_kl_trl_legacy_defaults():
    # e = 7.2/6 − 1 = 0.2 (at the clip) → 0.2·(1 + 0.2·128/1e4) = 0.200512
    assert math.isclose(update_kl_coef("adaptive", 0.2, 7.2, 6.0, 10_000, 128), 0.200512, rel_tol=1e-9)
    assert math.isclose(adaptive_kl_coef(0.2, torch.tensor(7.2), 6.0, 10_000, 128), 0.200512, rel_tol=1e-6)


def test_fixed_kl_unchanged():
    assert update_kl_coef("fixed", 0.05, 100.0, 6.0, 10_000, 512) == 0.05
    assert update_kl_coef(KLControl.FIXED, 0.05, 100.0, 6.0, 10_000, 512) == 0.05
    assert update_kl_coef("adaptive", 0.05, 100.0, 6.0, 10_000, 512) != 0.05


# ---- the moving reference -------------------------------------------------------------------------------------


def test_follow_moves_the_reference_a_fraction_of_the_way():
    # decay 0.75: 0.75·1 + 0.25·3 = 1.5, 0.75·2 + 0.25·(−2) = 1.0, 0.75·(−4) + 0.25·0 = −3.0 (exact in binary)
    reference, policy = [_t([1.0, 2.0]), _t([[-4.0]])], [_t([3.0, -2.0]), _t([[0.0]])]
    follow_(reference, policy, decay=0.75)
    assert reference[0].tolist() == [1.5, 1.0] and reference[1].tolist() == [[-3.0]]
    assert policy[0].tolist() == [3.0, -2.0]  # the policy is read, never written
    # a bfloat16 reference (model.reference_dtype) of a float32 policy stays bfloat16: 0.5·1 + 0.5·3 = 2
    low = [torch.ones(1, dtype=torch.bfloat16)]
    follow_(low, [torch.tensor([3.0])], decay=0.5)
    assert low[0].dtype == torch.bfloat16 and low[0].tolist() == [2.0]
    with pytest.raises(ValueError, match="2 reference tensors but 1"):
        follow_(reference, policy[:1], decay=0.5)
