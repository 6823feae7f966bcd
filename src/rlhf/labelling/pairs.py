"""What to label, read from what ``rlhf sample --mode pairs`` or ``--mode candidates`` writes, each with its content
id: pairs (`read_pairs`: every pair of a row's k answers) or, to rank k answers at once, candidates
(`read_candidates`); the rows accepted: docs/labelling.md ("The pairs")."""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.data.files import DataError, ProblemList, Record, read_records
from rlhf.data.labels import candidates_id, pair_id
from rlhf.data.records import Message, validate_prompts


@dataclass(frozen=True)
class Pair:
    """Two answers to one prompt, to be compared; ``id`` is `rlhf.data.labels.pair_id` of the three."""

    id: str
    prompt: str | list[Message]
    a: str
    b: str
    where: str

    def label_row(self, label: str, **meta: Any) -> dict[str, Any]:
        """The labels-file row (`rlhf.data.labels`) of this pair labelled ``label`` (a, b, tie or skip), ending with
        ``meta``; a chat prompt's answers as assistant messages, as `rlhf sample` writes them."""
        if label in ("tie", "skip"):
            return {"kind": label, "prompt": self.prompt, "a": self.a, "b": self.b, **meta}
        chosen, rejected = (self.a, self.b) if label == "a" else (self.b, self.a)
        chosen, rejected = _answer(self.prompt, chosen), _answer(self.prompt, rejected)
        return {"kind": "preference", "prompt": self.prompt, "chosen": chosen, "rejected": rejected, **meta}


