"""What the doctor's rules read and what they say: a run's metric history (`History`), a rule (`Rule`), what it
found over a whole run (`Finding`) and a finding starting or clearing at a step (`Event`). The rules themselves:
`rlhf.doctor.rules`; `Watch`, that follows them row by row: `rlhf.doctor.watch`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


class History:
    """A run's metric rows (each with ``step``) and its config, with per-metric series parsed once and kept, so
    following a run of N rows costs O(N · window) per rule, not O(N²)."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None = None):
        self.rows = list(rows)
        self.config = config or {}
        self._series: dict[str, tuple[list[int], list[float]]] = {}
        self._prefixes: dict[tuple[str, str], list[float]] = {}

    def append(self, row: Mapping[str, Any]) -> None:
        """One more row at the end (a live run's newest step); the parsed series grow with it."""
        self.rows.append(row)
        for key in self._series:
            self._parse(key, len(self.rows) - 1)

    @property
    def step(self) -> int:
        return int(self.rows[-1].get("step", 0)) if self.rows else 0

    def last_row(self) -> Mapping[str, Any]:
        return self.rows[-1] if self.rows else {}

    def values(self, key: str) -> list[float]:
        """The finite values of ``key``, in order (the history's own list: read it, do not change it)."""
        return self._parsed(key)[1]

    def steps(self, key: str) -> list[int]:
        return self._parsed(key)[0]

    def prefix(self, name: str, key: str, fn: Callable[[list[float], int, list[float]], float]) -> list[float]:
        """A statistic of ``key``'s values at each position i, ``fn(values, i, out)`` from ``values[: i + 1]`` and
        the earlier ``out``; computed once per position and kept, so a check over the whole history (a running
        peak, a running minimum) costs O(1) per new row instead of O(rows)."""
        values = self.values(key)
        out = self._prefixes.setdefault((name, key), [])
        for i in range(len(out), len(values)):
            out.append(fn(values, i, out))
        return out

    def current(self, key: str) -> float | None:
        """``key`` in the last row when it holds a finite number, else None."""
        value = self.last_row().get(key)
        return float(value) if finite(value) else None

    def setting(self, *path: str, default: Any = None) -> Any:
        """A value of the run's config (``setting("sampling", "max_new_tokens")``), or ``default``."""
        node: Any = self.config
        for part in path:
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node

    def _parsed(self, key: str) -> tuple[list[int], list[float]]:
        if key not in self._series:
            self._series[key] = ([], [])
            for i in range(len(self.rows)):
                self._parse(key, i)
        return self._series[key]

    def _parse(self, key: str, i: int) -> None:
        """Row ``i`` into ``key``'s series (steps, values) when it holds a finite ``key``."""
        value = self.rows[i].get(key)
        if finite(value):
            steps, values = self._series[key]
            steps.append(int(self.rows[i].get("step", i + 1)))
            values.append(float(value))


def finite(value: Any) -> bool:
    """A number (not a bool) that is neither NaN nor ±inf."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One classic failure: what it reads, when it fires (``threshold``, and why: ``reason``), how bad it is,
    what it means in plain words and the config fields to change."""

    name: str
    severity: Severity
    metrics: tuple[str, ...]
    threshold: str
    reason: str
    diagnosis: str
    fix: str
    check: Callable[[History], str | None]
    hold: int = 3
    """Rows in a row without the condition before a finding clears: a condition that comes and goes with the
    noise is one finding, not an alarm that flaps. 1 for one-step events (a spike, a jump, a NaN); for a rule
    that needs its condition in each of its last k rows, k + 2, since one dip silences the check for k rows."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """A rule that fired: the steps where it held, grouped into episodes (runs of consecutive logged rows, as
    (first step, last step)), and the evidence at the first and the last of them."""

    rule: Rule
    steps: list[int]
    episodes: list[tuple[int, int]]
    first: str
    last: str

    @property
    def steps_text(self) -> str:
        """The episodes as people read them: ``3, 8–12``."""
        return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in self.episodes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule.name,
            "severity": self.rule.severity,
            "steps": self.episodes,
            "evidence": self.last,
            "first_evidence": self.first,
            "diagnosis": self.rule.diagnosis,
            "fix": self.rule.fix,
            "metrics": list(self.rule.metrics),
        }


def count_text(findings: Sequence[Finding]) -> str:
    """The findings counted by severity, most severe first (``1 critical, 2 warnings``); "" for none."""
    counts = {s: sum(f.rule.severity == s for f in findings) for s in reversed(SEVERITIES)}
    return ", ".join(f"{n} {s}{'s' if n > 1 and s != 'info' else ''}" for s, n in counts.items() if n)


@dataclasses.dataclass(frozen=True)
class Event:
    """A finding starting (``start``) or clearing (``clear``) at ``step``, with the evidence (for a clear, the
    last evidence while it held)."""

    kind: Literal["start", "clear"]
    step: int
    rule: Rule
    evidence: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "event": self.kind,
            "rule": self.rule.name,
            "severity": self.rule.severity,
            "evidence": self.evidence,
            "diagnosis": self.rule.diagnosis,
            "fix": self.rule.fix,
        }

    def message(self) -> str:
        """One line for the console."""
        if self.kind == "clear":
            return f"doctor: step {self.step}: {self.rule.name} cleared"
        return (
            f"doctor: step {self.step}: [{self.rule.severity}] {self.rule.name}: {self.rule.diagnosis} "
            f"({self.evidence}); try: {self.rule.fix}"
        )
