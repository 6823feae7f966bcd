"""Preference pairs grouped by prompt, so that each distinct answer is forwarded once (InstructGPT, §3.5).

A ranking of k answers is k(k−1)/2 pairs over k answers; pair rows that share a prompt and answers make a ranking of
their own. `group_preferences` gathers a file's pairs (`rlhf.data.tokenization.TokenizedPreference`) by prompt: each
group holds the prompt's distinct answers once and its pairs as indices into them, so a trainer forwards k answers
rather than 2·k(k−1)/2 sequences (docs/rankings.md). Every pair is kept, repeated or contradicted ones too: a label
said twice counts twice, and two labels that disagree are the noise Bradley–Terry models (`contradictions` counts
them, for the trainer to say).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rlhf.data.tokenization import TokenizedPreference


@dataclass(frozen=True)
class PreferenceGroup:
    """The comparisons of one prompt. ``answers``: its distinct response ids (encoders: whole ``prompt + response``
    sequences, ``prompt_ids`` empty), each forwarded once; pair ``p`` prefers ``answers[better[p]]`` to
    ``answers[worse[p]]`` by ``margins[p]`` (0 without one); ``where``: the file line of each pair."""

    prompt_ids: list[int]
    answers: list[list[int]]
    better: list[int]
    worse: list[int]
    margins: list[float]
    where: list[str]
    truncated: int = 0
    """Pairs of the group that were cut to ``data.max_length``."""

    @property
    def num_pairs(self) -> int:
        return len(self.better)

    def sequences(self) -> list[list[int]]:
        """What the model reads, one sequence per answer: ``prompt_ids + answer``."""
        return [self.prompt_ids + answer for answer in self.answers]

    def tokens(self) -> int:
        """The tokens of its sequences."""
        return sum(len(self.prompt_ids) + len(answer) for answer in self.answers)

    def contradictions(self) -> int:
        """Pairs whose reverse is also in the group (a is preferred to b, and b to a)."""
        said = set(zip(self.better, self.worse, strict=True))
        return sum((w, b) in said for b, w in said)


def group_preferences(pairs: Sequence[TokenizedPreference]) -> list[PreferenceGroup]:
    """The pairs gathered by prompt (its token ids; encoders: its ``prompt_key``), groups in the order of their first
    pair, answers in the order they first appear, pairs in file order. One pair per prompt gives one group per pair
    with ``answers`` = [chosen, rejected]."""
    groups: dict[tuple, dict] = {}
    for p in pairs:
        key = (p.prompt_key, tuple(p.prompt_ids))
        group = groups.setdefault(key, {"prompt_ids": p.prompt_ids, "answers": {}, "pairs": [], "truncated": 0})
        answers = group["answers"]
        better = answers.setdefault(tuple(p.chosen_ids), len(answers))
        worse = answers.setdefault(tuple(p.rejected_ids), len(answers))
        group["pairs"].append((better, worse, p.margin, p.where))
        group["truncated"] += p.truncated
    return [
        PreferenceGroup(
            prompt_ids=group["prompt_ids"],
            answers=[list(answer) for answer in group["answers"]],
            better=[b for b, _, _, _ in group["pairs"]],
            worse=[w for _, w, _, _ in group["pairs"]],
            margins=[m for _, _, m, _ in group["pairs"]],
            where=[where for _, _, _, where in group["pairs"]],
            truncated=group["truncated"],
        )
        for group in groups.values()
    ]


@dataclass(frozen=True)
class AnswerBatch:
    """One forward/backward pass over answers: whole ``groups`` (indices into the step's groups), or, for a group with
    more answers than a pass holds, the answers ``chunk`` of the one group in ``groups``."""

    groups: tuple[int, ...]
    chunk: slice | None = None


def answer_batches(sizes: Sequence[int], limit: int | None) -> list[AnswerBatch]:
    """Passes over groups of ``sizes`` answers, in order, each holding at most ``limit`` answers (None: all in one
    pass): whole groups packed while they fit, and a group larger than ``limit`` alone, cut into chunks of ``limit``
    (the trainer gives those chunks the gradient of the whole group: `rlhf.trainers.reward_model`)."""
    if limit is None:
        return [AnswerBatch(tuple(range(len(sizes))))] if sizes else []
    out: list[AnswerBatch] = []
    packed: list[int] = []
    room = limit
    for g, size in enumerate(sizes):
        if size > limit:
            if packed:
                out.append(AnswerBatch(tuple(packed)))
                packed, room = [], limit
            out.extend(AnswerBatch((g,), chunk) for chunk in _chunks(size, limit))
            continue
        if size > room:
            out.append(AnswerBatch(tuple(packed)))
            packed, room = [], limit
        packed.append(g)
        room -= size
        if room == 0:
            out.append(AnswerBatch(tuple(packed)))
            packed, room = [], limit
    if packed:
        out.append(AnswerBatch(tuple(packed)))
    return out


def _chunks(size: int, limit: int) -> Iterator[slice]:
    return (slice(start, min(start + limit, size)) for start in range(0, size, limit))
