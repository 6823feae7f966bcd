"""Loss aggregation is invariant to micro-batching, and masked positions never matter (docs/architecture.md, conventions).

Reference loop: the full batch in one call. Vectorised/split path: the batch cut at random sequence
boundaries, each micro-batch re-padded to its own longest sequence (as a collator would), every call given
the global denominators, results summed — value and gradient must equal the full-batch ones.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.core.losses import LossAggregation, Objective, aggregate, clipped_policy_loss, clipped_value_loss

F64 = torch.float64
GARBAGE = (math.nan, math.inf, -math.inf, 1e30)


def random_batch(seed: int, b: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token values (B, T) and a right-padded mask with lengths in [0, T] (empty rows included)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = torch.arange(t) < lengths.unsqueeze(1)
    return torch.randn(b, t, generator=g, dtype=F64), mask


def with_garbage(x: torch.Tensor, mask: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    junk = torch.tensor(GARBAGE, dtype=x.dtype)[torch.randint(0, len(GARBAGE), x.shape, generator=g)]
    return torch.where(mask, x, junk)


@st.composite
def batches(draw):
    b = draw(st.integers(1, 8))
    t = draw(st.integers(1, 6))
    cuts = sorted(draw(st.sets(st.integers(1, b - 1), max_size=b - 1))) if b > 1 else []
    return draw(st.integers(0, 2**31 - 1)), b, t, [0, *cuts, b]


@pytest.mark.parametrize("mode", list(LossAggregation))
@settings(max_examples=50, deadline=None)
@given(batch=batches())
def test_micro_batches_sum_to_full_batch(mode, batch):
    seed, b, t, bounds = batch
    values, mask = random_batch(seed, b, t)
    values = with_garbage(values, mask, seed + 1)
    denominators = {"num_tokens": int(mask.sum()), "num_seqs": b, "max_len": 16}

    full_in = values.clone().requires_grad_()
    full = aggregate(full_in, mask, mode, **denominators)
    full.backward()

    parts, grads = [], torch.zeros_like(values)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        width = max(int(mask[lo:hi].sum(1).max()), 1)  # re-pad to this micro-batch's longest sequence
        mb_in = values[lo:hi, :width].clone().requires_grad_()
        part = aggregate(mb_in, mask[lo:hi, :width], mode, **denominators)
        part.backward()
        parts.append(part.detach())
        grads[lo:hi, :width] = mb_in.grad

    # Global denominators: with no tokens at all token-mean is 0/0 in both paths.
    torch.testing.assert_close(sum(parts), full.detach(), rtol=1e-12, atol=1e-14, equal_nan=True)
    torch.testing.assert_close(grads, full_in.grad, rtol=1e-12, atol=0, equal_nan=True)
    assert (full_in.grad[~mask] == 0).all()


@pytest.mark.parametrize("mode", list(LossAggregation))
@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_masked_garbage_changes_neither_loss_nor_gradient(mode, seed):
    values, mask = random_batch(seed, 5, 4)
    mask[0, 0] = True  # at least one token, so the default token count is > 0
    clean = torch.where(mask, values, 0.0).requires_grad_()
    dirty = with_garbage(values, mask, seed).requires_grad_()
    a, b = aggregate(clean, mask, mode), aggregate(dirty, mask, mode)
    a.backward()
    b.backward()
    assert torch.equal(a, b)
    assert torch.equal(clean.grad, dirty.grad)
    # a {0, 1} float mask is the same as a bool one
    assert torch.equal(aggregate(dirty.detach(), mask.to(F64), mode), b.detach())


def policy_inputs(seed: int, b: int = 6, t: int = 5):
    g = torch.Generator().manual_seed(seed)
    _, mask = random_batch(seed, b, t)
    mask[0, 0] = True
    logp = -torch.rand(b, t, generator=g, dtype=F64) * 2
    old_logp = logp + 0.3 * torch.randn(b, t, generator=g, dtype=F64)
    adv = torch.randn(b, t, generator=g, dtype=F64)
    ref_logp = logp + 0.2 * torch.randn(b, t, generator=g, dtype=F64)
    return mask, logp, old_logp, adv, ref_logp


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dual=st.sampled_from([None, 3.0]))
def test_policy_loss_ignores_masked_garbage(seed, dual):
    mask, logp, old_logp, adv, ref_logp = policy_inputs(seed)
    outs = []
    for k, make in enumerate([lambda x: x.clone(), lambda x: with_garbage(x, mask, seed + 7)]):
        lp = make(logp).detach().requires_grad_()
        per_token, stats = clipped_policy_loss(
            lp,
            make(old_logp),
            make(adv),
            mask,
            ref_logp=make(ref_logp),
            kl_coef=0.1,
            objective=Objective(clip_high=0.28, dual_clip=dual),
        )
        assert torch.isfinite(per_token).all(), k
        loss = sum(aggregate(per_token, mask, mode, max_len=8) for mode in LossAggregation)
        loss.backward()
        outs.append((per_token.detach(), loss.detach(), lp.grad, stats))
    (pt_a, loss_a, grad_a, stats_a), (pt_b, loss_b, grad_b, stats_b) = outs
    assert torch.equal(pt_a, pt_b)
    assert torch.equal(loss_a, loss_b)
    assert torch.equal(grad_a, grad_b)
    assert (grad_b[~mask] == 0).all()
    assert stats_a.keys() == stats_b.keys()
    for key in stats_a:
        assert torch.equal(stats_a[key], stats_b[key]), key


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), clip=st.sampled_from([None, 0.2]))
def test_value_loss_ignores_masked_garbage(seed, clip):
    mask, values, old_values, returns, _ = policy_inputs(seed)
    outs = []
    for make in (lambda x: x.clone(), lambda x: with_garbage(x, mask, seed + 11)):
        v = make(values).detach().requires_grad_()
        per_token, stats = clipped_value_loss(v, make(old_values), make(returns), mask, clip=clip)
        loss = aggregate(per_token, mask, "token-mean")
        loss.backward()
        outs.append((per_token.detach(), loss.detach(), v.grad, stats["clipfrac"]))
    for x, y in zip(*outs, strict=True):
        assert torch.equal(x, y)
    assert (outs[1][2][~mask] == 0).all()


def test_default_denominators_are_the_batch_own():
    values, mask = random_batch(3, 4, 5)
    mask[0, :2] = True
    for mode in LossAggregation:
        explicit = aggregate(values, mask, mode, num_tokens=int(mask.sum()), num_seqs=4, max_len=5)
        assert torch.equal(aggregate(values, mask, mode), explicit)
