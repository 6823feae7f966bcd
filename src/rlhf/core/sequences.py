"""Response post-processing: sequence lengths, padding masks, EOS penalty, and where the terminal score goes.

Shapes: ``B`` sequences, ``T`` response tokens. Token tensors are integer ``(B, T)``; ``PAD`` must be a dedicated
id, never the EOS/stop id (checklist item 1). Conventions follow TRL ``experimental/ppo`` and N+ ``ppo.py``
(checklist items 5, 24, 25; vectors 2-B).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlhf.core.choices import MissingEosPenalty, ScoreConvention


def first_true_indices(bools: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last dimension, or the row length if there is none. Shapes:
    ``bools (..., T)`` → ``(...)`` long. TRL ``experimental/utils.py`` ``first_true_indices`` (L723-743); vector 2-B:
    ``first_true_indices(post == PAD) = [3, 5]``."""
    length = bools.size(-1)
    positions = torch.arange(length, device=bools.device)
    # Plain loop replaced: for b: out[b] = next((t for t in range(T) if bools[b, t]), T)
    # — positions where bools is False become T, so the row minimum is the first True (or T).
    return torch.where(bools.bool(), positions, length).min(dim=-1).values


class ResponseMasks(NamedTuple):
    """Lengths and padding masks of truncated responses (checklist item 24, TRL/N+ convention).

    sequence_lengths: (B,) long — index of the last real token (the EOS if present);
        ``T − 1`` if the response has no PAD, ``−1`` if it starts with PAD.
    padding_mask: (B, T) bool — True at ``t > sequence_lengths``: padding for log-probs, KL, policy loss,
        advantages.
    padding_mask_p1: (B, T) bool — True at ``t > sequence_lengths + 1``: padding for values, returns, value
        loss and reward whitening (the first PAD after EOS still counts: the TRL/N+ score sits there).
    """

    sequence_lengths: torch.Tensor
    padding_mask: torch.Tensor
    padding_mask_p1: torch.Tensor


def response_masks(post_responses: torch.Tensor, pad_token_id: int) -> ResponseMasks:
    """Sequence lengths and the two padding masks of truncated responses.

    Shapes: ``post_responses (B, T)`` → see ``ResponseMasks``.

        seq_len = first_true_indices(post == PAD) − 1
        padding_mask = t > seq_len;  padding_mask_p1 = t > seq_len + 1

    N+ ``ppo.py`` L636, L670-677; TRL ``ppo_trainer.py`` L727, L762-769. Vector 2-B: seq_len ``[2, 4]``,
    padding_mask ``[[0,0,0,1,1],[0,0,0,0,0]]``, padding_mask_p1 ``[[0,0,0,0,1],[0,0,0,0,0]]``.
    """
    sequence_lengths = first_true_indices(post_responses == pad_token_id) - 1
    positions = torch.arange(post_responses.size(-1), device=post_responses.device)
    return ResponseMasks(
        sequence_lengths=sequence_lengths,
        padding_mask=positions > sequence_lengths.unsqueeze(-1),
        padding_mask_p1=positions > (sequence_lengths + 1).unsqueeze(-1),
    )


def penalize_missing_eos(
    scores: torch.Tensor, has_eos: torch.Tensor, kind: MissingEosPenalty | str, penalty: float
) -> torch.Tensor:
    """Apply the ``kind`` missing-EOS penalty of size ``penalty`` ≥ 0 where ``has_eos`` is False: ``"replace"`` makes
    the score −penalty (OAI/N+ ``penalty_reward_value`` = −1), ``"subtract"`` takes penalty off it (TRL
    ``missing_eos_penalty``, e.g. 1.0). A NaN score (not scored) stays NaN: there is no score to penalise. Shapes:
    ``scores (B,)``, ``has_eos (B,)`` bool → ``(B,)``. Vector 2-B: ``[1, 0.5] → [1, −1]`` (replace) or
    ``[1, −0.5]`` (subtract) with 1.
    """
    if penalty < 0:
        raise ValueError(f"missing-EOS penalty must be >= 0 (its size), got {penalty}")
    if MissingEosPenalty(kind) is MissingEosPenalty.REPLACE:
        penalized = torch.where(has_eos, scores, torch.full_like(scores, -penalty))
    else:
        penalized = torch.where(has_eos, scores, scores - penalty)
    return torch.where(scores.isnan(), scores, penalized)


def score_index(
    sequence_lengths: torch.Tensor, response_length: int, convention: ScoreConvention | str
) -> torch.Tensor:
    """Response index where the terminal score is added, per ``convention``: ``after_eos``, the first PAD after the
    EOS when there is room, else the last token (vector 2-C2: seq ``[2, 4]``, T=5 → ``[3, 4]``); ``eos``, the EOS /
    last real token itself, clamped to 0 for an empty response so it is a valid index (vector 2-C3: → ``[2, 4]``).
    Shapes: ``sequence_lengths (B,)`` → ``(B,)`` long. The two conventions give different advantages (reference 2-C2
    vs 2-C3; trl#1893, trl#3750)."""
    if ScoreConvention(convention) is ScoreConvention.EOS:
        return sequence_lengths.clamp(min=0)
    return torch.where(sequence_lengths + 1 < response_length, sequence_lengths + 1, sequence_lengths)
