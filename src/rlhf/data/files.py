"""Reading data files into located records: JSONL, JSON, Parquet, and `datasets` directories.

Every record remembers where it came from (``Record.where``), so that a later validation or tokenisation
problem can be reported as ``file:line: what is wrong`` — the user opens the file at that line and fixes it.

Locations:
- JSONL: ``train.jsonl:12`` — the 1-based line number (blank lines are skipped but still counted);
- JSON: ``train.json:12`` — the 1-based line where the object starts;
- Parquet and ``datasets`` directories: ``train.parquet:row 5`` — the 0-based row index, as in
  ``table.slice(5, 1)`` or ``dataset[5]``.

In the columnar formats a null cell is the only way to say "this row has no such field", so null values
are dropped from those records (a row with ``prompt = null`` reads as a record without ``"prompt"``).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_PROBLEMS = 20
"""How many problems a `DataError` lists before summarising the rest as "... and N more"."""

JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIXES = (".json",)
PARQUET_SUFFIXES = (".parquet",)


class DataError(ValueError):
    """One or more problems in a data file, each as ``file:line: what is wrong``.

    Raised once per file with every problem found (the first `MAX_PROBLEMS` listed), so the user can fix
    them all in one go rather than one per run. ``problems`` holds the listed lines; ``count`` the total.
    """

    def __init__(self, problems: list[str], count: int | None = None):
        self.problems = list(problems[:MAX_PROBLEMS])
        self.count = len(problems) if count is None else count
        super().__init__(self._message())

    def _message(self) -> str:
        if self.count == 1 and self.problems:
            return self.problems[0]
        lines = [f"{self.count} problems in the data (fix them and run again):"]
        lines += [f"  {p}" for p in self.problems]
        if self.count > len(self.problems):
            lines.append(f"  ... and {self.count - len(self.problems)} more")
        return "\n".join(lines)


class ProblemList:
    """Collects problems; keeps the first `MAX_PROBLEMS` and counts all of them."""

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.count = 0

    def add(self, problem: str) -> None:
        self.count += 1
        if len(self.listed) < MAX_PROBLEMS:
            self.listed.append(problem)

    def raise_if_any(self) -> None:
        if self.count:
            raise DataError(self.listed, self.count)


@dataclass(frozen=True)
class Record:
    """One object read from a data file, with its location for messages (``train.jsonl:12``)."""

    data: dict[str, Any]
    where: str


def read_records(path: str | os.PathLike[str]) -> list[Record]:
    """Read every record of a data file; the format is chosen by the suffix (or by being a directory).

    Supported: ``.jsonl`` (one object per line), ``.json`` (a list of objects, or ``{"data": [...]}``),
    ``.parquet`` (via pyarrow), and a directory written by ``datasets``' ``save_to_disk`` (a
    ``DatasetDict`` contributes its ``"train"`` split). Raises `DataError` on unreadable content (invalid
    JSON, a non-object item) and on an empty file; `FileNotFoundError` when the path does not exist.
    """
    p = Path(path)
    name = str(path)
    if not p.exists():
        raise FileNotFoundError(f"{name}: no such file or directory")
    if p.is_dir():
        records = _read_datasets_dir(p, name)
    elif p.suffix.lower() in JSONL_SUFFIXES:
        records = _read_jsonl(p, name)
    elif p.suffix.lower() in JSON_SUFFIXES:
        records = _read_json(p, name)
    elif p.suffix.lower() in PARQUET_SUFFIXES:
        records = _read_parquet(p, name)
    else:
        supported = ", ".join(JSONL_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES)
        raise DataError(
            [f"{name}: unsupported file type {p.suffix!r}; use one of {supported}, or a `datasets` directory"]
        )
    if not records:
        raise DataError([f"{name}: the file holds no records"])
    return records


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _read_text(p: Path, name: str) -> str:
    """The file as text (UTF-8, with or without a byte-order mark); `DataError` naming each line that is not.

    JSON text is UTF-8 (RFC 8259); a file saved in Latin-1 or UTF-16 fails here, at its line and column,
    rather than as a decoding traceback.
    """
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


def _read_jsonl(p: Path, name: str) -> list[Record]:
    records: list[Record] = []
    problems = ProblemList()
    with io.StringIO(_read_text(p, name), newline=None) as f:  # universal newlines, as open() would
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{name}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                problems.add(f"{where}: invalid JSON: {e.msg} (column {e.colno})")
                continue
            if not isinstance(obj, dict):
                problems.add(f"{where}: expected a JSON object {{...}}, got {_type_name(obj)}")
                continue
            records.append(Record(obj, where))
    problems.raise_if_any()
    return records


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
    lines = _item_lines(text, want_data_key=isinstance(top, dict))
    if len(lines) != len(items):  # the scanner disagreed (should not happen): fall back to item numbers
        lines = None
    records: list[Record] = []
    problems = ProblemList()
    for i, obj in enumerate(items):
        where = f"{name}:{lines[i]}" if lines else f"{name}:item {i}"
        if not isinstance(obj, dict):
            problems.add(f"{where}: expected a JSON object {{...}}, got {_type_name(obj)}")
            continue
        records.append(Record(obj, where))
    problems.raise_if_any()
    return records


def _item_lines(text: str, want_data_key: bool) -> list[int] | None:
    """1-based line on which each item of the record list starts, by walking the (valid) JSON text.

    ``json`` gives no positions for parsed values, so we walk the top level with ``raw_decode``: for a list,
    each element; for an object, the elements of its ``"data"`` member.
    """
    decoder = json.JSONDecoder()
    ws = " \t\n\r"

    def skip(i: int) -> int:
        while i < len(text) and text[i] in ws:
            i += 1
        return i

    def walk_list(i: int) -> list[int]:  # text[i] == "["
        starts: list[int] = []
        i = skip(i + 1)
        if text[i] == "]":
            return starts
        while True:
            starts.append(i)
            _, i = decoder.raw_decode(text, i)
            i = skip(i)
            if text[i] == "]":
                return starts
            i = skip(i + 1)  # past ","

    i = skip(0)
    try:
        if not want_data_key:
            starts = walk_list(i)
        else:
            starts = []
            i = skip(i + 1)  # past "{"
            while text[i] != "}":
                key, i = decoder.raw_decode(text, i)
                i = skip(skip(i) + 1)  # past ":"
                if key == "data" and text[i] == "[":
                    starts = walk_list(i)  # the last "data" wins, as in json.loads
                _, i = decoder.raw_decode(text, i)
                i = skip(i)
                if text[i] == ",":
                    i = skip(i + 1)
    except (ValueError, IndexError):
        return None
    return [text.count("\n", 0, s) + 1 for s in starts]


def _drop_nulls(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if v is not None}


def _read_parquet(p: Path, name: str) -> list[Record]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError) for a broken file
        raise DataError([f"{name}: cannot read Parquet: {e}"]) from e
    return [Record(_drop_nulls(row), f"{name}:row {i}") for i, row in enumerate(table.to_pylist())]


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
    return [Record(_drop_nulls(row), f"{name}:row {i}") for i, row in enumerate(ds.to_list())]
