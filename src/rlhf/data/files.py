"""Reading data files into located records: JSONL, JSON, Parquet, and `datasets` directories.

Every record remembers where it came from (``Record.where``), so that a later problem is reported as
``file:line: what is wrong``: ``train.jsonl:12`` (JSONL: the 1-based line, blank lines counted; JSON: the line
where the object starts) or ``train.parquet:row 5`` (Parquet and ``datasets``: the 0-based row, as ``dataset[5]``).
In the columnar formats a null cell is the only way to say "this row has no such field", so null values are
dropped from those records.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_PROBLEMS = 20
"""How many problems a `DataError` lists before summarising the rest as "... and N more"."""


class DataError(ValueError):
    """Every problem found in a data file, each as ``file:line: what is wrong``: raised once, so the user can fix
    them all in one go rather than one per run. ``problems`` holds the first `MAX_PROBLEMS`; ``count`` the total."""

    def __init__(self, problems: list[str], count: int | None = None):
        self.problems = list(problems[:MAX_PROBLEMS])
        self.count = len(problems) if count is None else count
        lines = [f"{self.count} problems in the data (fix them and run again):", *(f"  {p}" for p in self.problems)]
        if self.count > len(self.problems):
            lines.append(f"  ... and {self.count - len(self.problems)} more")
        super().__init__(self.problems[0] if self.count == 1 and self.problems else "\n".join(lines))


class Problem(Exception):
    """One problem with one record or example: the message, without its location (`ProblemList.at` adds it)."""


class ProblemList:
    """Collects problems; keeps the first `MAX_PROBLEMS` and counts all of them."""

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.count = 0

    def add(self, problem: str) -> None:
        self.count += 1
        if len(self.listed) < MAX_PROBLEMS:
            self.listed.append(problem)

    @contextmanager
    def at(self, where: str) -> Iterator[None]:
        """Adds a `Problem` raised in the block as ``where: problem``, and goes on after the block."""
        try:
            yield
        except Problem as e:
            self.add(f"{where}: {e}")

    def raise_if_any(self) -> None:
        if self.count:
            raise DataError(self.listed, self.count)


@dataclass(frozen=True)
class Record:
    """One object read from a data file, with its location for messages (``train.jsonl:12``)."""

    data: dict[str, Any]
    where: str


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _read_text(p: Path, name: str) -> str:
    """The file as text (UTF-8, with or without a byte-order mark); `DataError` naming each line that is not. JSON text
    is UTF-8 (RFC 8259); a file saved in Latin-1 or UTF-16 fails here, at its line and column, rather than as a decoding
    traceback."""
    data = p.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    problems = ProblemList()
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        try:
            line.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            problems.add(
                f"{name}:{lineno}: not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1}); "
                "save the file as UTF-8"
            )
    problems.raise_if_any()
    raise AssertionError("unreachable: the whole file failed to decode but no line did")


def _objects(located: Iterable[tuple[str, Any]]) -> list[Record]:
    """Records of (where, parsed JSON) pairs; a `DataError` for every value that is not an object, or that
    is the `json.JSONDecodeError` of an invalid line."""
    records: list[Record] = []
    problems = ProblemList()
    for where, obj in located:
        if isinstance(obj, json.JSONDecodeError):
            problems.add(f"{where}: invalid JSON: {obj.msg} (column {obj.colno})")
        elif not isinstance(obj, dict):
            problems.add(f"{where}: expected a JSON object {{...}}, got {_type_name(obj)}")
        else:
            records.append(Record(obj, where))
    problems.raise_if_any()
    return records


def _parse_line(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        return e


def _read_jsonl(p: Path, name: str) -> list[Record]:
    lines = enumerate(io.StringIO(_read_text(p, name), newline=None), start=1)  # universal newlines, as open()
    return _objects((f"{name}:{lineno}", _parse_line(line)) for lineno, line in lines if line.strip())


def _read_json(p: Path, name: str) -> list[Record]:
    text = _read_text(p, name)
    try:
        top = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError([f"{name}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})"]) from None
    if isinstance(top, dict) and isinstance(top.get("data"), list):
        items = top["data"]
    elif isinstance(top, list):
        items = top
    else:
        raise DataError([f'{name}:1: expected a JSON list of objects or {{"data": [...]}}, got {_type_name(top)}'])
    wheres = [f"{name}:{line}" for line in _item_lines(text, want_data_key=isinstance(top, dict))]
    if len(wheres) != len(items):  # the scanner disagreed (should not happen): fall back to item numbers
        wheres = [f"{name}:item {i}" for i in range(len(items))]
    return _objects(zip(wheres, items, strict=True))


def _item_lines(text: str, want_data_key: bool) -> list[int]:
    """1-based line on which each item of the record list starts, by walking the (valid) JSON text. ``json`` gives no
    positions for parsed values, so we walk the top level with ``raw_decode``: for a list, each element; for an object,
    the elements of its ``"data"`` member. Empty if the walk fails."""
    decoder = json.JSONDecoder()

    def skip(i: int) -> int:
        return json.decoder.WHITESPACE.match(text, i).end()

    def members(i: int) -> list[tuple[Any, int]]:
        """(key, start) of each member of the list (key None) or object that starts at ``text[i]``."""
        out: list[tuple[Any, int]] = []
        close = "]" if text[i] == "[" else "}"
        i = skip(i + 1)
        while text[i] != close:
            key = None
            if close == "}":
                key, i = decoder.raw_decode(text, i)
                i = skip(skip(i) + 1)  # past ":"
            out.append((key, i))
            _, i = decoder.raw_decode(text, i)
            i = skip(i)
            if text[i] == ",":
                i = skip(i + 1)
        return out

    try:
        starts = members(skip(0))
        if want_data_key:  # the last "data" wins, as in json.loads
            starts = members([s for key, s in starts if key == "data"][-1])
    except (ValueError, IndexError):
        return []
    return [text.count("\n", 0, s) + 1 for _, s in starts]


def _rows(rows: list[dict[str, Any]], name: str) -> list[Record]:
    return [Record({k: v for k, v in row.items() if v is not None}, f"{name}:row {i}") for i, row in enumerate(rows)]


def _read_parquet(p: Path, name: str) -> list[Record]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError) for a broken file
        raise DataError([f"{name}: cannot read Parquet: {e}"]) from e
    return _rows(table.to_pylist(), name)


def _read_datasets_dir(p: Path, name: str) -> list[Record]:
    markers = ("dataset_info.json", "dataset_dict.json", "state.json")
    if not any((p / m).exists() for m in markers):
        raise DataError(
            [f"{name}: a directory, but not one written by `datasets` save_to_disk (no {' / '.join(markers)})"]
        )
    import datasets  # lazy: heavy, and only needed for this format

    ds = datasets.load_from_disk(str(p))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            splits = ", ".join(sorted(ds.keys())) or "none"
            raise DataError([f'{name}: a DatasetDict without a "train" split (splits: {splits})'])
        ds = ds["train"]
    return _rows(ds.to_list(), name)


READERS = {".jsonl": _read_jsonl, ".ndjson": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}
"""The file formats by (lower-case) suffix."""


def read_records(path: str | os.PathLike[str]) -> list[Record]:
    """Every record of a data file, the format chosen by the suffix (`READERS`; ``.json``: a list of objects or
    ``{"data": [...]}``) or by being a ``save_to_disk`` directory (a ``DatasetDict`` gives its ``"train"`` split).
    `DataError` on unreadable content or an empty file; `FileNotFoundError` when the path does not exist."""
    p = Path(path)
    name = str(path)
    if not p.exists():
        raise FileNotFoundError(f"{name}: no such file or directory")
    reader = _read_datasets_dir if p.is_dir() else READERS.get(p.suffix.lower())
    if reader is None:
        raise DataError(
            [f"{name}: unsupported file type {p.suffix!r}; use one of {', '.join(READERS)}, or a `datasets` directory"]
        )
    records = reader(p, name)
    if not records:
        raise DataError([f"{name}: the file holds no records"])
    return records
