"""``rlhf doctor RUN_DIR``: read a run's ``metrics.jsonl`` and ``config.yaml`` (or those of each run in a directory of
runs), replay the rules over it and print the verdict; ``--json`` prints the same for tools. What it reads, the verdict
and the exit codes (`EXIT_CODES`): the README's 'Training doctor'.

Reading is forgiving on purpose — the doctor is what a user reaches for when a run went wrong: a torn last line (the
process died mid-write, or the run is writing it right now) and unreadable lines are skipped with a note saying so,
never a traceback."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path
from typing import Any, Protocol

import yaml

from rlhf.doctor.rules import RULES, SEVERITIES, Finding, History, count_text
from rlhf.doctor.watch import diagnose

EXIT_CODES = {"no_data": 0, "healthy": 0, "info": 0, "warning": 1, "critical": 2}
"""A run's status, from the least to the most worrying → the exit code of ``rlhf doctor`` (the worst run's, for
a directory of runs)."""
STATUSES = tuple(EXIT_CODES)


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What a run directory holds for the doctor: the command that wrote it, its config and its metric rows,
    plus notes about lines that could not be read."""

    path: Path
    command: str
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    notes: list[str]


@dataclasses.dataclass(frozen=True)
class Checkup:
    """The doctor's verdict on one run."""

    record: RunRecord
    findings: list[Finding]

    @property
    def status(self) -> str:
        if not self.record.rows:
            return "no_data"
        return max((f.rule.severity for f in self.findings), key=SEVERITIES.index, default="healthy")

    def to_dict(self) -> dict[str, Any]:
        steps = [row["step"] for row in self.record.rows]
        return {
            "run_dir": str(self.record.path),
            "command": self.record.command,
            "status": self.status,
            "rows": len(steps),
            "first_step": min(steps, default=None),
            "last_step": max(steps, default=None),
            "findings": [f.to_dict() for f in self.findings],
            "notes": self.record.notes,
        }


def is_run(path: Path) -> bool:
    return (path / "metrics.jsonl").is_file() and (path / "config.yaml").is_file()


def run_dirs(path: Path) -> list[Path]:
    """``path`` itself when it is a run, else the runs directly inside it (e.g. an ``rlhf demo`` directory); an
    ``rlhf rm --rm.ensemble`` run directory, there or given itself, stands for its members' runs."""
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory: pass the output_dir of an rlhf run")
    if is_run(path):
        return [path]
    runs = [run for child in (path, *sorted(path.iterdir())) if child.is_dir() for run in _runs_of(child)]
    if not runs:
        missing = [name for name in ("metrics.jsonl", "config.yaml") if not (path / name).is_file()]
        raise FileNotFoundError(
            f"{path} is not a run directory (no {' and no '.join(missing)}), nor a directory of runs: "
            "pass the output_dir of an rlhf sft/rm/dpo/ppo/grpo run, or of rlhf demo"
        )
    return runs


def _runs_of(directory: Path) -> list[Path]:
    """``directory`` when it is a run, its members' runs when it is a reward-model ensemble's, else none."""
    if is_run(directory):
        return [directory]
    members = directory / "members"  # rlhf.trainers.reward_model.MEMBERS (the doctor imports no trainer)
    return sorted(m for m in members.iterdir() if is_run(m)) if members.is_dir() else []


def read_run(path: Path) -> RunRecord:
    """The run in ``path``; lines of ``metrics.jsonl`` that are not JSON objects with a ``step`` are skipped
    with a note (a torn last line is what a crash mid-write, or a run writing right now, leaves)."""
    config_text = (path / "config.yaml").read_text(encoding="utf-8", errors="replace")
    first = config_text.splitlines()[0] if config_text else ""
    command = first.removeprefix("# rlhf ").split(":", 1)[0].strip() if first.startswith("# rlhf ") else "unknown"
    notes: list[str] = []
    try:
        config = yaml.safe_load(config_text)
    except yaml.YAMLError as e:
        config = None
        notes.append(
            f"config.yaml is not readable YAML ({' '.join(str(e).split())}): rules that read "
            "config limits (max_new_tokens, kl.target, monitors) are skipped"
        )
    metrics = path / "metrics.jsonl"
    # the text after the last newline is a line still being (or never) finished: kept when it is a complete row
    lines = metrics.read_bytes().decode("utf-8", errors="replace").split("\n")
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = _row(line)
        if row is not None:
            rows.append(row)
        elif number == len(lines):
            notes.append(
                f"{metrics}:{number}: the last line is incomplete (the run died while writing "
                f"it, or is writing it now), skipped"
            )
        else:
            notes.append(f"{metrics}:{number}: not a metrics row, skipped: {line[:60]!r}")
    return RunRecord(path, command, config if isinstance(config, dict) else {}, rows, notes)


def _row(line: str) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    ok = isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row.get("step"), bool)
    return row if ok else None


def examine(path: str | Path) -> list[Checkup]:
    records = [read_run(run_dir) for run_dir in run_dirs(Path(path))]
    return [Checkup(record, diagnose(History(record.rows, record.config))) for record in records]


# The verdict as text

WIDTH = 100


def render(checkups: list[Checkup]) -> str:
    text = "\n\n".join(_render_one(c) for c in checkups)
    if len(checkups) > 1:
        counts = {s: sum(c.status == s for c in checkups) for s in reversed(STATUSES)}
        text += f"\n\n{len(checkups)} runs: " + ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items() if n)
    return text + "\n"


def _render_one(checkup: Checkup) -> str:
    record, findings = checkup.record, checkup.findings
    steps = [row["step"] for row in record.rows]
    span = f"{len(steps)} rows, steps {min(steps)}–{max(steps)}" if steps else "no rows"
    lines = [f"{record.path} (rlhf {record.command}, {span})", *(f"  note: {note}" for note in record.notes)]
    if checkup.status == "no_data":
        lines.append("  no step logged yet: nothing to diagnose")
    elif not findings:
        lines.append(f"  healthy: none of the {len(RULES)} rules fired")
    else:
        lines.append("  " + count_text(findings))
        for f in findings:
            lines.append(f"  [{f.rule.severity}] {f.rule.name}: {f.rule.diagnosis}")
            for label, text in (("steps", f.steps_text), ("evidence", f.last), ("try", f.rule.fix)):
                lines += textwrap.wrap(text, WIDTH, initial_indent=f"      {label:<9}", subsequent_indent=" " * 15)
    return "\n".join(lines)


class Request(Protocol):
    """What `rlhf doctor` is asked (a `rlhf.config.DoctorConfig`; the doctor reads no other part of rlhf)."""

    run_dir: str
    json: bool


def run(config: Request) -> int:
    """`rlhf doctor`: print the verdict (text or JSON) on stdout; returns the exit code."""
    checkups = examine(config.run_dir)
    code = max((EXIT_CODES[c.status] for c in checkups), default=0)
    if config.json:
        worst = max((c.status for c in checkups), key=STATUSES.index)
        print(json.dumps({"status": worst, "exit_code": code, "runs": [c.to_dict() for c in checkups]}, indent=2))
    else:
        sys.stdout.write(render(checkups))
    return code
