"""What the trainer tests share about runs: reading metrics.jsonl, comparing two runs, interrupting one right
after a checkpoint, and counting or recording calls of a trainer's public functions."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from rlhf.runlog import train_state


def metric_rows(out: Path) -> list[dict]:
    """Every row of ``out/metrics.jsonl``."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train_rows(out: Path) -> list[dict]:
    """The training rows of a ppo/grpo run (held-out evaluation rows carry ``eval/...`` only)."""
    return [row for row in metric_rows(out) if "reward/mean" in row]


def comparable(rows: list[dict]) -> list[dict]:
    """The rows without their timings, which differ between any two runs."""
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "throughput/"))} for row in rows]


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def assert_same_checkpoint(expected: Path, got: Path) -> None:
    """The two runs' newest checkpoints hold the same state, to the bit: every weight, optimizer moment, schedule,
    data position, random generator (named ones and the process's global ones) and plain value."""
    from rlhf.runlog.checkpoint import list_checkpoints, load_checkpoint

    a, b = list_checkpoints(expected)[-1:], list_checkpoints(got)[-1:]
    assert a and b and a[0].name == b[0].name, (a, b)
    differences: list[str] = []

    def walk(x: object, y: object, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                differences.append(f"{path}: keys {sorted(map(str, x.keys() ^ y.keys()))}")
            for key in x.keys() & y.keys():
                walk(x[key], y[key], f"{path}/{key}")
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{path}[{i}]")
        elif isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if not torch.equal(x, y):
                differences.append(path)
        elif x != y:
            differences.append(f"{path}: {x!r} != {y!r}")

    walk(load_checkpoint(a[0]), load_checkpoint(b[0]), "")
    assert not differences, differences


def finite(row: dict, keys: list[str]) -> bool:
    return all(math.isfinite(row[k]) for k in keys)


class Interrupted(Exception):
    """Raised in place of a crash: the run stops right after a checkpoint."""


@contextlib.contextmanager
def dies_after_checkpoint(monkeypatch: pytest.MonkeyPatch, step: int) -> Iterator[None]:
    """The run inside stops (`Interrupted`) as soon as the checkpoint of ``step`` is on disk."""
    original = train_state.save_checkpoint

    def save_then_die(out, saved_step, state, *args, **kwargs):
        path = original(out, saved_step, state, *args, **kwargs)
        if saved_step == step:
            raise Interrupted
        return path

    with monkeypatch.context() as patch, pytest.raises(Interrupted):
        patch.setattr(train_state, "save_checkpoint", save_then_die)
        yield
    torch.manual_seed(1234)  # the process goes on with other random numbers drawn meanwhile, as a new one would


@contextlib.contextmanager
def counting(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str) -> Iterator[list[int]]:
    """Inside: ``module.name`` (a public function) counts its calls in the list yielded."""
    calls: list[int] = []
    original = getattr(module, name)
    with monkeypatch.context() as patch:
        patch.setattr(module, name, lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
        yield calls


def recording_micro_steps(monkeypatch: pytest.MonkeyPatch, trainer: ModuleType) -> list[dict]:
    """The stats of every micro-batch forward/backward of ``trainer.micro_step`` (ppo, grpo), in order."""
    calls: list[dict] = []
    original = trainer.micro_step

    def recording(*args, **kwargs):
        loss, stats = original(*args, **kwargs)
        calls.append({**stats, "ratio_dev": stats["ratio_dev_max"]})
        return loss, stats

    monkeypatch.setattr(trainer, "micro_step", recording)
    return calls


def assert_rows_match(expected: list[dict], got: list[dict], rel: float, abs: float) -> None:  # noqa: A002
    """The same rows with the same keys, each value within ``rel`` or ``abs`` of the expected one (NaN = NaN)."""
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        assert want.keys() == have.keys()
        for key in want:
            assert have[key] == pytest.approx(want[key], rel=rel, abs=abs, nan_ok=True), (
                want["step"], key,
            )  # fmt: skip
