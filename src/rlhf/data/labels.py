"""The labels file: what ``rlhf label`` (a person in the browser) and the LLM judge write, and ``rlhf rm`` reads.

One JSON object per line, appended and never rewritten; ``"kind"`` says what a line is:

==============  ==============================================================================================
``session``     the first line of a file ``rlhf label`` started: the pairs file it labels and its SHA-256, so a
                restart on a changed pairs file is refused
``preference``  a decision: ``prompt``, ``chosen``, ``rejected`` (exactly a row of a preferences file) with
                ``id`` (of this label), ``pair`` (see `pair_id`), ``labeller``, ``source`` (``human`` or the
                judge), ``time`` (UTC, ISO 8601), and, for a person, ``left`` (``chosen``/``rejected``: the
                answer shown on the left), ``seconds`` (time to decide) and ``ratings`` (optional per-answer
                ``good``/``okay``/``bad``)
``tie``         no preference: ``prompt``, ``a``, ``b`` and the same metadata (``left`` is ``a``/``b``)
``skip``        the labeller passed; same fields as a tie
``retraction``  an undo: ``retracts`` is the ``id`` of the label it takes back
==============  ==============================================================================================

Ties, skips and retracted labels never reach a reward model: `live_preferences` keeps the preference rows
that no retraction took back. A file without ``"kind"`` keys is a plain preferences file and is read as is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlhf.data.files import Record

KINDS = ("session", "preference", "tie", "skip", "retraction")
LABELS = ("a", "b", "tie", "skip")
"""What a labeller can answer for a pair: answer a is better, answer b is better, tie, skip."""
RATINGS = ("good", "okay", "bad")
"""The optional per-answer rating (👍 😐 👎)."""


def pair_id(prompt: Any, a: str, b: str) -> str:
    """A pair's id: a hash of its prompt and its two answers, the same whichever answer is called ``a``.

    Content, not position in a file: a person's and a judge's label of the same two answers share the id, so
    their agreement can be measured, and a label always refers to the texts it was given for.
    """
    text = json.dumps([prompt, sorted([a, b])], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def is_label_file(records: Sequence[Record]) -> bool:
    """Whether the records are a labels file (some line has a ``"kind"``) rather than plain preferences."""
    return any("kind" in r.data for r in records)


@dataclass
class LabelCounts:
    """What `live_preferences` kept and left out."""

    preferences: int = 0
    ties: int = 0
    skips: int = 0
    retracted: int = 0

    def summary(self) -> str:
        return (
            f"{self.preferences} preferences kept; left out {self.ties} ties, {self.skips} skips and "
            f"{self.retracted} retracted labels"
        )


def retracted_ids(records: Sequence[Record]) -> set[str]:
    """The ids of the labels some retraction took back."""
    return {str(r.data.get("retracts")) for r in records if r.data.get("kind") == "retraction"}


def live_labels(records: Sequence[Record]) -> list[Record]:
    """The label rows (preference, tie, skip) that no retraction took back, in file order."""
    gone = retracted_ids(records)
    return [
        r for r in records if r.data.get("kind") in ("preference", "tie", "skip") and str(r.data.get("id")) not in gone
    ]


def live_preferences(records: Sequence[Record]) -> tuple[list[Record], LabelCounts]:
    """The preference rows of a labels file that no retraction took back, and what was left out.

    Rows with an unknown ``kind`` are kept for the preference validation to report (``file:line``), rather than
    dropped silently.
    """
    gone = retracted_ids(records)
    counts = LabelCounts()
    kept: list[Record] = []
    for r in records:
        kind = r.data.get("kind")
        if kind == "preference" and str(r.data.get("id")) in gone:
            counts.retracted += 1
        elif kind in ("preference", None) or kind not in KINDS:
            kept.append(r)
            counts.preferences += kind == "preference"
        elif kind == "tie" and str(r.data.get("id")) not in gone:
            counts.ties += 1
        elif kind == "skip" and str(r.data.get("id")) not in gone:
            counts.skips += 1
        elif kind in ("tie", "skip"):
            counts.retracted += 1
    return kept, counts
