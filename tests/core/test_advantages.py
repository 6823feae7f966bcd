"""GAE, returns and whitening (reference vectors 2-C1, 2-C2, 2-C3, 2-D)."""

from __future__ import annotations

import pytest
import torch

from rlhf.core.advantages import gae, whiten_advantages
from rlhf.core.kl import kl_estimate, kl_shaped_rewards
from rlhf.core.logprobs import INVALID_LOGPROB
from rlhf.core.masked import masked_mean, masked_var, masked_whiten
from rlhf.core.sequences import response_masks, score_index

F64 = torch.float64


def _t(x, dtype=F64) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype)


def whiten(x: torch.Tensor, shift_mean: bool, unbiased: bool) -> torch.Tensor:
    """Whitening over every entry (OAI ``core.whiten``), as `masked_whiten` with nothing masked."""
    return masked_whiten(x, torch.ones_like(x, dtype=torch.bool), shift_mean=shift_mean, unbiased=unbiased)


def _close(actual: torch.Tensor, expected, rtol: float = 1e-9, atol: float = 1e-10) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=rtol, atol=atol)


def _differs(actual: torch.Tensor, expected) -> bool:
    return not torch.allclose(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=1e-4)


# ---- 2-C1: OAI, unmasked ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gamma", "lam", "advantages", "returns"),
    [
        # δ = [0.1+0.4−0.5, −0.2+0.3−0.4, 1.0−0.3] = [0, −0.3, 0.7]; A₁ = −0.3 + 0.95·0.7 = 0.365; A₀ = 0.95·0.365
        (1.0, 0.95, [0.34675, 0.365, 0.7], [0.84675, 0.765, 1.0]),
        (0.99, 0.95, [0.330206675, 0.35535, 0.7], [0.830206675, 0.75535, 1.0]),
        (1.0, 1.0, [0.4, 0.4, 0.7], [0.9, 0.8, 1.0]),  # λ=1: Monte-Carlo return − V
        (1.0, 0.0, [0.0, -0.3, 0.7], [0.5, 0.1, 1.0]),  # λ=0: A = δ
    ],
)
def test_gae_unmasked_c1(gamma, lam, advantages, returns):
    rewards, values = _t([[0.1, -0.2, 1.0]]), _t([[0.5, 0.4, 0.3]])
    out = gae(rewards, values, None, gamma, lam)
    _close(out.advantages, [advantages])
    _close(out.returns, [returns])
    adv, ret = out  # unpacks as a tuple
    assert torch.equal(ret, adv + values)
    # V_T := 0: the last advantage is r − V = 1.0 − 0.3 for every γ, λ (bootstrapping V_T = V_{T−1} would
    # give 1.0 + γ·0.3 − 0.3).
    _close(out.advantages[0, -1], 0.7)


def test_gae_float32_and_no_grad():
    rewards = torch.tensor([[0.1, -0.2, 1.0]])
    values = torch.tensor([[0.5, 0.4, 0.3]], requires_grad=True)
    out = gae(rewards, values, None, 1.0, 0.95)
    assert out.advantages.dtype == torch.float32 and not out.returns.requires_grad
    _close(out.advantages, [[0.34675, 0.365, 0.7]], rtol=1e-6, atol=1e-7)


# ---- 2-C2 / 2-C3: TRL/N+ pipeline on masked rollouts -----------------------------------------------------

POST = torch.tensor([[11, 12, 2, 0, 0], [11, 12, 13, 14, 15]])
LOGPROBS = [[-1.0, -0.5, -0.2, -3.0, -3.0], [-0.7, -0.9, -1.1, -0.6, -0.8]]
REF_LOGPROBS = [[-1.2, -0.4, -0.3, -2.0, -2.0], [-0.9, -1.0, -1.0, -0.6, -1.0]]
VALUES = [[0.1, 0.2, 0.3, 0.4, 0.5], [0.0, -0.1, 0.2, 0.1, 0.3]]
SCORES = [1.0, -0.5]

