"""The labels file: what ``rlhf label`` (a person in the browser) and the LLM judge write, and ``rlhf rm`` reads.

One JSON object per line, appended and never rewritten; ``"kind"`` says what a line is (``session``,
``preference``, ``ranking``, ``tie``, ``skip``, ``retraction``; each kind's fields: docs/labelling.md, "The labels
file"). Ties, skips and retracted labels never reach a reward model: `live_preferences` keeps the preference and
ranking rows that no retraction took back (a ranking row is read as its pairs, `rlhf.data.records`). A file without ``"kind"`` keys is a plain preferences file and is read as is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlhf.data.files import Record

LABELS = ("a", "b", "tie", "skip")
"""What a labeller can answer for a pair: answer a is better, answer b is better, tie, skip."""
RATINGS = ("good", "okay", "bad")
"""The optional per-answer rating (👍 😐 👎)."""
LABEL_KINDS = ("preference", "ranking", "tie", "skip")
"""The kinds of row that are a label (a retraction may take one back)."""


def pair_id(prompt: Any, a: str, b: str) -> str:
    """A pair's id: a hash of its prompt and its two answers, the same whichever answer is called ``a``. Content, not
    position in a file: a person's and a judge's label of the same two answers share the id, so their agreement can be
    measured, and a label always refers to the texts it was given for."""
    text = json.dumps([prompt, sorted([a, b])], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def candidates_id(prompt: Any, answers: Sequence[str]) -> str:
    """A ranking item's id: a hash of its prompt and its k answers, whatever their order (for k = 2 not the pair's
    `pair_id`: a ranking and a pair label are different questions)."""
    text = json.dumps([prompt, sorted(answers), "ranking"], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def is_label_file(records: Sequence[Record]) -> bool:
    """Whether the records are a labels file (some line has a ``"kind"``) rather than plain preferences."""
    return any("kind" in r.data for r in records)


@dataclass
class LabelCounts:
    """What `live_preferences` kept and left out."""

    preferences: int = 0
    rankings: int = 0
    ties: int = 0
    skips: int = 0
    retracted: int = 0

    def summary(self) -> str:
        return (
            f"{self.preferences} preferences and {self.rankings} rankings kept; left out {self.ties} ties, {self.skips} skips and "
            f"{self.retracted} retracted labels"
        )


def retracted_ids(records: Sequence[Record]) -> set[str]:
    """The ids of the labels some retraction took back."""
    return {str(r.data.get("retracts")) for r in records if r.data.get("kind") == "retraction"}


def live_labels(records: Sequence[Record]) -> list[Record]:
    """The label rows (`LABEL_KINDS`) that no retraction took back, in file order."""
    gone = retracted_ids(records)
    return [r for r in records if r.data.get("kind") in LABEL_KINDS and str(r.data.get("id")) not in gone]


def live_preferences(records: Sequence[Record]) -> tuple[list[Record], LabelCounts]:
    """The preference rows of a labels file that no retraction took back, and what was left out; rows of an
    unknown ``kind`` are kept for the preference validation to report (``file:line``), not dropped silently."""
    gone = retracted_ids(records)
    counts = LabelCounts()
    kept: list[Record] = []
    for r in records:
        kind = r.data.get("kind")
        if kind in LABEL_KINDS and str(r.data.get("id")) in gone:
            counts.retracted += 1
        elif kind == "tie":
            counts.ties += 1
        elif kind == "skip":
            counts.skips += 1
        elif kind not in ("session", "retraction"):  # a preference, a plain row, or an unknown kind
            kept.append(r)
            counts.preferences += kind == "preference"
            counts.rankings += kind == "ranking"
    return kept, counts