def _answer(prompt: str | list[Message], text: str) -> str | list[Message]:
    """An answer as a labels-file row holds it: text, or (a chat prompt) one assistant message, as `rlhf sample`
    writes them."""
    return [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text


@dataclass(frozen=True)
class Candidates:
    """k ≥ 2 distinct answers to one prompt, to be ranked; ``id`` is `rlhf.data.labels.candidates_id` of them."""

    id: str
    prompt: str | list[Message]
    answers: tuple[str, ...]
    where: str

    def ranking_row(self, ranking: list[int | list[int]], **meta: Any) -> dict[str, Any]:
        """The labels-file row of these answers ranked ``ranking`` (indices into ``answers``, best first; a list of
        indices ties them: the format `rlhf.data.records` reads), ending with ``meta``."""
        completions = [_answer(self.prompt, a) for a in self.answers]
        return {"kind": "ranking", "prompt": self.prompt, "completions": completions, "ranking": ranking, **meta}

    def skip_row(self, **meta: Any) -> dict[str, Any]:
        """The labels-file row of a labeller passing on these answers (a skip: no preference, not trained on)."""
        completions = [_answer(self.prompt, a) for a in self.answers]
        return {"kind": "skip", "prompt": self.prompt, "completions": completions, **meta}


Item = Pair | Candidates
"""What the page shows at once: two answers to compare, or k answers to put in order."""


@dataclass(frozen=True)
class CandidatesFile:
    """The ranking items of a candidates file, in file order, with the file's SHA-256."""

    path: str
    items: list[Candidates]
    sha256: str
    identical: int
    """Answers left out because an earlier answer of the same row is the same text."""
    repeated: int
    """Rows left out because an earlier row has the same prompt and answers."""

    def by_id(self) -> dict[str, Candidates]:
        return {item.id: item for item in self.items}


@dataclass(frozen=True)
class PairFile:
    """The pairs of a file, in file order, with the file's SHA-256 (a changed file is refused on restart)."""

    path: str
    pairs: list[Pair]
    sha256: str
    identical: int
    """Answer pairs left out because both answers are the same text."""
    repeated: int
    """Pairs left out because an earlier row of the file has the same pair."""

    def by_id(self) -> dict[str, Pair]:
        return {pair.id: pair for pair in self.pairs}

    def as_items(self) -> ItemFile:
        """These pairs as the items of a session in mode pairs."""
        return ItemFile(self.path, list(self.pairs), self.sha256, "pairs", self.identical, self.repeated)


@dataclass(frozen=True)
class ItemFile:
    """What a labelling session serves, in file order: pairs, candidates to rank, or both (`read_items`)."""

    path: str
    items: list[Item]
    sha256: str
    mode: str
    """The ``label.mode`` the items were read in (a restart in another mode would serve other items)."""
    identical: int
    """Answers left out because they repeat another answer of their row."""
    repeated: int
    """Items left out because an earlier row has the same one."""

    def count(self, kind: type) -> int:
        return sum(isinstance(item, kind) for item in self.items)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, or of every file of a directory (relative names and bytes, sorted by name)."""
    p = Path(path)
    digest = hashlib.sha256()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    for f in files:
        if p.is_dir():
            digest.update(str(f.relative_to(p)).encode() + b"\0")
        with open(f, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def read_pairs(path: str | os.PathLike[str]) -> PairFile:
    """Every pair of a pairs or candidates file; `DataError` lists each bad row as ``file:line``."""
    pairs, sha, identical, repeated = _collect(path, _pairs, "no pair to label (every row's answers are the same text)")
    return PairFile(str(path), pairs, sha, identical, repeated)


def _collect(
    path: str | os.PathLike[str], parse: Callable[[Record], tuple[list[Any], int]], empty: str
) -> tuple[list[Any], str, int, int]:
    """(the items of every row of ``path``, ``parse(record)`` giving a row's items and its answers left out as
    repeats; the file's SHA-256; answers left out; items left out because an earlier one has the same ``id``). One
    `DataError` lists every bad row as ``file:line``, another says ``empty`` when no item is left."""
    sha, problems = file_sha256(path), ProblemList()
    items: list[Any] = []
    seen: set[str] = set()
    identical = repeated = 0
    for record in read_records(path):
        try:
            found, left_out = parse(record)
        except ValueError as error:
            problems.add(f"{record.where}: {error}")
            continue
        identical += left_out
        for item in found:
            if item.id in seen:
                repeated += 1
                continue
            seen.add(item.id)
            items.append(item)
    problems.raise_if_any()
    if not items:
        raise DataError([f"{path}: {empty}"])
    return items, sha, identical, repeated


def _pairs(record: Record) -> tuple[list[Pair], int]:
    """(a row's pairs of distinct answers, its pairs of the same text left out)."""
    prompt, answer_pairs = _row(record)
    pairs = [Pair(pair_id(prompt, a, b), prompt, a, b, record.where) for a, b in answer_pairs if a != b]
    return pairs, len(answer_pairs) - len(pairs)


def _candidates(record: Record) -> tuple[list[Candidates], int]:
    """(a candidates row as one ranking item, its answers left out as repeats)."""
    prompt, answers = _candidates_row(record)
    item = Candidates(candidates_id(prompt, answers), prompt, answers, record.where)
    return [item], len(record.data["completions"]) - len(answers)


def read_candidates(path: str | os.PathLike[str]) -> CandidatesFile:
    """Every ranking item of a candidates file (``{"prompt" or "messages", "completions": [k answers]}`` rows), each
    row's repeated answers dropped; a row left with fewer than 2 distinct answers is refused (there is nothing to
    rank). `DataError` lists each bad row as ``file:line``."""
    items, sha, identical, repeated = _collect(path, _candidates, "no row to rank")
    return CandidatesFile(str(path), items, sha, identical, repeated)


def read_items(path: str | os.PathLike[str], *, mode: str) -> ItemFile:
    """The items of a pairs or candidates file for ``label.mode`` ``mode``: ``pairs`` = every pair (`read_pairs`);
    ``ranking`` = each candidates row's answers ranked at once; ``auto`` = ranked when a row has 3 or more distinct
    answers. A pair row (``a``, ``b``), and in auto a row of 2 distinct answers, stays a pair. `DataError` lists each
    bad row as ``file:line``."""
    if mode == "pairs":
        return read_pairs(path).as_items()
    fewest = {"ranking": 2, "auto": 3}[mode]
    empty = "nothing to label (every row's answers are the same text)"
    items, sha, identical, repeated = _collect(path, functools.partial(_items, fewest=fewest), empty)
    return ItemFile(str(path), items, sha, mode, identical, repeated)


def _items(record: Record, *, fewest: int) -> tuple[list[Item], int]:
    """(the row's items, its answers left out as repeats): one `Candidates` when the row has ``fewest`` or more
    distinct answers, else its pairs."""
    completions = record.data.get("completions")
    texts = isinstance(completions, list) and all(isinstance(c, str) for c in completions)
    if texts and len(set(completions)) >= fewest:  # other rows: `_row` says what is wrong with them
        return _candidates(record)
    return _pairs(record)


def _candidates_row(record: Record) -> tuple[str | list[Message], tuple[str, ...]]:
    """(prompt, distinct answers in the row's order) of a candidates row; ValueError says what is wrong with it."""
    if "completions" not in record.data:
        keys = ", ".join(record.data) or "none"
        raise ValueError(f'expected "completions" (k answers to rank); keys present: {keys}')
    prompt, _ = _row(record)
    answers = tuple(dict.fromkeys(record.data["completions"]))
    if len(answers) < 2:
        raise ValueError('"completions" are all the same text: nothing to rank')
    return prompt, answers


def _row(record: Record) -> tuple[str | list[Message], list[tuple[str, str]]]:
    """(prompt, answer pairs) of one row; ValueError says what is wrong with it."""
    data = record.data
    has_pair, has_candidates = "a" in data or "b" in data, "completions" in data
    if has_pair == has_candidates:
        keys = ", ".join(data) or "none"
        raise ValueError(f'expected "a" and "b" (a pair) or "completions" (candidates); keys present: {keys}')
    prompt = _prompt(record)
    if has_pair:
        for key in ("a", "b"):
            if not isinstance(data.get(key), str):
                raise ValueError(f'"{key}" must be a string, got {_type(data.get(key))}')
        return prompt, [(data["a"], data["b"])]
    completions = data["completions"]
    if not isinstance(completions, list) or not all(isinstance(c, str) for c in completions):
        raise ValueError(f'"completions" must be a list of strings, got {_type(completions)}')
    if len(completions) < 2:
        raise ValueError(f'"completions" has {len(completions)} answer(s); a pair needs two')
    return prompt, list(itertools.combinations(completions, 2))


def _prompt(record: Record) -> str | list[Message]:
    """The row's prompt, validated as a prompts file's row is (``prompt`` text or messages)."""
    keys = {k: v for k, v in record.data.items() if k in ("prompt", "messages")}
    try:
        (example,) = validate_prompts([Record(keys, record.where)])
    except DataError as error:
        raise ValueError(str(error).removeprefix(f"{record.where}: ")) from None
    return example.prompt if example.prompt is not None else example.messages  # type: ignore[return-value]


def _type(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__
