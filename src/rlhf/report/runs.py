"""A ppo or grpo run directory as the report reads it: its config, metric rows and held-out samples (`Run`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from rlhf.config import ConfigError
from rlhf.doctor.rules import Finding, History
from rlhf.doctor.watch import diagnose


@dataclasses.dataclass(frozen=True)
class Run:
    """What a ppo/grpo run directory holds: its config, its metric rows and its held-out samples."""

    path: Path
    label: str
    command: str
    config_text: str
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    samples: dict[int, list[dict[str, Any]]]
    """Step → the rows of ``samples/step_NNNNNN.jsonl``."""

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the rows that logged ``key`` with a finite value."""
        rows = finite_rows(self.rows, key)
        return [int(row["step"]) for row in rows], [float(row[key]) for row in rows]

    def has(self, key: str) -> bool:
        return bool(self.series(key)[0])

    @property
    def clipped_from(self) -> int | None:
        """The step at which the clipped objective took over from the vanilla policy-gradient warm-up
        (``warmup_pg_steps``; ``policy/clipped`` goes from 0 to 1), or None for a run without a warm-up."""
        steps, values = self.series("policy/clipped")
        if not values or values[0] != 0.0:
            return None
        return next((step for step, value in zip(steps, values, strict=True) if value == 1.0), None)

    @property
    def policy(self) -> str:
        """The model the run started from (``model.name``; ``policy`` in a run recorded by rlhf 0.1)."""
        model = self.config.get("model")
        return str(model.get("name", "?") if isinstance(model, dict) else self.config.get("policy", "?"))

    @functools.cached_property
    def findings(self) -> list[Finding]:
        """The training doctor's findings on this run: what ``rlhf doctor RUN_DIR`` (and the live alarms) name."""
        return diagnose(History(self.rows, self.config))

    def reward_weights(self) -> dict[str, float]:
        """Reward source name → weight, for a reward list; empty for a single source."""
        reward = self.config.get("reward")
        if isinstance(reward, dict):  # the reward section (a run recorded by rlhf 0.1 holds the list itself)
            reward = reward.get("source")
        if not isinstance(reward, list):
            return {}
        return {str(entry["name"]): float(entry.get("weight", 1.0)) for entry in reward}


def finite_rows(rows: Iterable[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    return [row for row in rows if all(isinstance(row.get(k), int | float) and math.isfinite(row[k]) for k in keys)]


def load_run(path: str | Path, label: str | None = None) -> Run:
    """Read a ppo/grpo output directory; FileNotFoundError / ConfigError say what is missing or wrong."""
    path = Path(path)
    for name in ("metrics.jsonl", "config.yaml"):
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"{path / name} does not exist: RUN_DIR must be the output_dir of a ppo or grpo run"
            )
    config_text = (path / "config.yaml").read_text()
    command = _command_of(config_text)
    if command not in ("ppo", "grpo"):
        raise ConfigError(f"{path} is the output of `rlhf {command}`; rlhf report reads ppo and grpo runs")
    rows = [row for row in read_jsonl(path / "metrics.jsonl") if "step" in row]
    samples = {
        int(file.stem.removeprefix("step_")): read_jsonl(file)
        for file in sorted((path / "samples").glob("step_*.jsonl"))
    }
    config = yaml.safe_load(config_text) or {}
    return Run(path, label or command, command, config_text, config, rows, samples)


def _command_of(config_text: str) -> str:
    """The command from the first line every run writes: ``# rlhf <command>: resolved config …``."""
    first = config_text.splitlines()[0] if config_text else ""
    if first.startswith("# rlhf ") and ":" in first:
        return first.removeprefix("# rlhf ").split(":", 1)[0].strip()
    return "unknown"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file. A cut-off last line (a run still writing, or killed mid-write) is left out,
    so a report can be made of a run in progress; a broken line before it is an error naming file:line."""
    lines = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    rows = []
    for n, line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == lines[-1][0]:
                break
            from rlhf.data.files import DataError  # `rlhf report` shows it as one clean error line

            raise DataError([f"{path}:{n}: not a JSON line ({e.msg})"]) from None
    return rows