C2 = {
    "k1": {
        "advantages": [[0.7899125, 0.73675, 0.665, 0.6, 0.0], [-0.4037625625, -0.30922375, -0.636025, -0.5695, -0.81]],
        "returns": [[0.8899125, 0.93675, 0.965, 1.0, 0.0], [-0.4037625625, -0.40922375, -0.436025, -0.4695, -0.51]],
        "whitened_unbiased": [
            [1.2642798832, 1.1858541884, 1.0800080826, 0.0, 0.0],
            [-0.4966379847, -0.357173662, -0.83927317, -0.741135021, -1.0959223166],
        ],
        "whitened_population": [
            [1.3515720448, 1.2677314505, 1.1545772039, 0.0, 0.0],
            [-0.5309283375, -0.3818347053, -0.8972207575, -0.7923066633, -1.1715902357],
        ],
    },
    "k3": {
        "advantages": [
            [0.7982745552, 0.7360116767, 0.6697581291, 0.6, 0.0],
            [-0.3875424685, -0.3016904535, -0.6331037711, -0.5608897108, -0.8009365377],
        ],
        "returns": [
            [0.8982745552, 0.9360116767, 0.9697581291, 1.0, 0.0],
            [-0.3875424685, -0.4016904535, -0.4331037711, -0.4608897108, -0.5009365377],
        ],
        "whitened_unbiased": [
            [1.2700542482, 1.1779207145, 1.0798819856, 0.0, 0.0],
            [-0.4846592407, -0.3576196673, -0.8480287332, -0.7411699318, -1.0963793753],
        ],
        "whitened_population": [
            [1.3577451006, 1.2592502102, 1.1544424005, 0.0, 0.0],
            [-0.5181225214, -0.3823115051, -0.9065808482, -0.7923439845, -1.172078852],
        ],
    },
}


def _c2_rewards(estimator: str, convention: str, dtype=F64):
    masks = response_masks(POST, 0)
    real = ~masks.padding_mask
    logp = _t(LOGPROBS, dtype).masked_fill(masks.padding_mask, INVALID_LOGPROB)
    ref = _t(REF_LOGPROBS, dtype).masked_fill(masks.padding_mask, INVALID_LOGPROB)
    kl = kl_estimate(logp, ref, estimator)
    idx = score_index(masks.sequence_lengths, POST.size(1), convention)
    rewards, _ = kl_shaped_rewards(_t(SCORES, dtype), kl, 0.05, idx, real)
    return rewards, masks


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_gae_c2_trl_convention(estimator):
    expected = C2[estimator]
    rewards, masks = _c2_rewards(estimator, "after_eos")
    values = _t(VALUES)
    out = gae(rewards, values, ~masks.padding_mask_p1, gamma=1.0, lam=0.95)
    # row 0: V₄ (0.5, garbage after the PAD) is zeroed; δ₃ = 1.0 + 0 − 0.4 = 0.6 = A₃, returns₃ = 1.0
    _close(out.advantages, expected["advantages"])
    _close(out.returns, expected["returns"])
    assert values.tolist() == VALUES
    # Wrong mask: ~padding_mask zeroes the first PAD, where the TRL/N+ score sits — the score vanishes.
    assert _differs(gae(rewards, values, ~masks.padding_mask, 1.0, 0.95).advantages, expected["advantages"])
    # No mask: V₄ = 0.5 of row 0 leaks in (δ₃ = 1.0 + 0.5 − 0.4).
    assert _differs(gae(rewards, values, None, 1.0, 0.95).advantages, expected["advantages"])


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_whitened_advantages_c2(estimator):
    expected = C2[estimator]
    rewards, masks = _c2_rewards(estimator, "after_eos")
    adv = gae(rewards, _t(VALUES), ~masks.padding_mask_p1, 1.0, 0.95).advantages
    real = ~masks.padding_mask  # 8 real tokens: 3 + 5
    trl = whiten_advantages(adv, real, unbiased=True)
    nplus = whiten_advantages(adv, real, unbiased=False)
    _close(trl, expected["whitened_unbiased"])
    _close(nplus, expected["whitened_population"])
    # Population vs Bessel differ by sqrt(8/7) at every real token (up to the 1e-8 eps inside the sqrt).
    _close(nplus[real] / trl[real], torch.full((8,), (8 / 7) ** 0.5, dtype=F64), rtol=1e-7)
    # Whitening with the p1 mask (9 entries, includes the PAD's 0.6) gives other numbers.
    assert _differs(whiten_advantages(adv, ~masks.padding_mask_p1, unbiased=True), expected["whitened_unbiased"])


