"""Log-probs with the shift by one and temperature, entropy, selective log-softmax (reference vectors 2-A)."""

from __future__ import annotations

import pytest
import torch

from rlhf.core.logprobs import INVALID_LOGPROB, entropy_from_logits, selective_log_softmax

F64 = torch.float64

# One sequence, C=2 query tokens, T=3 response tokens, V=4. Query ids are arbitrary (never scored).
LOGITS = [
    [0.5, 1.0, -1.0, 0.0],  # pos0: predicts query token 1 (unused)
    [2.0, 0.0, 1.0, -1.0],  # pos1 = C-1: predicts response token 0
    [0.0, 3.0, 1.0, 0.5],  # pos2: predicts response token 1
    [1.0, 1.0, 2.0, 0.0],  # pos3: predicts response token 2
    [4.0, 0.0, 0.0, 0.0],  # pos4: predicts nothing (after the last token)
]
INPUT_IDS = [[3, 3, 0, 1, 2]]
C = 2
CORRECT_T1 = [-0.4401896986, -0.2368155424, -0.626523375]
CORRECT_T07 = [-0.2706738307, -0.0946845894, -0.4296598356]
WRONG_OFF_BY_ONE = [-3.2368155424, -1.626523375, -4.0534904497]
ENTROPY = [0.947536964, 0.7302188265, 1.1644062178]


def _close(actual: torch.Tensor, expected, rtol: float = 1e-9, atol: float = 1e-10) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=rtol, atol=atol)


def _differs(actual: torch.Tensor, expected, atol: float = 1e-3) -> bool:
    return not torch.allclose(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol)


def _data(dtype=F64) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([LOGITS], dtype=dtype), torch.tensor(INPUT_IDS)


def _response(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """The response tokens' log-probs of ``query ⊕ response``: the logits at C−1+t predict token C+t (checklist item
    9), the slice `rlhf.models.policy.score_response_tokens` takes."""
    return selective_log_softmax(logits[:, C - 1 : -1], ids[:, C:], temperature)


def test_response_logprobs_shift_t1():
    logits, ids = _data()
    # pos1 = [2,0,1,-1], token 0: 2 − logsumexp = −log(1 + e^-2 + e^-1 + e^-3) = −log 1.5530 = −0.44019
    _close(_response(logits, ids, 1.0), [CORRECT_T1])


def test_response_logprobs_off_by_one_is_wrong():
    logits, ids = _data()
    # The classic bug: logits[:, C:] paired with input_ids[:, C:] (same position instead of previous one).
    wrong = selective_log_softmax(logits[:, C:], ids[:, C:], temperature=1.0)
    _close(wrong, [WRONG_OFF_BY_ONE])
    assert _differs(wrong, [CORRECT_T1])


def test_response_logprobs_temperature():
    logits, ids = _data()
    _close(_response(logits, ids, 0.7), [CORRECT_T07])
    # Forgetting /T at T=0.7 reproduces the T=1 numbers, which differ from the sampling distribution's.
    no_temperature = _response(logits, ids, 1.0)
    assert _differs(no_temperature, [CORRECT_T07])
    # TRL divides by T + 1e-7; we use T exactly, which the reference vectors distinguish at rtol 1e-9.
    trl_eps = _response(logits, ids, 0.7 + 1e-7)
    assert not torch.allclose(trl_eps, torch.tensor([CORRECT_T07], dtype=F64), rtol=1e-9, atol=0)


def test_response_logprobs_float32():
    logits, ids = _data(torch.float32)
    out = _response(logits, ids, 0.7)
    assert out.dtype == torch.float32
    _close(out, [CORRECT_T07], rtol=1e-6, atol=1e-7)


def test_response_logprobs_reject_a_zero_temperature():
    logits, ids = _data()
    with pytest.raises(ValueError, match="temperature"):
        _response(logits, ids, 0.0)


def test_entropy_vectors():
    logits, ids = _data()
    _close(entropy_from_logits(logits[:, C - 1 : -1]), [ENTROPY])
    # H([1,2,3]) = logsumexp − Σ p·l = 3.4076059644 − 2.5752103826 = 0.8323955818
    _close(entropy_from_logits(torch.tensor([1.0, 2.0, 3.0], dtype=F64)), 0.8323955818399398)
    # TRL's logged proxy −logp(sampled token) is a different quantity from the entropy.
    assert _differs(-_response(logits, ids, 1.0), [ENTROPY])


def test_entropy_matches_categorical_and_temperature():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 17, generator=gen, dtype=F64)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits, chunk_rows=4), expected, rtol=1e-12, atol=1e-12)
    expected_t = torch.distributions.Categorical(logits=logits / 0.7).entropy()
    torch.testing.assert_close(entropy_from_logits(logits, temperature=0.7), expected_t, rtol=1e-12, atol=1e-12)
    # bfloat16 logits (mixed precision) are upcast: a float32 entropy of the rounded logits, to float32's rounding
    half = logits.bfloat16()
    out = entropy_from_logits(half)
    assert out.dtype == torch.float32
    exact = torch.distributions.Categorical(logits=half.double()).entropy()
    torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5)


