"""Collation of token id lists into padded tensors.

``B`` sequences in the batch, ``L`` the longest one's length. Prompts for generation are padded on the **left**
(`left_pad`), so every prompt ends at column ``L-1`` and generated tokens line up after it (checklist item 2);
pass `position_ids_from_mask` to every training/scoring forward of a left-padded batch (not to ``generate()``,
which computes its own). Training and scoring sequences (SFT, reward model) are padded on the **right**
(`right_pad`), labels with `IGNORE_INDEX`. The pad id must differ from eos (`require_pad_token_id`, item 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from rlhf.data.tokenization import IGNORE_INDEX, TokenizedPreference, TokenizedSFT


def pad_sequences(seqs: Sequence[Sequence[int]], value: int, side: Literal["left", "right"]) -> torch.Tensor:
    """Stack int sequences into a (B, L) int64 tensor, filling with ``value`` on ``side``."""
    if not seqs:
        raise ValueError("cannot pad an empty batch")
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    length = max(len(s) for s in seqs)
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        start = length - len(s) if side == "left" else 0
        out[i, start : start + len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out


def _mask(seqs: Sequence[Sequence[int]], side: Literal["left", "right"]) -> torch.Tensor:
    # Built from the lengths, not from `ids != pad_id`: a sequence may legitimately contain the pad id.
    return pad_sequences([[1] * len(s) for s in seqs], 0, side)


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids (B, L) int64, attention_mask (B, L) int64) with the padding on the left — for generation."""
    return pad_sequences(seqs, pad_id, "left"), _mask(seqs, "left")


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids (B, L) int64, attention_mask (B, L) int64) with the padding on the right — for training."""
    return pad_sequences(seqs, pad_id, "right"), _mask(seqs, "right")


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids (B, L) int64 counting real tokens only, the first real token of each row at 0 (checklist item
    2; a loop over the tokens is the reference in tests/data). Left padding gets 0 and right padding repeats the
    last position: valid indices, masked anyway."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass(frozen=True)
class SFTBatch:
    """Right-padded SFT batch: ``input_ids``, ``attention_mask``, ``labels`` — each (B, L) int64. ``labels`` is
    `IGNORE_INDEX` on prompt, non-assistant and padding tokens; unshifted (label[t] is the token at t; the loss compares
    logits[:, :-1] with labels[:, 1:])."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor


def collate_sft(examples: Sequence[TokenizedSFT], pad_id: int) -> SFTBatch:
    """Right-pad SFT examples: ids with ``pad_id``, labels with `IGNORE_INDEX`."""
    input_ids, attention_mask = right_pad([e.input_ids for e in examples], pad_id)
    labels = pad_sequences([e.labels for e in examples], IGNORE_INDEX, "right")
    return SFTBatch(input_ids, attention_mask, labels)


@dataclass(frozen=True)
class PreferenceBatch:
    """Right-padded comparisons, chosen and rejected padded to one common length ``L``. ``chosen_input_ids``,
    ``chosen_attention_mask``, ``rejected_input_ids``, ``rejected_attention_mask``: (B, L) int64, each row
    ``prompt + response`` ending with eos; ``torch.cat`` along dim 0 gives one (2B, L) forward. The reward is read at
    the last real token, index ``attention_mask.sum(-1) - 1``. ``margin``: (B,) float32."""

    chosen_input_ids: torch.Tensor
    chosen_attention_mask: torch.Tensor
    rejected_input_ids: torch.Tensor
    rejected_attention_mask: torch.Tensor
    margin: torch.Tensor


def collate_preferences(examples: Sequence[TokenizedPreference], pad_id: int) -> PreferenceBatch:
    """Right-pad ``prompt + chosen`` and ``prompt + rejected`` of each comparison to a common length."""
    seqs = [e.prompt_ids + e.chosen_ids for e in examples] + [e.prompt_ids + e.rejected_ids for e in examples]
    input_ids, attention_mask = right_pad(seqs, pad_id)
    b = len(examples)
    margin = torch.tensor([e.margin for e in examples], dtype=torch.float32)
    return PreferenceBatch(input_ids[:b], attention_mask[:b], input_ids[b:], attention_mask[b:], margin)
