"""Live alarms: the training doctor (`rlhf.doctor.rules`) watching a ppo/grpo run as it logs.

Every logged row goes through a `rlhf.doctor.watch.Watch`, the same one ``rlhf doctor`` replays afterwards, so a finding
starts and clears at the same steps live and after the fact (what users see: the README's "Training doctor"). Events are
appended to ``output_dir/doctor.jsonl``, fsynced. A resumed run replays the rows it kept through the watch first,
silently, and drops the events of the steps it will run again, as ``metrics.jsonl`` drops their rows."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf.doctor.rules import SEVERITIES, Event
from rlhf.doctor.watch import Watch
from rlhf.runlog.durable import AppendLog
from rlhf.runlog.rundir import atomic_open

EVENTS_FILE = "doctor.jsonl"


class HealthLog:
    """The doctor of one run (rank 0). ``observe(row)`` after each logged row; ``notes()`` for the progress bar;
    ``stop``: the event that asks the run to stop (``stop_on``), else None."""

    def __init__(
        self,
        output_dir: Path,
        config: Mapping[str, Any],
        kept_rows: Sequence[Mapping[str, Any]],
        resume_step: int | None,
        stop_on: str = "never",
    ):
        self.watch = Watch(config)
        for row in kept_rows:  # the steps before a resume: the watch remembers them, nothing is said again
            self.watch.observe(row)
        path = Path(output_dir) / EVENTS_FILE
        if resume_step is not None and path.exists():
            kept = [line for line in path.read_text().splitlines() if _step_of(line) < resume_step]
            with atomic_open(path) as f:
                f.writelines(line + "\n" for line in kept)
        self._log = AppendLog.open(path)
        self.stop_on = stop_on
        self.stop: Event | None = None
        self.say: Callable[[str], None] = lambda message: print(message, file=sys.stderr)
        """Where the messages go: stderr, or above the progress bar while one is shown."""

    def observe(self, row: Mapping[str, Any]) -> list[Event]:
        events = self.watch.observe(row)
        for event in events:
            self._log.append(event.to_dict())
            self.say(event.message())
            if event.kind == "start" and self.stop is None and self._stops_on(event.rule.severity):
                self.stop = event
        return events

    def _stops_on(self, severity: str) -> bool:
        return self.stop_on != "never" and SEVERITIES.index(severity) >= SEVERITIES.index(self.stop_on)

    def notes(self) -> list[str]:
        """One line per finding that holds now: severity, rule, since which step, the latest evidence."""
        return [
            f"doctor [{rule.severity}] {rule.name} since step {since}: {evidence}"
            for rule, since, evidence in self.watch.now()
        ]

    def close(self) -> None:
        self._log.close()


def _step_of(line: str) -> float:
    """The step of an event line; a line that cannot be read sorts last (dropped on resume)."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")
