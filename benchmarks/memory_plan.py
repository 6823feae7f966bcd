"""The memory plan against measurement: predicted and measured peak RSS per rank of `rlhf ppo` / `rlhf grpo`.

    python benchmarks/memory_plan.py                  # every case: 3M, 25M, 110M × none / ddp / fsdp × checkpointing
    python benchmarks/memory_plan.py --only ppo-3m    # some cases
    python benchmarks/memory_plan.py --bf16 --layouts none --only ppo-110m   # bf16 mixed precision (CPU autocast)

Each run is a short training (3 steps: the peak is reached in the second) launched like benchmarks/scaling.py —
one process, or torchrun with 2 ranks — whose ranks report their peak RSS (VmHWM) and the peak of the plan the
trainer's own check made at its start (`rlhf.planning.check`). Results: benchmarks/results/memory_plan.{json,md}
(with ``--bf16``: memory_plan_bf16.{json,md}, the runs in ``model.bf16: true``: float32 master weights, bfloat16
frozen models and compute under CPU autocast, the same code a GPU runs).
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


def run_one(
    algo: str, size: str, parallelism: str, checkpointing: bool, assets: dict, timeout: float, bf16: bool = False
) -> dict:
    processes = LAYOUTS[parallelism]
    name = f"{algo}-{size}-{parallelism}-{int(checkpointing)}" + ("-bf16" if bf16 else "")
    folder = bench.WORK / "memory_plan" / name
    folder.mkdir(parents=True, exist_ok=True)
    models = assets["models"][size]
    config = bench.ours_config(
        algo, models, assets["prompts"], folder / "out", STEPS, ALGOS[algo], critic="shared" if algo == "ppo" else None,
        checkpointing=checkpointing, parallelism="auto" if processes == 1 else parallelism,
    )  # fmt: skip
    config["model"]["bf16"] = bf16
    threads = max(1, (os.cpu_count() or 1) // processes)
    spec = folder / "spec.json"
    spec.write_text(json.dumps({"algo": algo, "threads": threads, "config": config}))
    scaling.launch(processes, threads, spec, folder / "result", timeout)
    ranks = [json.loads(Path(f"{folder / 'result'}.rank{r}.json").read_text()) for r in range(processes)]
    measured = max(r["peak_rss_mb"] for r in ranks)
    planned = max(r["planned_peak_mb"] for r in ranks)
    return {"algo": algo, "size": size, "parallelism": parallelism, "checkpointing": checkpointing,
            "measured_mb": measured, "planned_mb": planned, "ratio": planned / measured, "plan": ranks[0]["plan"]}  # fmt: skip


def render(rows: list[dict], bf16: bool = False) -> str:
    worst = max(abs(r["ratio"] - 1) for r in rows) if rows else 0.0
    precision = "bf16 mixed precision (float32 master weights, CPU autocast)" if bf16 else "float32"
    lines = [
        "Peak RSS per rank (the largest rank), measured (VmHWM over the whole run) and as the memory plan predicts "
        f"it before any weight loads; {STEPS} steps, batch 16 sequences, 32 new tokens, {precision}. "
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
    parser.add_argument("--bf16", action="store_true", help="model.bf16: true (results in memory_plan_bf16.*)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, out of {','.join(LAYOUTS)}")
    args = parser.parse_args()
    stem = "memory_plan_bf16" if args.bf16 else "memory_plan"
    pairs = [tuple(p.split("-")) for p in args.only.split(",")] if args.only else [(a, s) for s in SIZES for a in ALGOS]
    assets = bench.build_assets({size for _, size in pairs})
    rows: list[dict] = []
    for algo, size in pairs:
        for parallelism in args.layouts.split(","):
            for checkpointing in (False, True):
                bench.log(f"{algo} {size}: {parallelism}, checkpointing {checkpointing}")
                rows.append(run_one(algo, size, parallelism, checkpointing, assets, args.timeout, args.bf16))
                bench.RESULTS.mkdir(exist_ok=True)
                (bench.RESULTS / f"{stem}.json").write_text(json.dumps(rows, indent=1))
                (bench.RESULTS / f"{stem}.md").write_text(render(rows, args.bf16))
    print(render(rows, args.bf16))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
