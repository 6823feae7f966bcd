"""Rich progress bars on stderr (stdout may carry results): training loops (step, s/step and the few numbers worth
watching) and passes over prompts (``rlhf sample``, ``rlhf eval``)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from collections.abc import Iterator
from typing import Any, Self

SHOWN = (("reward/mean", "reward"), ("kl/mean", "kl"), ("policy/entropy", "entropy"), ("train/loss", "loss"))


class StepProgress:
    """``with StepProgress(total, start, enabled) as p: p.update(step, metrics)``; silent when disabled. The live
    alarms of ``health`` (`rlhf.runlog.health.HealthLog`) print above the bar, the findings that hold under it."""

    rate = True  # a column for the seconds per step

    def __init__(
        self, total: int, start: int = 0, enabled: bool = True, description: str = "train", health: Any = None
    ):
        self.total, self.start, self.enabled, self.description = total, start, enabled, description
        self.health = health
        self._progress: Any = None

    def __enter__(self) -> Self:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
        from rich.text import Text

        health = self.health

        class _Progress(Progress):
            def get_renderables(self) -> Iterator[Any]:
                yield from super().get_renderables()
                for note in health.notes() if health is not None else []:
                    yield Text(note, style="yellow", overflow="ellipsis", no_wrap=True)

        self._progress = _Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            *([TextColumn("{task.fields[rate]}")] if self.rate else []),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
            console=Console(stderr=True),
        )
        if health is not None:
            console, self._said = self._progress.console, health.say
            health.say = lambda message: console.print(message, markup=False, highlight=False)
        self._progress.start()
        self._task = self._progress.add_task(
            self.description, total=self.total, completed=self.start, rate="", stats=""
        )
        return self

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        if self._progress is None:
            return
        stats = "  ".join(
            f"{label} {value:.3g}"
            for key, label in SHOWN
            if isinstance(value := metrics.get(key), int | float) and math.isfinite(value)
        )
        step_s = metrics.get("time/step_s")
        rate = f"{step_s:.2f} s/step" if isinstance(step_s, int | float) else ""
        self._progress.update(self._task, completed=step, rate=rate, stats=stats)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            if self.health is not None:
                self.health.say = self._said


class BatchProgress(StepProgress):
    """A pass over prompts, no s/step column: ``with BatchProgress(total, "sample") as bar: bar.advance(n, stats)``."""

    rate = False

    def __init__(self, total: int, description: str, enabled: bool = True):
        super().__init__(total, enabled=enabled, description=description)

    def advance(self, n: int, stats: str = "") -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=n, stats=stats)


# Libraries whose console output is theirs, not the run's: progress bars ("Loading weights"), load reports,
# retry notices and deprecation/future warnings addressed to developers rather than to the user of `rlhf`.
LIBRARIES = ("transformers", "huggingface_hub", "datasets", "peft", "accelerate", "torch", "tokenizers")


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Keep library chatter off the console while a command runs (``rlhf --verbose`` goes without this): their
    loggers show errors only, their bars are off, their warnings (and deprecation/future warnings from anywhere:
    notices for whoever maintains the calling code) are ignored. Our own messages are printed, not logged, so
    they still show. Everything is restored on exit, for callers that run commands in-process."""
    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    levels = {logger: logger.level for logger in map(logging.getLogger, LIBRARIES)}
    hf_verbosity, hf_bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hub_bars_off = hub.are_progress_bars_disabled()
    datasets_bars = os.environ.get(DATASETS_BARS)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=rf"({'|'.join(LIBRARIES)})(\.|$)")
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        for logger in levels:
            logger.setLevel(logging.ERROR)
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        hub.disable_progress_bars()
        os.environ[DATASETS_BARS] = "1"  # read when `datasets` is imported (only for datasets directories)
        try:
            yield
        finally:
            for logger, level in levels.items():
                logger.setLevel(level)
            hf_logging.set_verbosity(hf_verbosity)
            if hf_bars:
                hf_logging.enable_progress_bar()
            if not hub_bars_off:
                hub.enable_progress_bars()
            if datasets_bars is None:
                os.environ.pop(DATASETS_BARS, None)
            else:
                os.environ[DATASETS_BARS] = datasets_bars


DATASETS_BARS = "HF_DATASETS_DISABLE_PROGRESS_BARS"