def test_gae_c2_float32():
    rewards, masks = _c2_rewards("k1", "after_eos", torch.float32)
    out = gae(rewards, _t(VALUES, torch.float32), ~masks.padding_mask_p1, 1.0, 0.95)
    _close(out.advantages, C2["k1"]["advantages"], rtol=1e-6, atol=1e-6)
    _close(
        whiten_advantages(out.advantages, ~masks.padding_mask, True),
        C2["k1"]["whitened_unbiased"],
        rtol=1e-5,
        atol=1e-6,
    )


def test_gae_c3_eos_convention():
    rewards, masks = _c2_rewards("k1", "eos")
    out = gae(rewards, _t(VALUES), ~masks.padding_mask, gamma=1.0, lam=0.95)
    # row 0: δ₂ = 0.995 − 0.3 = 0.695; δ₁ = 0.005 + 0.3 − 0.2 = 0.105 → A₁ = 0.105 + 0.95·0.695 = 0.76525
    _close(out.advantages[0], [0.8169875, 0.76525, 0.695, 0.0, 0.0])
    _close(out.returns[0], [0.9169875, 0.96525, 0.995, 0.0, 0.0])
    # row 1 has no room after its last token: both conventions put the score on index 4.
    _close(out.advantages[1], C2["k1"]["advantages"][1])
    _close(out.returns[1], C2["k1"]["returns"][1])
    # Row 0 differs from C2: the TRL placement routes the score through V₃ and one extra λ-discount.
    assert _differs(out.advantages[0], C2["k1"]["advantages"][0])


# ---- 2-D: whitening (functions of rlhf.core.masked) ------------------------------------------------------

X = [[1.2, 1.3, 1.4], [1.5, 1.6, 1.7], [1.8, 1.9, 2.0]]
POPULATION = [
    [0.0508067777, 0.4381050833, 0.8254033889],
    [1.2127016944, 1.6, 1.9872983056],
    [2.3745966111, 2.7618949167, 3.1491932223],
]
UNBIASED = [
    [0.1394066107, 0.504554958, 0.8697033053],
    [1.2348516527, 1.6, 1.9651483473],
    [2.3302966947, 2.695445042, 3.0605933893],
]
SHIFTED = [
    [-1.5491932223, -1.1618949167, -0.7745966111],
    [-0.3872983056, 0.0, 0.3872983056],
    [0.7745966111, 1.1618949167, 1.5491932223],
]


def test_whiten_population_vs_unbiased_vs_shift_mean():
    x = _t(X)
    population = whiten(x, shift_mean=False, unbiased=False)
    unbiased = whiten(x, shift_mean=False, unbiased=True)
    _close(population, POPULATION)  # the TF output printed in the N-blog
    _close(unbiased, UNBIASED)
    _close(whiten(x, shift_mean=True, unbiased=False), SHIFTED)
    assert _differs(population, UNBIASED) and _differs(unbiased, POPULATION)
    _close(population.mean(), 1.6)  # shift_mean=False keeps the mean


