"""The rollout engines side by side: seconds per GRPO step and per rollout, and the sampler/trainer mismatch, for
rlhf's lean decoder, the model's own forward (hf) and vLLM's CPU build (colocated), on the benchmark's policies.

    make vllm-venv                               # once: vLLM's CPU build in .venv-vllm (docs/vllm.md)
    python benchmarks/engines.py                 # 3M and 25M policies
    python benchmarks/engines.py --sizes 3m,25m,110m --steps 8

Every run is ``rlhf grpo`` in its own process with the vLLM virtualenv's Python (the same torch 2.13 CPU build as
.venv, so the three engines run on the same kernels): ``batch.size`` 8 prompts × 4 samples, 64 new tokens at
temperature 1, the length-penalty reward, one update per step. Times are medians over the steps after the first two
(vLLM's first steps warm its caches). Writes results/engines.json (the sizes not measured this time are kept) and
prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import run as bench

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("lean", "hf", "vllm")


def grpo(python: str, policy: str, prompts: str, engine: str, steps: int, out: Path) -> list[dict]:
    """The training rows of one run."""
    flags = {
        "model.name": policy,
        "data.train": prompts,
        "output_dir": str(out),
        "reward.source": "rlhf.rollout.verifiers:length_penalty",
        "grpo.steps": steps,
        "batch.size": 8,
        "grpo.group_size": 4,
        "sampling.max_new_tokens": 64,
        "sampling.temperature": 1.0,
        "sampling.engine": engine,
        "sampling.vllm.memory_fraction": 0.1,
        "run.eval_every": 0,
        "run.save_every": 0,
    }
    command = [python, "-m", "rlhf", "grpo", *(f"--{k}={v}" for k, v in flags.items()), "--run.no_progress"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    if done.returncode != 0:
        raise SystemExit(f"{engine}: rlhf grpo failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "reward/mean" in row]


def measure(python: str, size: str, assets: dict, steps: int) -> list[dict]:
    results = []
    for engine in ENGINES:
        with tempfile.TemporaryDirectory() as tmp:
            rows = grpo(python, assets["models"][size]["policy"], assets["prompts"], engine, steps, Path(tmp) / "run")
        timed = rows[2:]
        results.append(
            {
                "size": size,
                "engine": engine,
                "step_s": statistics.median(r["time/step_s"] for r in timed),
                "rollout_s": statistics.median(r["time/rollout_s"] for r in timed),
                "tokens_per_step": statistics.median(r["response/tokens"] for r in timed),
                "logprob_diff_mean": statistics.fmean(r["rollout/logprob_diff_mean"] for r in rows),
                "logprob_diff_max": max(r["rollout/logprob_diff_max"] for r in rows),
            }
        )
        print(json.dumps(results[-1]), flush=True)
    return results


def table(results: list[dict]) -> str:
    lines = [
        "| policy | engine | s/step | rollout s/step | rollout time / lean's | \\|Δ log p\\| mean | \\|Δ log p\\| max |",
        "|---|---|---|---|---|---|---|",
    ]
    lean = {r["size"]: r["rollout_s"] for r in results if r["engine"] == "lean"}
    for r in results:
        lines.append(
            f"| {r['size']} | {r['engine']} | {r['step_s']:.3f} | {r['rollout_s']:.3f} | "
            f"{r['rollout_s'] / lean[r['size']]:.2f}× | {r['logprob_diff_mean']:.1e} | {r['logprob_diff_max']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="3m,25m", help=f"comma-separated, out of {','.join(bench.SIZES)}")
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps per run (the first two are not timed)")
    parser.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"), help="vLLM's Python")
    args = parser.parse_args()
    if not Path(args.python).exists():
        sys.exit(f"no vLLM virtualenv at {args.python}: `make vllm-venv` builds it")
    sizes = args.sizes.split(",")
    assets = bench.build_assets(set(sizes))
    results = [row for size in sizes for row in measure(args.python, size, assets, args.steps)]
    path = bench.RESULTS / "engines.json"
    kept = [row for row in json.loads(path.read_text()) if row["size"] not in sizes] if path.exists() else []
    results = sorted(
        kept + results, key=lambda row: (list(bench.SIZES).index(row["size"]), ENGINES.index(row["engine"]))
    )
    bench.RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
