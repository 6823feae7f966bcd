"""How the doctor's rules check a history and are declared. Most rules check one shape, a metric past a fixed limit in
each of its last few rows: a `Limit`, data. The others are functions whose keyword defaults are their numbers. Either
way a rule's numbers are written once, and its text (``Rule.threshold``, the README's table) and its evidence are made
from them; `RuleBook` collects the rules in the order they are declared."""

from __future__ import annotations

import dataclasses
import inspect
import statistics
import string
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from rlhf.doctor.history import History, Rule, Severity

F = TypeVar("F", bound=Callable[..., str | None])


class _Numbers(string.Formatter):
    """A rule's numbers as its texts write them: ``{x:%}`` 0.93 → "93 %", ``{x:e}`` 0.001 → "1e-3"; other
    format specs as `format`."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "%":
            return f"{100 * value:g} %"
        if format_spec == "e":
            return f"{value:.0e}".replace("e-0", "e-")
        return super().format_field(value, format_spec)


text = _Numbers().format


def tail(values: Sequence[float], n: int) -> list[float] | None:
    """The last ``n`` values, or None while there are fewer."""
    return list(values[-n:]) if len(values) >= n else None


def started_at(values: Sequence[float], n: int = 3) -> float:
    """The median of the first ``n`` values: where a metric started, robust to one odd first step."""
    return statistics.median(values[:n])


def each(h: History, key: str, n: int, holds: Callable[[float], bool]) -> list[float] | None:
    """The last ``n`` values of ``key`` when each ``holds`` and the last row holds the metric (it is about now)."""
    last = tail(h.values(key), n)
    return last if last and h.current(key) is not None and all(map(holds, last)) else None


_PAST: dict[str, Callable[[float, float], bool]] = {
    ">": lambda value, limit: value > limit,
    "<": lambda value, limit: value < limit,
    "≥": lambda value, limit: value > limit - 1e-9,  # a share such as 9 / 10 may land a rounding under 0.9
}


@dataclasses.dataclass(frozen=True)
class Limit:
    """The check most rules share: ``metric`` past ``limit`` (``op``) in each of its last ``window`` values, the
    last row among them. ``text`` (when it fires) and ``evidence`` are templates of these fields, of ``value``
    (the metric's last value, in ``fmt``) and of ``since`` (" after step N" for a rule silent up to step N)."""

    metric: str
    op: Literal[">", "<", "≥"]
    limit: float
    window: int
    fmt: str = ".2f"
    unit: str = ""
    """After the limit in ``text`` (not in the evidence, where the metric's name says what it counts)."""
    after: int = 0
    """Silent up to this step (0: from the first)."""
    text: str = "{op} {limit}{unit} for {window} steps{since}"
    evidence: str = "{metric} {value} ({op} {limit} for the last {window} steps)"
    unless: Callable[[History], bool] | None = None
    """Silent for the runs this says yes to."""

    def __call__(self, h: History) -> str | None:
        if (self.after and h.step <= self.after) or (self.unless is not None and self.unless(h)):
            return None
        last = each(h, self.metric, self.window, lambda value: _PAST[self.op](value, self.limit))
        return None if last is None else self.format(self.evidence, value=format(last[-1], self.fmt))

    def format(self, template: str, **more: str) -> str:
        since = f" after step {self.after}" if self.after else ""
        return text(template, since=since, **vars(self), **more)


class RuleBook:
    """Rules in the order they are declared: `check` adds the rule of a function, `limit` the rule of a `Limit`."""

    def __init__(self) -> None:
        self.rules: list[Rule] = []

    def check(
        self, severity: Severity, metrics: tuple[str, ...], *, threshold: str, hold: int | None = None, **texts: str
    ) -> Callable[[F], F]:
        """A decorator: the rule of the function's name, with its texts (reason, diagnosis, fix). The function's
        keyword defaults are its numbers, and ``threshold`` (when it fires) is a template of them. ``hold``: by
        default ``window`` + 2 for a function with a ``window`` (its condition in each of its last rows), else 3."""

        def add(check: F) -> F:
            params = inspect.signature(check).parameters.values()
            numbers = {p.name: p.default for p in params if p.default is not p.empty}
            hold_ = hold or (numbers["window"] + 2 if "window" in numbers else 3)
            when = text(threshold, **numbers)
            self.rules.append(Rule(check.__name__, severity, metrics, when, check=check, hold=hold_, **texts))
            return check

        return add

    def limit(self, name: str, severity: Severity, limit: Limit, *, hold: int | None = None, **texts: str) -> None:
        """The rule ``name``: it fires when ``limit`` holds, and clears after ``hold`` quiet rows (by default
        its window + 2: `Rule.hold`)."""
        when = limit.format(limit.text)
        self.rules.append(
            Rule(name, severity, (limit.metric,), when, check=limit, hold=hold or limit.window + 2, **texts)
        )
