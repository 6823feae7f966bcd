"""One benchmark run of OUR trainer, in its own process: ``python child_ours.py SPEC.json RESULT.json``.

SPEC: {"algo": "ppo" | "grpo", "threads": int, "config": {...}} — the config goes through the public API
(``rlhf.config.config_from_dict`` → ``rlhf.trainers.<algo>.run``), as the CLI does. RESULT: the per-step
records ``measure.summarize`` reads (from the run's metrics.jsonl) and the process's peak RSS.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path


def rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
    after_import = rss_mb()
    trainer.run(config)
    peak = rss_mb()
    rows = [json.loads(line) for line in (Path(config.output_dir) / "metrics.jsonl").read_text().splitlines()]
    sequences = config.batch.size * getattr(getattr(config, algo), "group_size", 1)
    steps = [step_record(row, sequences) for row in rows if "time/step_s" in row]
    result = {
        "steps": steps,
        "peak_rss_mb": peak,
        "rss_after_import_mb": after_import,
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
