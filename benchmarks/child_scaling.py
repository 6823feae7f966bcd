"""One run of benchmarks/scaling.py, as one process or as one rank under torchrun.

    [torchrun ...] python child_scaling.py SPEC.json RESULT      # writes RESULT.rank<R>.json

SPEC: {"algo", "threads", "config"}. Each rank writes its peak RSS and the peak the memory plan predicts for it
(the plan of the trainer's own check at its start, `rlhf.planning.check`); rank 0 also the median step
time after the warm-up steps (from the run's metrics.jsonl).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from planned import record_plans
from procmem import peak_rss_mb

WARMUP_STEPS = 2


def main() -> None:
    spec, result = json.loads(Path(sys.argv[1]).read_text()), sys.argv[2]
    import torch

    torch.set_num_threads(spec["threads"])
    from rlhf.config import config_from_dict

    config = config_from_dict(spec["algo"], spec["config"])
    trainer = __import__(f"rlhf.trainers.{spec['algo']}", fromlist=["run"])
    from rlhf.planning import render

    plans = record_plans()
    trainer.run(config)
    planned = plans[0]
    rank = int(os.environ.get("RANK", 0))
    report = {"peak_rss_mb": peak_rss_mb(), "planned_peak_mb": planned.peak / 2**20, "plan": render(planned)}
    if rank == 0:
        rows = [json.loads(line) for line in (Path(config.output_dir) / "metrics.jsonl").read_text().splitlines()]
        times = [row["time/step_s"] for row in rows if "time/step_s" in row][WARMUP_STEPS:]
        report["s_per_step"] = statistics.median(times)
    Path(f"{result}.rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
    from rlhf.cli import exit_process

    exit_process(0)