# float64 in, float64 out; anything else in, float32 out: half-precision logits (bf16 mixed precision) are upcast a
# chunk at a time, so their log-probs are the float32 log-softmax of the rounded logits (float32's 1e-5 tolerance
# at |log p| ≲ 15), not a bfloat16 rounding of it (0.03 nats at log p = -5)
@pytest.mark.parametrize(
    ("dtype", "out_dtype", "tol"),
    [
        (torch.float64, torch.float64, 1e-12),
        (torch.float32, torch.float32, 1e-5),
        (torch.bfloat16, torch.float32, 1e-5),
        (torch.float16, torch.float32, 1e-5),
    ],
)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selective_log_softmax_equals_log_softmax_gather(dtype, out_dtype, tol, temperature):
    gen = torch.Generator().manual_seed(1)
    full = torch.randn(2, 9, 11, generator=gen) * 3
    # A non-viewable slice (like logits[:, C-1:-1]) and chunk_rows=4 exercise chunk boundaries.
    logits = full[:, 1:-1].to(dtype)
    index = torch.randint(0, 11, (2, 7), generator=gen)
    expected = torch.log_softmax(logits.double() / temperature, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    out = selective_log_softmax(logits, index, temperature=temperature, chunk_rows=4)
    assert out.dtype == out_dtype and out.shape == (2, 7)
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)


def test_selective_log_softmax_shapes_and_gradient():
    gen = torch.Generator().manual_seed(3)
    # (V,) with a 0-d index
    v = torch.randn(7, generator=gen, dtype=F64)
    _close(selective_log_softmax(v, torch.tensor(3)), torch.log_softmax(v, -1)[3])
    # gradient equals that of the full log_softmax + gather
    a = torch.randn(2, 3, 5, generator=gen, dtype=F64, requires_grad=True)
    b = a.detach().clone().requires_grad_(True)
    index = torch.randint(0, 5, (2, 3), generator=gen)
    selective_log_softmax(a, index, temperature=0.7, chunk_rows=2).sum().backward()
    torch.log_softmax(b / 0.7, -1).gather(-1, index.unsqueeze(-1)).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="index"):
        selective_log_softmax(a, index[:, :2])


def test_inputs_are_not_modified():
    logits, ids = _data()
    logits_before, ids_before = logits.clone(), ids.clone()
    _response(logits, ids, 0.7)
    entropy_from_logits(logits, temperature=0.7)
    selective_log_softmax(logits.bfloat16(), ids, temperature=0.7)
    assert torch.equal(logits, logits_before) and torch.equal(ids, ids_before)


def test_invalid_logprob_is_one():
    assert INVALID_LOGPROB == 1.0  # checklist item 13: at padding the ratio is 1 and the KL 0


def test_row_chunks_are_views_of_a_sliced_logits_tensor():
    # The memory claim: a logits[:, C-1:-1] slice is walked without a (B, T, V) copy.
    from rlhf.core.logprobs import _row_chunks

    full = torch.randn(3, 8, 5)
    sliced = full[:, 1:-1]
    chunks = list(_row_chunks(sliced, chunk_rows=4))
    assert sum(c.size(0) for c in chunks) == 3 * 6
    assert all(c.untyped_storage().data_ptr() == full.untyped_storage().data_ptr() for c in chunks)
    assert torch.equal(torch.cat(chunks), sliced.reshape(-1, 5))
