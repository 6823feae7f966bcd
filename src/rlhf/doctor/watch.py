"""The doctor's rules followed row by row: `Watch`, for a live run (the trainer hands it each row it logs) and a
finished one (`diagnose` replays the rows through one) alike, so a finding starts and clears at the same steps in
both. The rules themselves: `rlhf.doctor.rules`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlhf.doctor.history import SEVERITIES, Event, Finding, History, Rule
from rlhf.doctor.rules import RULES


class Watch:
    """The rules followed row by row: `observe` takes the next logged row and returns the findings that start
    or clear there; `holding` is what holds now, `findings()` everything that held so far. A finding starts at
    the first row where its check fires and clears once the check has been silent for ``rule.hold`` rows in a
    row; its episodes span from a start to the last row where the check fired."""

    def __init__(self, config: Mapping[str, Any] | None = None):
        self.history = History([], config)
        self.holding: dict[str, str] = {}
        """Rule name → its latest evidence, for the findings that hold at the last row."""
        self._held: dict[str, list[Any]] = {}  # rule name → [steps fired, episodes, first evidence, last evidence]
        self._silent: dict[str, int] = {}  # rule name → rows since its check last fired, while it holds

    def observe(self, row: Mapping[str, Any]) -> list[Event]:
        self.history.append(row)
        step, events = self.history.step, []
        for rule in RULES:
            if not any(key in row for key in rule.metrics):
                continue  # a row without any of the rule's metrics says nothing new about it
            found, name = rule.check(self.history), rule.name
            if found is None:
                if name in self.holding:
                    self._silent[name] += 1
                    if self._silent[name] >= rule.hold:
                        events.append(Event("clear", step, rule, self.holding.pop(name)))
                continue
            held = self._held.setdefault(name, [[], [], found, found])
            held[0].append(step)
            held[3] = found
            if name in self.holding:
                held[1][-1] = (held[1][-1][0], step)
            else:
                held[1].append((step, step))
                events.append(Event("start", step, rule, found))
            self.holding[name], self._silent[name] = found, 0
        return events

    def now(self) -> list[tuple[Rule, int, str]]:
        """The findings that hold at the last row, most severe first: (rule, the step it started, evidence)."""
        holding = [
            (rule, self._held[rule.name][1][-1][0], self.holding[rule.name])
            for rule in RULES
            if rule.name in self.holding
        ]
        return sorted(holding, key=lambda h: -SEVERITIES.index(h[0].severity))

    def findings(self) -> list[Finding]:
        """Every rule that held at some row so far, most severe first."""
        found = [
            Finding(rule, list(steps), list(episodes), first, last)
            for rule in RULES
            if rule.name in self._held
            for steps, episodes, first, last in [self._held[rule.name]]
        ]
        return sorted(found, key=lambda f: -SEVERITIES.index(f.rule.severity))


def diagnose(history: History) -> list[Finding]:
    """Every rule replayed over the history, row by row (as a live `Watch` sees it): the findings, most severe first."""
    watch = Watch(history.config)
    for row in history.rows:
        watch.observe(row)
    return watch.findings()
