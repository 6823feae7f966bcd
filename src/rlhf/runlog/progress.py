"""A rich progress bar for training loops: step, s/step and the few numbers worth watching."""

from __future__ import annotations

import math
from typing import Any

SHOWN = (("reward/mean", "reward"), ("kl/mean", "kl"), ("policy/entropy", "entropy"), ("train/loss", "loss"))


class StepProgress:
    """``with StepProgress(total, start, enabled) as p: p.update(step, metrics)``; silent when disabled."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True, description: str = "train"):
        self.total, self.start, self.enabled, self.description = total, start, enabled, description
        self._progress: Any = None

    def __enter__(self) -> StepProgress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), TextColumn("{task.fields[stats]}"),
            )  # fmt: skip
            self._progress.start()
            self._task = self._progress.add_task(
                self.description, total=self.total, completed=self.start, rate="", stats=""
            )
        return self

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        if self._progress is None:
            return
        parts = []
        for key, label in SHOWN:
            value = metrics.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                parts.append(f"{label} {value:.3g}")
        step_s = metrics.get("time/step_s")
        rate = f"{step_s:.2f} s/step" if isinstance(step_s, int | float) else ""
        self._progress.update(self._task, completed=step, rate=rate, stats="  ".join(parts))

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
