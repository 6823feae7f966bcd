"""Vectorised GAE equals a plain double loop; garbage at masked positions never changes a result."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.core.advantages import gae
from rlhf.core.kl import kl_estimate, kl_shaped_rewards
from rlhf.core.logprobs import INVALID_LOGPROB, selective_log_softmax
from rlhf.core.sequences import response_masks, score_index

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True)


def reference_gae(rewards, values, mask, gamma, lam):
    """Plain Python loops over b and t, on lists; masked positions count as reward 0, value 0, output 0."""
    B, T = len(rewards), len(rewards[0])
    advantages = [[0.0] * T for _ in range(B)]
    returns = [[0.0] * T for _ in range(B)]
    for b in range(B):
        r = [rewards[b][t] if mask[b][t] else 0.0 for t in range(T)]
        v = [values[b][t] if mask[b][t] else 0.0 for t in range(T)]
        last = 0.0
        for t in reversed(range(T)):
            next_value = v[t + 1] if t + 1 < T else 0.0
            delta = r[t] + gamma * next_value - v[t]
            last = delta + gamma * lam * last
            advantages[b][t] = last if mask[b][t] else 0.0
            returns[b][t] = last + v[t] if mask[b][t] else 0.0
    return advantages, returns


def _batch(seed: int, B: int, T: int):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=gen, dtype=torch.float64)
    values = torch.randn(B, T, generator=gen, dtype=torch.float64)
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    mask = torch.arange(T) < lengths.unsqueeze(1)  # prefix mask: real tokens then padding
    return gen, rewards, values, mask


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    B=st.integers(1, 4),
    T=st.integers(1, 9),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    masked=st.booleans(),
)
def test_gae_matches_double_loop(seed, B, T, gamma, lam, masked):
    _, rewards, values, mask = _batch(seed, B, T)
    mask = mask if masked else torch.ones(B, T, dtype=torch.bool)
    adv, ret = gae(rewards, values, mask if masked else None, gamma, lam)
    ref_adv, ref_ret = reference_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(ref_adv, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, torch.tensor(ref_ret, dtype=torch.float64), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 4), T=st.integers(1, 9))
def test_gae_ignores_masked_positions(seed, B, T):
    gen, rewards, values, mask = _batch(seed, B, T)
    noisy_r = torch.where(mask, rewards, torch.randn(B, T, generator=gen, dtype=torch.float64) * 1e3)
    noisy_v = torch.where(mask, values, torch.full((B, T), float("nan"), dtype=torch.float64))
    clean = gae(rewards, values, mask, 1.0, 0.95)
    noisy = gae(noisy_r, noisy_v, mask, 1.0, 0.95)
    assert torch.equal(clean.advantages, noisy.advantages)
    assert torch.equal(clean.returns, noisy.returns)


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    B=st.integers(1, 4),
    T=st.integers(2, 9),
    estimator=st.sampled_from(["k1", "k2", "k3"]),
)
def test_rewards_and_gae_ignore_garbage_after_eos(seed, B, T, estimator):
    """The whole TRL/N+ pipeline: garbage logits/log-probs/values after EOS leave rewards, A and R unchanged."""
    gen = torch.Generator().manual_seed(seed)
    V, PAD, EOS = 6, 0, 1
    post = torch.randint(2, V, (B, T), generator=gen)
    stop_at = torch.randint(0, T + 1, (B,), generator=gen)  # T = no EOS in this row
    post = torch.where(torch.arange(T) == stop_at.unsqueeze(1), EOS, post)
    post = torch.where(torch.arange(T) > stop_at.unsqueeze(1), PAD, post)
    masks = response_masks(post, PAD)
    real, value_real = ~masks.padding_mask, ~masks.padding_mask_p1
    logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64)
    ref_logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64)
    values = torch.randn(B, T, generator=gen, dtype=torch.float64)
    scores = torch.randn(B, generator=gen, dtype=torch.float64)
    idx = score_index(masks.sequence_lengths, T, "after_eos")

    def pipeline(logits, ref_logits, values):
        logp = selective_log_softmax(logits, post).masked_fill(masks.padding_mask, INVALID_LOGPROB)
        ref = selective_log_softmax(ref_logits, post).masked_fill(masks.padding_mask, INVALID_LOGPROB)
        kl = kl_estimate(logp, ref, estimator)
        rewards, _ = kl_shaped_rewards(scores, kl, 0.05, idx, real)
        return kl, rewards, *gae(rewards, values, value_real, 1.0, 0.95)

    pad3 = masks.padding_mask.unsqueeze(-1)
    garbage = torch.randn(B, T, V, generator=gen, dtype=torch.float64) * 50
    noisy = pipeline(
        torch.where(pad3, garbage, logits),
        torch.where(pad3, -garbage, ref_logits),
        torch.where(value_real, values, torch.randn(B, T, generator=gen, dtype=torch.float64) * 1e3),
    )
    for clean_t, noisy_t in zip(pipeline(logits, ref_logits, values), noisy, strict=True):
        assert torch.equal(clean_t, noisy_t)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 4), T=st.integers(1, 9))
def test_kl_shaped_rewards_ignore_masked_kl(seed, B, T):
    gen, _, _, mask = _batch(seed, B, T)
    kl = torch.randn(B, T, generator=gen, dtype=torch.float64)
    scores = torch.randn(B, generator=gen, dtype=torch.float64)
    idx = torch.randint(0, T, (B,), generator=gen)
    noisy_kl = torch.where(mask, kl, torch.full((B, T), float("inf"), dtype=torch.float64))
    clean = kl_shaped_rewards(scores, kl, 0.1, idx, mask)
    noisy = kl_shaped_rewards(scores, noisy_kl, 0.1, idx, mask)
    assert torch.equal(clean[0], noisy[0]) and torch.equal(clean[1], noisy[1])
    # And the scatter equals the plain loop it replaces.
    expected = torch.where(mask, -0.1 * kl, torch.zeros_like(kl))
    for b in range(B):
        expected[b, idx[b]] += scores[b]
    assert torch.equal(clean[0], expected)
