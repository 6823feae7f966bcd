"""Metric sinks. ``metrics.jsonl`` always; TensorBoard, W&B and trackio when asked (imported lazily)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    """Tensors and numpy scalars → Python numbers; non-finite floats stay floats (JSON allows NaN via Python)."""
    if hasattr(value, "item"):
        value = value.item()
    return value


class MetricsLogger:
    """Writes one JSON object per step to ``output_dir/metrics.jsonl`` and forwards to optional sinks.

    ``append=True`` (resume) keeps earlier lines but drops any with ``step`` ≥ the resume step, so a run that
    died after logging but before checkpointing does not leave duplicate steps.
    """

    def __init__(
        self,
        output_dir: str | Path,
        report_to: tuple[str, ...] | list[str] = ("jsonl",),
        resume_step: int | None = None,
        run_config: dict[str, Any] | None = None,
    ):
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [line for line in self._lines() if json.loads(line).get("step", -1) < resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self._file = self.path.open("a")
        self._sinks: list[Any] = []
        for name in report_to:
            if name == "jsonl":
                continue
            self._sinks.append(_open_sink(name, Path(output_dir), run_config or {}))

    def _lines(self) -> list[str]:
        if not self.path.exists():
            return []
        return [line for line in self.path.read_text().splitlines() if line.strip()]

    def log(self, metrics: dict[str, Any]) -> dict[str, Any]:
        row = {key: _plain(value) for key, value in metrics.items()}
        self._file.write(json.dumps(row, allow_nan=True) + "\n")
        self._file.flush()
        step = int(row.get("step", 0))
        for sink in self._sinks:
            sink(row, step)
        return row

    def close(self) -> None:
        self._file.close()
        for sink in self._sinks:
            close = getattr(sink, "close", None)
            if close:
                close()


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

    def __init__(self, module_name: str, output_dir: Path, config: dict[str, Any]):
        import importlib

        self.module = importlib.import_module(module_name)
        self.module.init(project="rlhf", name=output_dir.name, config=config)

    def __call__(self, row: dict[str, Any], step: int) -> None:
        self.module.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self) -> None:
        self.module.finish()


def _open_sink(name: str, output_dir: Path, config: dict[str, Any]) -> Any:
    try:
        if name == "tensorboard":
            return _TensorBoard(output_dir / "tensorboard")
        if name in ("wandb", "trackio"):
            return _WandbLike(name, output_dir, config)
    except ImportError as err:
        raise RuntimeError(
            f"report_to includes {name!r} but it is not installed ({err}); pip install 'rlhf[tracking]'"
        ) from err
    raise ValueError(f"unknown metrics sink {name!r}; choose from jsonl, tensorboard, wandb, trackio")
