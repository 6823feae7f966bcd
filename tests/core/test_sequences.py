"""Truncation, lengths, padding masks, EOS penalty, score placement (reference vectors 2-B, 2-C)."""

from __future__ import annotations

import pytest
import torch

from rlhf.core.sequences import (
    MissingEosPenalty,
    ScoreConvention,
    contains_stop,
    first_true_indices,
    penalize_missing_eos,
    replace_missing_eos_score,
    response_masks,
    reward_token_indices,
    score_index,
    subtract_missing_eos_penalty,
    truncate_after_stop,
)

PAD, EOS = 0, 2
RESPONSES = torch.tensor([[11, 12, 2, 7, 8], [11, 12, 13, 14, 15]])
POST = torch.tensor([[11, 12, 2, 0, 0], [11, 12, 13, 14, 15]])
T = 5


def test_first_true_indices():
    bools = torch.tensor([[False, False, True, True], [True, False, False, True], [False] * 4])
    assert first_true_indices(bools).tolist() == [2, 0, 4]  # none → T (TRL convention)
    assert first_true_indices(POST == PAD).tolist() == [3, 5]  # vector 2-B
    assert first_true_indices(bools).dtype == torch.long


def test_first_true_indices_matches_loop():
    gen = torch.Generator().manual_seed(0)
    bools = torch.rand(16, 7, generator=gen) < 0.15
    expected = [next((t for t in range(7) if row[t]), 7) for row in bools.tolist()]
    assert first_true_indices(bools).tolist() == expected


def test_truncate_after_stop_keeps_the_stop_token():
    responses_before = RESPONSES.clone()
    post = truncate_after_stop(RESPONSES, EOS, PAD)
    assert torch.equal(post, POST)
    assert post[0, 2] == EOS  # kept: truncating at `>=` instead of `>` would drop the EOS the RM reads
    assert torch.equal(RESPONSES, responses_before)


def test_truncate_after_stop_oai_start():
    # OAI truncate_after=2, token 13: the 13 at index 1 is ignored, the one at index 3 truncates (vector 2-B).
    responses = torch.tensor([[5, 13, 7, 13, 9, 9], [5, 13, 7, 8, 9, 9]])
    post = truncate_after_stop(responses, 13, -1, start=2)
    assert post.tolist() == [[5, 13, 7, 13, -1, -1], [5, 13, 7, 8, 9, 9]]
    assert contains_stop(post, 13, start=2).tolist() == [True, False]
    # Without `start`, row 1 would be cut after its first token and counted as valid.
    assert truncate_after_stop(responses, 13, -1).tolist() != post.tolist()
    assert contains_stop(post, 13).tolist() == [True, True]


def test_response_masks():
    masks = response_masks(POST, PAD)
    assert masks.sequence_lengths.tolist() == [2, 4]  # first PAD [3, 5] − 1
    assert masks.padding_mask.dtype == torch.bool
    assert masks.padding_mask.int().tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]
    assert masks.padding_mask_p1.int().tolist() == [[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]]
    # The two masks differ exactly on the first PAD after EOS (where the TRL/N+ score sits).
    assert (masks.padding_mask & ~masks.padding_mask_p1).nonzero().tolist() == [[0, 3]]


def test_response_masks_edge_rows():
    post = torch.tensor([[PAD, PAD, PAD], [7, 8, 9]])  # empty response; no PAD at all
    masks = response_masks(post, PAD)
    assert masks.sequence_lengths.tolist() == [-1, 2]
    assert masks.padding_mask.int().tolist() == [[1, 1, 1], [0, 0, 0]]
    assert masks.padding_mask_p1.int().tolist() == [[0, 1, 1], [0, 0, 0]]


def test_contains_stop():
    assert contains_stop(POST, EOS).tolist() == [True, False]


def test_missing_eos_penalty_variants():
    scores = torch.tensor([1.0, 0.5], dtype=torch.float64)
    has_eos = contains_stop(POST, EOS)
    subtract = penalize_missing_eos(scores, has_eos, "subtract", 1.0)
    replace = penalize_missing_eos(scores, has_eos, MissingEosPenalty.REPLACE, 1.0)
    assert subtract.tolist() == [1.0, -0.5]  # TRL: 0.5 − 1
    assert replace.tolist() == [1.0, -1.0]  # OAI/N+: −1
    assert not torch.equal(subtract, replace)
    assert torch.equal(subtract, subtract_missing_eos_penalty(scores, has_eos, 1.0))
    assert torch.equal(replace, replace_missing_eos_score(scores, has_eos, 1.0))
    assert scores.tolist() == [1.0, 0.5]
    with pytest.raises(ValueError):
        penalize_missing_eos(scores, has_eos, "mask", 1.0)
    with pytest.raises(ValueError, match=">= 0"):
        penalize_missing_eos(scores, has_eos, "replace", -1.0)


@pytest.mark.parametrize("kind", ["replace", "subtract"])
def test_missing_eos_penalty_leaves_unscored_samples_unscored(kind):
    scores = torch.tensor([float("nan"), float("nan"), 2.0])
    has_eos = torch.tensor([True, False, False])
    penalized = penalize_missing_eos(scores, has_eos, kind, 0.5)
    assert penalized[:2].isnan().all()
    assert penalized[2].item() == (-0.5 if kind == "replace" else 1.5)


def test_score_index_conventions():
    seq = response_masks(POST, PAD).sequence_lengths  # [2, 4]
    after_eos = score_index(seq, T, "after_eos")
    eos = score_index(seq, T, ScoreConvention.EOS)
    assert after_eos.tolist() == [3, 4]  # row 0: first PAD after EOS; row 1: no room → last token
    assert eos.tolist() == [2, 4]
    assert after_eos.tolist() != eos.tolist()
    # Empty response (seq_len = −1): both give a valid index.
    empty = torch.tensor([-1])
    assert score_index(empty, T, "after_eos").tolist() == [0]
    assert score_index(empty, T, "eos").tolist() == [0]


def test_reward_token_indices():
    qr = torch.tensor([[0, 21, 22, 11, 12, 2, 0, 0], [21, 22, 23, 11, 12, 13, 14, 15]])
    idx = reward_token_indices(qr, context_length=3, pad_token_id=PAD)
    assert idx.tolist() == [5, 7]  # first PAD in response [3, 5] − 1 + C
    assert qr[torch.arange(2), idx].tolist() == [2, 15]  # the EOS, the last token
    # Off by one (no −1, the GPT-NeoX #1285 bug class) would read a PAD in row 0.
    assert qr[0, idx[0] + 1] == PAD
    # The query's own left padding must not count: searching the whole sequence would find index 0.
    assert first_true_indices(qr == PAD)[0] - 1 == -1
