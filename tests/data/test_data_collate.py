"""Collation: left padding for generation, right padding for training, position ids from the mask."""

from __future__ import annotations

import pytest
import torch

from rlhf.data import (
    IGNORE_INDEX,
    TokenizedPreference,
    TokenizedSFT,
    collate_preferences,
    collate_sft,
    left_pad,
    position_ids_from_mask,
    right_pad,
)

PAD = 0
SEQS = [[5, 6, 7], [8], [9, 10]]


def test_left_pad():
    ids, mask = left_pad(SEQS, PAD)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 9, 10]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert ids.dtype == mask.dtype == torch.long


def test_right_pad():
    ids, mask = right_pad(SEQS, PAD)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]


def test_mask_comes_from_lengths_not_from_pad_id():
    # A real token equal to the pad id (e.g. a user's tokenizer with pad at id 0 in the text) stays attended.
    ids, mask = left_pad([[PAD, 5], [6]], PAD)
    assert mask.tolist() == [[1, 1], [0, 1]]


def test_empty_batch_is_refused():
    with pytest.raises(ValueError, match="empty batch"):
        left_pad([], PAD)


def _position_ids_loop(mask: torch.Tensor) -> torch.Tensor:
    """The plain loop `position_ids_from_mask` replaces."""
    pos = torch.zeros_like(mask)
    for b in range(mask.shape[0]):
        seen = 0
        for t in range(mask.shape[1]):
            seen += int(mask[b, t])
            pos[b, t] = max(seen - 1, 0)
    return pos


def test_position_ids_left_padded():
    _, mask = left_pad(SEQS, PAD)
    pos = position_ids_from_mask(mask)
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 1]]
    # Every row's real tokens get 0, 1, 2, ... — the positions they would have unpadded (checklist item 2).
    for row, n in zip(pos, map(len, SEQS), strict=True):
        assert row[-n:].tolist() == list(range(n))
    # On real tokens it equals the exclusive cumsum `cumsum(mask) - mask`.
    exclusive = mask.cumsum(-1) - mask
    assert torch.equal(pos[mask.bool()], exclusive[mask.bool()])


def test_position_ids_match_the_loop():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (16,), generator=gen).tolist()
    for pad in (left_pad, right_pad):
        _, mask = pad([[1] * n for n in lengths], PAD)
        assert torch.equal(position_ids_from_mask(mask), _position_ids_loop(mask))


def test_collate_sft_pads_labels_with_ignore_index():
    batch = collate_sft(
        [TokenizedSFT("s:1", [5, 6, 7], [IGNORE_INDEX, 6, 7]), TokenizedSFT("s:2", [8, 9], [IGNORE_INDEX, 9])], PAD
    )
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 9, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch.labels.tolist() == [[IGNORE_INDEX, 6, 7], [IGNORE_INDEX, 9, IGNORE_INDEX]]


def test_collate_preferences_common_length():
    eos = 2
    batch = collate_preferences(
        [
            TokenizedPreference("r:1", [5, 6], [7, eos], [7, 8, 9, eos], margin=1.0),
            TokenizedPreference("r:2", [5], [7, eos], [8, eos]),
        ],
        PAD,
    )
    assert batch.chosen_input_ids.tolist() == [[5, 6, 7, eos, 0, 0], [5, 7, eos, 0, 0, 0]]
    assert batch.rejected_input_ids.tolist() == [[5, 6, 7, 8, 9, eos], [5, 8, eos, 0, 0, 0]]
    assert batch.chosen_attention_mask.sum(-1).tolist() == [4, 3]
    assert batch.rejected_attention_mask.sum(-1).tolist() == [6, 3]
    # The reward is read at the last real token: the eos (checklist item 21).
    last = batch.chosen_attention_mask.sum(-1) - 1
    assert batch.chosen_input_ids[torch.arange(2), last].tolist() == [eos, eos]
    assert batch.margin.tolist() == [1.0, 0.0] and batch.margin.dtype == torch.float32
