"""The memory plan against measurement: predicted and measured peak RSS per rank of `rlhf ppo` / `rlhf grpo`.

    python benchmarks/memory_plan.py                  # every case: 3M, 25M, 110M × none / ddp / fsdp × checkpointing
    python benchmarks/memory_plan.py --only ppo-3m    # some cases

Each run is a short training (3 steps: the peak is reached in the second) launched like benchmarks/scaling.py —
one process, or torchrun with 2 ranks — whose ranks report their peak RSS (VmHWM) and the peak of the plan the
trainer's own check made at its start (`rlhf.planning.check`). Results: benchmarks/results/memory_plan.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import run as bench  # the peer benchmark: tiny assets, logging
import scaling

SIZES = ("3m", "25m", "110m")
ALGOS = {"ppo": {**bench.PPO, "max_new_tokens": 32}, "grpo": {**bench.GRPO, "max_new_tokens": 32}}
LAYOUTS = {"none": 1, "ddp": 2, "fsdp": 2}
"""parallelism → processes."""
STEPS = 3


def run_one(algo: str, size: str, parallelism: str, checkpointing: bool, assets: dict, timeout: float) -> dict:
    processes = LAYOUTS[parallelism]
    folder = bench.WORK / "memory_plan" / f"{algo}-{size}-{parallelism}-{int(checkpointing)}"
    folder.mkdir(parents=True, exist_ok=True)
    models = assets["models"][size]
    config = bench.ours_config(
        algo, models, assets["prompts"], folder / "out", STEPS, ALGOS[algo], critic="shared" if algo == "ppo" else None,
        checkpointing=checkpointing, parallelism="auto" if processes == 1 else parallelism,
    )  # fmt: skip
    threads = max(1, (os.cpu_count() or 1) // processes)
    spec = folder / "spec.json"
    spec.write_text(json.dumps({"algo": algo, "threads": threads, "config": config}))
    scaling.launch(processes, threads, spec, folder / "result", timeout)
    ranks = [json.loads(Path(f"{folder / 'result'}.rank{r}.json").read_text()) for r in range(processes)]
    measured = max(r["peak_rss_mb"] for r in ranks)
    planned = max(r["planned_peak_mb"] for r in ranks)
    return {"algo": algo, "size": size, "parallelism": parallelism, "checkpointing": checkpointing,
            "measured_mb": measured, "planned_mb": planned, "ratio": planned / measured, "plan": ranks[0]["plan"]}  # fmt: skip


def render(rows: list[dict]) -> str:
    worst = max(abs(r["ratio"] - 1) for r in rows) if rows else 0.0
    lines = [
        "Peak RSS per rank (the largest rank), measured (VmHWM over the whole run) and as the memory plan predicts "
        f"it before any weight loads; {STEPS} steps, batch 16 sequences, 32 new tokens, float32. "
        f"Largest gap: {worst:.0%}.",
        "",
        "| algo | policy | parallelism | checkpointing | planned MB | measured MB | planned / measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['algo']} | {r['size'].upper()} | {r['parallelism']} | {'yes' if r['checkpointing'] else 'no'} | "
                     f"{r['planned_mb']:.0f} | {r['measured_mb']:.0f} | {r['ratio']:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated algo-size pairs, e.g. ppo-3m,grpo-110m")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    pairs = [tuple(p.split("-")) for p in args.only.split(",")] if args.only else [(a, s) for s in SIZES for a in ALGOS]
    assets = bench.build_assets({size for _, size in pairs})
    rows: list[dict] = []
    for algo, size in pairs:
        for parallelism in LAYOUTS:
            for checkpointing in (False, True):
                bench.log(f"{algo} {size}: {parallelism}, checkpointing {checkpointing}")
                rows.append(run_one(algo, size, parallelism, checkpointing, assets, args.timeout))
                bench.RESULTS.mkdir(exist_ok=True)
                (bench.RESULTS / "memory_plan.json").write_text(json.dumps(rows, indent=1))
                (bench.RESULTS / "memory_plan.md").write_text(render(rows))
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
