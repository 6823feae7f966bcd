"""One benchmark run of OUR trainer, in its own process: ``python child_ours.py SPEC.json RESULT.json``.

SPEC: {"algo": "ppo" | "grpo", "threads": int, "config": {...}} — the config goes through the public API
(``rlhf.config.config_from_dict`` → ``rlhf.trainers.<algo>.run``), as the CLI does. RESULT: the per-step
records ``measure.summarize`` reads (from the run's metrics.jsonl), the process's peak RSS and the peak RSS
of each phase of each step (:class:`PhaseMemory`).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from planned import record_plans
from procmem import peak_rss_mb, status_mb

OTHER = "other"
"""The part of a step outside the trainer's timed phases (PPO's reward scoring, metrics, logging)."""


class PhaseMemory:
    """Peak RSS of every phase the trainer times, read by wrapping ``rlhf.runlog.metrics.Stopwatch``.

    The trainers make one ``Stopwatch`` per step and time ``with watch("rollout"):``, ``"logprobs"`` and
    ``"train"``. At each phase's start and end, and when a step's watch is made, this reads the process's
    high-water mark (``VmHWM``) and resets it (``echo 5 > /proc/self/clear_refs``): the reading at a phase's
    end is that phase's peak, the one at its start the peak of the stretch of the step since the last phase
    (``other``: in PPO the reward model scores between "rollout" and "logprobs"; in GRPO it scores inside
    "rollout"). Each peak is the whole process's RSS (every model, optimizer state, the libraries), not an
    increment. Nothing under ``src/`` changes; the readings cost well under a millisecond each, taken
    outside the phases' own timing.

    Resetting VmHWM loses the peak before it (and lowers ``ru_maxrss``), so the run's overall peak is tracked
    here: the VmHWM read before the first reset (start-up, model loading), every VmHWM read since, and a last
    one after the trainer returns (held-out answers, saving). If /proc/self/clear_refs cannot be written,
    nothing is reset: ``phase_peaks`` is None (with the reason in ``note``) and VmHWM stays the overall peak.
    """

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []  # per Stopwatch (one per step): phase -> peak MB
        self.peak = 0.0
        self.rss_start: float | None = None
        self.resets = True
        self.note: str | None = None
        self.depth = 0

    def _read_and_reset(self) -> float:
        """The high-water mark since the last reset (MB); then a new one starts from the current RSS."""
        hwm = status_mb("VmHWM")
        self.peak = max(self.peak, hwm)
        if self.resets:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError as error:
                self.resets = False
                self.note = f"/proc/self/clear_refs is not writable ({error}): no per-phase peaks"
        return hwm

    def _other(self, hwm: float) -> None:
        if self.steps and self.resets:
            self.steps[-1][OTHER] = max(self.steps[-1].get(OTHER, 0.0), hwm)

    def new_step(self) -> None:
        if self.rss_start is None:  # the first step: the models are loaded, nothing reset yet
            self.rss_start = status_mb("VmRSS")
            self.peak = max(self.peak, peak_rss_mb())
        self._other(self._read_and_reset())  # the end of the previous step
        self.steps.append({})

    def phase_start(self) -> None:
        self.depth += 1
        if self.depth == 1:  # a nested phase stays inside its outer one
            self._other(self._read_and_reset())

    def phase_end(self, phase: str) -> None:
        self.depth -= 1
        if self.depth == 0:
            hwm = self._read_and_reset()
            if self.steps and self.resets:
                self.steps[-1][phase] = max(self.steps[-1].get(phase, 0.0), hwm)

    def finish(self) -> float:
        """The run's overall peak RSS (MB), after the trainer returned."""
        self.peak = max(self.peak, status_mb("VmHWM"))
        if self.rss_start is None:  # no step ran: nothing was reset
            self.peak = max(self.peak, peak_rss_mb())
        return self.peak

    def phase_peaks(self) -> list[dict[str, float]] | None:
        """Per step, each phase's peak RSS in MB (the trainer's phases in order, then ``other``)."""
        if not self.resets:
            return None
        return [{k: v for k, v in step.items() if k != OTHER} | ({OTHER: step[OTHER]} if OTHER in step else {})
                for step in self.steps]  # fmt: skip

    def install(self) -> None:
        """Wrap ``Stopwatch.__init__`` (a new step) and ``Stopwatch.__call__`` (a phase) — the class the
        trainers import, so they see the wrapped methods."""
        from rlhf.runlog.metrics import Stopwatch

        memory, init, call = self, Stopwatch.__init__, Stopwatch.__call__

        def __init__(watch, *phases: str) -> None:
            memory.new_step()
            init(watch, *phases)

        @contextlib.contextmanager
        def __call__(watch, phase: str):
            memory.phase_start()
            try:
                with call(watch, phase):
                    yield
            finally:
                memory.phase_end(phase)

        Stopwatch.__init__, Stopwatch.__call__ = __init__, __call__


def step_record(row: dict, sequences: int) -> dict:
    """A metrics.jsonl row → the phase split of measure.PHASES (time/rollout_s is sampling alone)."""
    return {
        "step_s": row["time/step_s"],
        "generate_s": row["time/rollout_s"],
        "reward_s": row["time/score_s"],
        "score_s": row["time/logprobs_s"],
        "train_s": row["time/train_s"],
        "sequences": sequences,
        "gen_tokens": row["response/tokens"],
        "gen_columns": row["response/length_max"],
    }


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    import transformers

    import rlhf
    from rlhf.config import config_from_dict

    algo = spec["algo"]
    config = config_from_dict(algo, spec["config"])
    trainer = __import__(f"rlhf.trainers.{algo}", fromlist=["run"])
    after_import = peak_rss_mb()
    memory = PhaseMemory()
    memory.install()
    plans = record_plans()
    trainer.run(config)
    peak = memory.finish()
    rows = [json.loads(line) for line in (Path(config.output_dir) / "metrics.jsonl").read_text().splitlines()]
    sequences = config.batch.size * getattr(getattr(config, algo), "group_size", 1)
    steps = [step_record(row, sequences) for row in rows if "time/step_s" in row]
    phase_peaks, note = memory.phase_peaks(), memory.note
    if phase_peaks is not None and len(phase_peaks) != len(steps):
        note = f"{len(phase_peaks)} stopwatches for {len(steps)} logged steps: per-phase peaks left out"
        phase_peaks = None
    result = {
        "steps": steps,
        "peak_rss_mb": peak,
        "rss_after_import_mb": after_import,
        "rss_start_mb": memory.rss_start,
        "planned_peak_mb": plans[0].peak / 2**20,
        "phase_peaks": phase_peaks,
        "phase_peaks_note": note,
        "threads": torch.get_num_threads(),
        "versions": {
            "rlhf": getattr(rlhf, "__version__", "editable"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    Path(sys.argv[2]).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
