"""Metric sinks — ``metrics.jsonl`` always; TensorBoard, W&B and trackio when asked (imported lazily) — the step
stopwatch, and :func:`open_run`, which opens a run's metrics, fresh or resumed."""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlhf.config import TrainingConfig, config_to_dict
from rlhf.runlog.distributed import Dist
from rlhf.runlog.health import HealthLog
from rlhf.runlog.rundir import atomic_open, clear_run, write_run_config


class Stopwatch:
    """Where a step's wall time goes: ``with watch("train"): ...`` adds the block's seconds to ``train``;
    ``metrics()`` gives ``time/<phase>_s`` of every phase named or timed and ``time/step_s`` (since creation)."""

    def __init__(self, *phases: str):
        self.start = time.perf_counter()
        self.seconds = dict.fromkeys(phases, 0.0)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        step = time.perf_counter() - self.start
        return {**{f"time/{phase}_s": s for phase, s in self.seconds.items()}, "time/step_s": step}


class NoLogger:
    """What ranks other than 0 log to under ``torchrun``: nothing (rank 0 writes the run's metrics)."""

    health = None

    def log(self, metrics: dict[str, Any]) -> dict[str, Any]:
        return metrics

    def close(self) -> None:
        pass


class MetricsLogger:
    """Writes one JSON object per step to ``output_dir/metrics.jsonl`` and forwards to optional sinks. ``resume_step``
    keeps the earlier rows (``kept``) but drops any with ``step`` ≥ it, so a run that died after logging but before
    checkpointing leaves no duplicate steps. ``health``: the doctor's live alarms, fed every row."""

    health: HealthLog | None = None

    def __init__(
        self,
        output_dir: str | Path,
        report_to: tuple[str, ...] | list[str] = ("jsonl",),
        resume_step: int | None = None,
        run_config: dict[str, Any] | None = None,
        run_name: str | None = None,
    ):
        self.path = Path(output_dir) / "metrics.jsonl"
        self.kept = [] if resume_step is None else [row for row in self._rows() if row.get("step", -1) < resume_step]
        # a temp file renamed over the old one: a kill mid-rewrite leaves the old rows, never an empty file
        with atomic_open(self.path) as f:
            f.writelines(json.dumps(row, allow_nan=True) + "\n" for row in self.kept)
        self._file = self.path.open("a")
        self._sinks = [
            _open_sink(name, Path(output_dir), run_config or {}, run_name) for name in report_to if name != "jsonl"
        ]

    def _rows(self) -> list[dict[str, Any]]:
        """The logged rows; a torn last line (the process died mid-write) is dropped, saying so on stderr."""
        if not self.path.exists():
            return []
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        rows = []
        for number, line in enumerate(lines, 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                if number < len(lines):
                    raise ValueError(f"{self.path}:{number}: not a JSON row ({e}); fix or remove it") from None
                print(f"resume: dropping the torn last line {number} of {self.path}: {line[:60]!r}", file=sys.stderr)
        return rows

    def log(self, metrics: dict[str, Any]) -> dict[str, Any]:
        # tensors and numpy scalars → Python numbers; non-finite floats stay floats (JSON allows NaN via Python)
        row = {key: value.item() if hasattr(value, "item") else value for key, value in metrics.items()}
        self._file.write(json.dumps(row, allow_nan=True) + "\n")
        self._file.flush()
        step = int(row.get("step", 0))
        for sink in self._sinks:
            sink(row, step)
        if self.health is not None:
            self.health.observe(row)
        return row

    def close(self) -> None:
        self._file.close()
        if self.health is not None:
            self.health.close()
        for sink in self._sinks:
            sink.close()


class _TensorBoard:
    def __init__(self, logdir: Path):
        from torch.utils.tensorboard import SummaryWriter  # lazy: needs the `tensorboard` package

        self.writer = SummaryWriter(str(logdir))

    def __call__(self, row: dict[str, Any], step: int) -> None:
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandbLike:
    """W&B and trackio share the ``init(...)`` / ``log(dict, step=)`` / ``finish()`` interface."""

    def __init__(self, module_name: str, name: str, config: dict[str, Any]):
        self.module = importlib.import_module(module_name)
        self.module.init(project="rlhf", name=name, config=config)

    def __call__(self, row: dict[str, Any], step: int) -> None:
        self.module.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self) -> None:
        self.module.finish()


def _open_sink(name: str, output_dir: Path, config: dict[str, Any], run_name: str | None) -> Any:
    """A tracker; the run is named `run_name`, or after its output directory."""
    try:
        if name == "tensorboard":
            return _TensorBoard(output_dir / "tensorboard" / (run_name or ""))
        if name in ("wandb", "trackio"):
            return _WandbLike(name, run_name or output_dir.name, config)
    except ImportError as err:
        raise RuntimeError(
            f"run.report_to includes {name!r} but it is not installed ({err}); pip install 'rlhf-kit[tracking]'"
        ) from err
    raise ValueError(f"unknown metrics sink {name!r}; choose from jsonl, tensorboard, wandb, trackio")


def open_run(config: TrainingConfig, checkpoint: Path | None, start: int, d: Dist) -> MetricsLogger | NoLogger:
    """Rank 0 (the others get a `NoLogger`): say whether the run resumes, write ``config.yaml`` and open
    ``metrics.jsonl``, with the doctor's live alarms when ``config.doctor.alarms``. Resuming from ``checkpoint``
    (step ``start``) keeps the metric rows before ``start + 1``; otherwise the previous run's files are deleted
    first, so nothing stale survives (`rlhf.runlog.rundir.claim` has refused a run nobody asked to replace)."""
    output_dir = Path(config.output_dir)
    if not d.is_main:
        return NoLogger()
    if checkpoint is not None:
        print(f"resuming from {checkpoint} (step {start})", file=sys.stderr)
    else:
        if config.run.resume:
            print(f"resume: no checkpoint under {output_dir / 'checkpoints'}; starting from step 0", file=sys.stderr)
        clear_run(output_dir)
    write_run_config(output_dir, config)
    resume_step = start + 1 if checkpoint is not None else None
    recorded = config_to_dict(config)
    logger = MetricsLogger(
        output_dir, config.run.report_to, resume_step=resume_step, run_config=recorded, run_name=config.run.name
    )
    doctor = getattr(config, "doctor", None)  # ppo and grpo
    if doctor is not None and doctor.alarms:
        logger.health = HealthLog(output_dir, recorded, logger.kept, resume_step, doctor.stop_on)
    return logger