def test_masked_whiten_ignores_masked_entries():
    values = _t([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 6.0, 100.0]])
    mask = torch.tensor([[True, True, True, False]] * 2)
    _close(masked_mean(values, mask), 3.5)
    _close(masked_var(values, mask, unbiased=True), 3.5)  # Σ(x−3.5)² = 17.5, /5
    _close(masked_var(values, mask, unbiased=False), 17.5 / 6)
    out = masked_whiten(values, mask, shift_mean=True, unbiased=True)
    _close(out[mask], [-1.3363062077, -0.8017837246, -0.2672612415, 0.2672612415, 0.8017837246, 1.3363062077])
    # masked entries are transformed too: (100 − 3.5)/sqrt(3.5 + 1e-8) = 51.58…
    _close(out[~mask], [96.5 / (3.5 + 1e-8) ** 0.5] * 2)
    _close(whiten_advantages(values, mask, unbiased=True)[~mask], [0.0, 0.0])  # …which whiten_advantages zeroes
    garbage = values.clone()
    garbage[~mask] = -7.0
    _close(masked_whiten(garbage, mask)[mask], out[mask])


def test_masked_var_errors():
    x = _t([[1.0, 2.0]])
    with pytest.raises(ValueError, match="every entry is masked"):
        masked_var(x, torch.tensor([[False, False]]))
    with pytest.raises(ValueError, match="n-1"):
        masked_var(x, torch.tensor([[True, False]]), unbiased=True)
    _close(masked_var(x, torch.tensor([[True, False]]), unbiased=False), 0.0)
    with pytest.raises(ValueError):
        whiten_advantages(x, torch.tensor([[True, False]]), unbiased=True)


# ---- multi-turn: environment tokens skipped ----------------------------------------------------------------


def test_gae_skips_environment_tokens_by_hand():
    """r = [0, ·, ·, 1], V = [0.5, 9, 9, 0.4] with positions 1-2 an environment's: the model's steps are 0 and 3.
    δ₃ = 1 − 0.4 = 0.6 = A₃; δ₀ = 0 + γ·V₃ − V₀ = 0.9·0.4 − 0.5 = −0.14, A₀ = −0.14 + 0.9·0.5·0.6 = 0.13."""
    rewards, values = _t([[0.0, 7.0, 7.0, 1.0]]), _t([[0.5, 9.0, 9.0, 0.4]])
    skip = torch.tensor([[False, True, True, False]])
    advantages, returns = gae(rewards, values, None, gamma=0.9, lam=0.5, skip=skip)
    _close(advantages, [[0.13, 0.0, 0.0, 0.6]])
    _close(returns, [[0.63, 0.0, 0.0, 1.0]])


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.99, 0.9), (0.9, 0.0)])
def test_gae_with_a_skipped_block_equals_gae_without_it(gamma, lam):
    """GAE over an episode whose environment blocks are skipped equals GAE over the model's tokens alone, laid end
    to end (verl's multi-turn GAE), with any mask of padding at the end; float64, so exact to rounding."""
    torch.manual_seed(0)
    B, T = 3, 12
    rewards, values = torch.randn(B, T, dtype=F64), torch.randn(B, T, dtype=F64)
    skip = torch.zeros(B, T, dtype=torch.bool)
    skip[0, 2:5] = skip[1, 1:3] = skip[1, 6:9] = True  # row 2 has none
    lengths = torch.tensor([12, 10, 7])
    mask = torch.arange(T) < lengths[:, None]
    advantages, returns = gae(rewards, values, mask, gamma, lam, skip=skip)
    for b in range(B):
        keep = mask[b] & ~skip[b]
        alone, alone_returns = gae(rewards[b, keep][None], values[b, keep][None], None, gamma, lam)
        _close(advantages[b, keep], alone[0])
        _close(returns[b, keep], alone_returns[0])
        assert (advantages[b, ~keep] == 0).all() and (returns[b, ~keep] == 0).all()


def test_gae_without_skips_is_unchanged():
    torch.manual_seed(1)
    rewards, values = torch.randn(2, 6, dtype=F64), torch.randn(2, 6, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    plain = gae(rewards, values, mask, 0.99, 0.95)
    none_skipped = gae(rewards, values, mask, 0.99, 0.95, skip=torch.zeros(2, 6, dtype=torch.bool))
    _close(plain.advantages, none_skipped.advantages)
    _close(plain.returns, none_skipped.returns)
