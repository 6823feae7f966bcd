"""``rlhf report RUN_DIR``: one self-contained HTML page about a ppo or grpo run (or a whole ``rlhf demo``).

The page reads only what the run wrote — ``config.yaml``, ``metrics.jsonl`` and ``samples/step_*.jsonl`` —
and embeds every plot as a PNG data URI, so the file can be mailed or attached to an issue as it is. Its
sections: the README (after the demo's results); how to read the reward-against-KL plot: `gain_chart`'s
caption. Its modules: docs/architecture.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlhf.config import ReportConfig
from rlhf.report.demo import demo_report
from rlhf.report.pages import run_report
from rlhf.report.runs import load_run


def build(run_dir: str | Path, max_samples: int = 12) -> str:
    """The report's HTML for a ppo/grpo run directory, or for an ``rlhf demo`` output directory."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory: pass the output_dir of a ppo/grpo run or of rlhf demo")
    if (path / "summary.json").is_file() and (path / "ppo" / "metrics.jsonl").is_file():  # an rlhf demo
        return demo_report(path, max_samples)
    return run_report(load_run(path), max_samples)


def write(run_dir: str | Path, output: str | Path | None = None, max_samples: int = 12) -> Path:
    target = Path(output) if output is not None else Path(run_dir) / "report.html"
    text = build(run_dir, max_samples)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


def run(config: ReportConfig) -> Path:
    """`rlhf report`: write the report and say where it is."""
    path = write(config.run_dir, config.output, config.max_samples)
    print(f"report: {path} ({path.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)
    return path
