"""Lengths, padding masks, EOS penalty, score placement (reference vectors 2-B, 2-C)."""

from __future__ import annotations

import pytest
import torch

from rlhf.core.sequences import (
    MissingEosPenalty,
    ScoreConvention,
    first_true_indices,
    penalize_missing_eos,
    response_masks,
    score_index,
)

PAD, EOS = 0, 2
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


def test_missing_eos_penalty_variants():
    scores = torch.tensor([1.0, 0.5], dtype=torch.float64)
    has_eos = (POST == EOS).any(-1)  # [True, False]: row 1 was cut before its stop token
    subtract = penalize_missing_eos(scores, has_eos, "subtract", 1.0)
    replace = penalize_missing_eos(scores, has_eos, MissingEosPenalty.REPLACE, 1.0)
    assert subtract.tolist() == [1.0, -0.5]  # TRL: 0.5 − 1
    assert replace.tolist() == [1.0, -1.0]  # OAI/N+: −1
    assert not torch.equal(subtract, replace)
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
