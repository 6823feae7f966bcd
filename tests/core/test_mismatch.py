"""The sampler/trainer log-prob mismatch and the truncated importance-sampling weights, against numbers worked
out by hand (float64: the expected values are exact to ~1e-16, so 1e-12 leaves room for exp's rounding)."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.core.mismatch import importance_weights, logprob_mismatch

F64 = torch.float64
# two rows, the second with a padding token whose log-probs are garbage on both sides
TRAINER = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], dtype=F64)
SAMPLER = torch.tensor([[-1.1, -1.5, -0.5], [-0.3, -1.0, 5.0]], dtype=F64)
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_mismatch_by_hand():
    # |trainer − sampler| on the five real tokens: 0.1, 0.5, 0, 0, 0.3
    found = logprob_mismatch(TRAINER, SAMPLER, MASK, threshold=0.2)
    assert found.mean.item() == pytest.approx(0.9 / 5, abs=1e-12)
    assert found.max.item() == pytest.approx(0.5, abs=1e-12)  # not the padding's 5.0
    assert found.share_above.item() == pytest.approx(2 / 5, abs=1e-12)


def test_no_mismatch_when_the_sampler_is_the_trainer():
    found = logprob_mismatch(TRAINER, TRAINER, MASK, threshold=0.0)
    assert found.mean.item() == 0 and found.max.item() == 0 and found.share_above.item() == 0
    for level in ("token", "sequence"):
        for mode in ("truncate", "mask"):
            weights = importance_weights(TRAINER, TRAINER, MASK, level=level, cap=1.0, mode=mode)
            assert torch.equal(weights, torch.ones_like(TRAINER))  # a ratio of exactly 1 is kept at a cap of 1


def test_token_weights_by_hand():
    # trainer − sampler = [[0.1, −0.5, 0], [0, 0.3, (pad) 0]]
    e = math.exp
    truncated = importance_weights(TRAINER, SAMPLER, MASK, level="token", cap=1.2)
    expected = [[e(0.1), e(-0.5), 1.0], [1.0, 1.2, 1.0]]  # e^0.3 = 1.3499 > 1.2 is cut to the cap
    assert torch.allclose(truncated, torch.tensor(expected, dtype=F64), atol=1e-12, rtol=0)
    masked = importance_weights(TRAINER, SAMPLER, MASK, level="token", cap=1.2, mode="mask")
    expected = [[e(0.1), e(-0.5), 1.0], [1.0, 0.0, 1.0]]  # the token past the cap leaves the loss
    assert torch.allclose(masked, torch.tensor(expected, dtype=F64), atol=1e-12, rtol=0)


def test_sequence_weights_by_hand():
    # row sums of trainer − sampler over real tokens: 0.1 − 0.5 + 0 = −0.4 and 0 + 0.3 = 0.3 (padding left out)
    e = math.exp
    truncated = importance_weights(TRAINER, SAMPLER, MASK, level="sequence", cap=1.2)
    expected = [[e(-0.4)] * 3, [1.2] * 3]
    assert torch.allclose(truncated, torch.tensor(expected, dtype=F64), atol=1e-12, rtol=0)
    masked = importance_weights(TRAINER, SAMPLER, MASK, level="sequence", cap=1.2, mode="mask")
    expected = [[e(-0.4)] * 3, [0.0] * 3]  # the whole second row leaves the loss
    assert torch.allclose(masked, torch.tensor(expected, dtype=F64), atol=1e-12, rtol=0)


def test_weights_carry_no_gradient_and_bad_settings_are_refused():
    trainer = TRAINER.clone().requires_grad_(True)
    assert not importance_weights(trainer, SAMPLER, MASK, level="token", cap=2.0).requires_grad
    with pytest.raises(ValueError, match="cap must be > 0"):
        importance_weights(TRAINER, SAMPLER, MASK, level="token", cap=0.0)
    with pytest.raises(ValueError, match="level must be"):
        importance_weights(TRAINER, SAMPLER, MASK, level="row", cap=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mode must be"):
        importance_weights(TRAINER, SAMPLER, MASK, level="token", cap=2.0, mode="clip")  # type: ignore[arg-type]


def test_no_real_token_gives_nan_mean_not_a_silent_zero():
    found = logprob_mismatch(TRAINER, SAMPLER, torch.zeros_like(MASK), threshold=0.2)
    assert math.isnan(found.mean.item()) and found.max.item() == 0 and math.isnan(found.share_above.item())
