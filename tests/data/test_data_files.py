"""Reading data files: every format yields the same records, each located for messages."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf.data import DataError, read_records

RECORDS = [
    {"prompt": "what is 1 + 1?", "answer": 2},
    {"messages": [{"role": "user", "content": "count to 3:"}], "answer": 3},
    {"prompt": "the red cat", "answer": 4},
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def _columnar(records: list[dict]) -> list[dict]:
    """Rows with every column, null where a record lacks it — what a table of these records holds."""
    keys = list(dict.fromkeys(k for r in records for k in r))
    return [{k: r.get(k) for k in keys} for r in records]


def _write(fmt: str, tmp_path: Path) -> Path:
    if fmt == "jsonl":
        return write_jsonl(tmp_path / "data.jsonl", RECORDS)
    if fmt == "json-list":
        path = tmp_path / "data.json"
        path.write_text(json.dumps(RECORDS, indent=2))
        return path
    if fmt == "json-data":
        path = tmp_path / "data.json"
        path.write_text(json.dumps({"version": 1, "data": RECORDS}, indent=2))
        return path
    if fmt == "parquet":
        path = tmp_path / "data.parquet"
        pq.write_table(pa.Table.from_pylist(_columnar(RECORDS)), path)
        return path
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "data_dir"
    ds = datasets.Dataset.from_list(_columnar(RECORDS))
    if fmt == "datasets-dict":
        ds = datasets.DatasetDict({"train": ds, "test": ds.select([0])})
    ds.save_to_disk(str(path))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json-list", "json-data", "parquet", "datasets", "datasets-dict"])
def test_every_format_reads_the_same_records(fmt: str, tmp_path: Path):
    records = read_records(_write(fmt, tmp_path))
    # Columnar formats fill a missing field with null; those are dropped, so the records compare equal.
    assert [r.data for r in records] == RECORDS


def test_locations(tmp_path: Path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n')  # blank lines skipped, still counted
    assert [r.where for r in read_records(path)] == [f"{path}:1", f"{path}:4"]

    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\n')  # a byte-order mark, as some editors write
    assert [r.data for r in read_records(path)] == [{"prompt": "a"}]

    path = tmp_path / "train.json"
    path.write_text('[\n  {"prompt": "a"},\n\n  {"prompt": "b",\n   "x": [1, 2]}, {"prompt": "c"}\n]\n')
    assert [r.where for r in read_records(path)] == [f"{path}:2", f"{path}:4", f"{path}:5"]

    path = tmp_path / "wrapped.json"
    path.write_text('{"meta": {"data": [0]},\n "data": [\n  {"prompt": "a"},\n  {"prompt": "b"}]}')
    assert [r.where for r in read_records(path)] == [f"{path}:3", f"{path}:4"]

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a"}, {"prompt": "b"}]), path)
    assert [r.where for r in read_records(path)] == [f"{path}:row 0", f"{path}:row 1"]


def test_invalid_json_line_names_file_line_and_json_error(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b",}\n[1, 2]\n')
    with pytest.raises(DataError) as e:
        read_records(path)
    assert f"{path}:2: invalid JSON: Expecting property name enclosed in double quotes" in str(e.value)
    assert f"{path}:3: expected a JSON object" in str(e.value)
    assert e.value.count == 2


def test_invalid_json_file_names_the_line(tmp_path: Path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"prompt": "a"},\n  {"prompt" "b"}\n]')
    with pytest.raises(DataError, match=r"bad\.json:3: invalid JSON: Expecting ':' delimiter"):
        read_records(path)
    path.write_text('{"rows": []}')
    with pytest.raises(DataError, match=r'expected a JSON list of objects or \{"data": \[...\]\}, got dict'):
        read_records(path)


@pytest.mark.parametrize("content", ["", "\n\n", "[]", '{"data": []}'])
def test_empty_file_is_an_error(content: str, tmp_path: Path):
    path = tmp_path / ("empty.json" if content.startswith(("[", "{")) else "empty.jsonl")
    path.write_text(content)
    with pytest.raises(DataError, match="holds no records"):
        read_records(path)


def test_unsupported_or_missing_paths(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_records(tmp_path / "nope.jsonl")
    (tmp_path / "data.csv").write_text("prompt\na\n")
    with pytest.raises(DataError, match=r"unsupported file type '\.csv'; use one of \.jsonl"):
        read_records(tmp_path / "data.csv")
    (tmp_path / "some_dir").mkdir()
    with pytest.raises(DataError, match="not one written by `datasets` save_to_disk"):
        read_records(tmp_path / "some_dir")


def test_dataset_dict_without_train_split_lists_splits(tmp_path: Path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(RECORDS)
    datasets.DatasetDict({"validation": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r'without a "train" split \(splits: test, validation\)'):
        read_records(tmp_path / "dd")
