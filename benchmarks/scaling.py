"""Scaling: steps/s and peak memory per rank of `rlhf ppo` / `rlhf grpo`, one process against torchrun ranks.

    python benchmarks/scaling.py                  # every case, 10 steps per run, 3 interleaved repeats
    python benchmarks/scaling.py --quick          # 4 steps, 1 repeat
    python benchmarks/scaling.py --only ppo-3m    # some cases

Each case runs the same global batch as one process with all the machine's threads, and as ``torchrun`` with
2 ranks of one thread each (DDP, and FSDP2) — the same cores either way, so on one
machine the table shows what data parallelism costs (the collectives, the duplicated gathers and the
per-rank model copies), not a speed-up: that needs more hardware. Repeats go round all configurations in turn
and each keeps its fastest, since the machine's speed drifts. The communication a rank does per step is
computed, not measured: the gradient all-reduce of DDP and the parameter all-gathers + gradient
reduce-scatters of FSDP2, which is what predicts the cost on GPUs. Results: benchmarks/results/scaling.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import run as bench  # the peer benchmark: tiny assets, logging

HERE = Path(__file__).resolve().parent
CHILD = HERE / "child_scaling.py"

CASES = {
    "ppo-3m": {"algo": "ppo", "size": "3m", "settings": {**bench.PPO, "max_new_tokens": 32}},
    "ppo-25m": {"algo": "ppo", "size": "25m", "settings": {**bench.PPO, "max_new_tokens": 32}},
    "grpo-3m": {"algo": "grpo", "size": "3m", "settings": {**bench.GRPO, "batch_size": 8, "max_new_tokens": 32}},
}
LAYOUTS = {"1 process": (1, "auto"), "2 ranks DDP": (2, "ddp"), "2 ranks FSDP2": (2, "fsdp")}
"""label → (processes, parallelism)."""


def config(case: dict, assets: dict, steps: int, out: Path, parallelism: str) -> dict:
    models = assets["models"][case["size"]]
    return bench.ours_config(
        case["algo"], models, assets["prompts"], out, steps, case["settings"], parallelism=parallelism
    )


def launch(processes: int, threads: int, spec: Path, result: Path, timeout: float) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if processes == 1:
        command = [sys.executable, str(CHILD), str(spec), str(result)]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
                   "--master_addr=127.0.0.1", f"--master_port={29500 + os.getpid() % 1000}", str(CHILD),
                   str(spec), str(result)]  # fmt: skip
    subprocess.run(command, env=env, check=True, timeout=timeout, stdin=subprocess.DEVNULL)


def collect(result: Path, processes: int) -> dict:
    """What the ranks of one run reported: rank 0's median step time (after warm-up), each rank's peak RSS."""
    ranks = [json.loads(Path(f"{result}.rank{r}.json").read_text()) for r in range(processes)]
    return {"s_per_step": ranks[0]["s_per_step"], "peak_rss_mb_per_rank": [r["peak_rss_mb"] for r in ranks]}


def communication_mb(algo: str, parallelism: str, ranks: int, trainable: int, updates: int) -> float:
    """MB each rank sends per step for the gradients (ring collectives, fp32): DDP all-reduces every trainable
    parameter once per optimizer step, 2(N−1)/N·P·4 bytes; FSDP2 all-gathers the parameters for the forward
    and again for the backward and reduce-scatters the gradients, 3(N−1)/N·P·4 bytes per step (plus one
    all-gather per rollout and per frozen-model pass, left out)."""
    if ranks == 1:
        return 0.0
    factor = 2 if parallelism == "ddp" else 3
    return factor * (ranks - 1) / ranks * trainable * 4 * updates / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 steps, 1 repeat")
    parser.add_argument("--only", help=f"comma-separated cases out of {','.join(CASES)}")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    steps, repeats = (4, 1) if args.quick else (args.steps, args.repeats)
    names = args.only.split(",") if args.only else list(CASES)
    cores = os.cpu_count() or 1
    assets = bench.build_assets({CASES[n]["size"] for n in names})
    results = []
    for name in names:
        case = CASES[name]
        tries: dict[str, list[dict]] = {label: [] for label in LAYOUTS}
        for repeat in range(repeats):
            for label, (processes, parallelism) in LAYOUTS.items():
                folder = bench.WORK / "scaling" / f"{name}-{processes}-{parallelism}"
                folder.mkdir(parents=True, exist_ok=True)
                spec = folder / "spec.json"
                spec.write_text(
                    json.dumps(
                        {
                            "algo": case["algo"],
                            "threads": max(1, cores // processes),
                            "config": config(case, assets, steps, folder / "out", parallelism),
                        }
                    )
                )
                bench.log(f"{name}: {label}, repeat {repeat + 1}/{repeats}")
                launch(processes, max(1, cores // processes), spec, folder / "result", args.timeout)
                tries[label].append(collect(folder / "result", processes))
        trainable = assets["models"][case["size"]]["policy_params"]
        updates = case["settings"].get("ppo_epochs", 1) * case["settings"].get("num_minibatches", 1)
        rows = []
        for label, (processes, parallelism) in LAYOUTS.items():
            best = min(tries[label], key=lambda r: r["s_per_step"])
            rows.append({
                "layout": label, "s_per_step": best["s_per_step"],
                "repeats_s_per_step": [r["s_per_step"] for r in tries[label]],
                "peak_rss_mb_per_rank": best["peak_rss_mb_per_rank"],
                "comm_mb_per_rank_step": communication_mb(case["algo"], parallelism, processes, trainable, updates),
            })  # fmt: skip
        results.append({"case": name, **case, "params": trainable, "rows": rows})
    bench.RESULTS.mkdir(exist_ok=True)
    (bench.RESULTS / "scaling.json").write_text(json.dumps(results, indent=1))
    table = render(results, cores)
    (bench.RESULTS / "scaling.md").write_text(table)
    print(table)
    return 0


def render(results: list[dict], cores: int) -> str:
    lines = [
        f"Same global batch per case; {cores} cores shared by all ranks (1 process: {cores} threads; "
        f"2 ranks: {max(1, cores // 2)} each). Fastest of the repeats; memory is the peak RSS of each rank.",
        "",
        "| case | layout | s/step | vs 1 process | peak RSS per rank (MB) | gradient traffic per rank and step |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        base = result["rows"][0]["s_per_step"]
        for row in result["rows"]:
            rss = " / ".join(f"{mb:.0f}" for mb in row["peak_rss_mb_per_rank"])
            comm = f"{row['comm_mb_per_rank_step']:.0f} MB" if row["comm_mb_per_rank_step"] else "—"
            lines.append(f"| {result['case']} ({result['params'] / 1e6:.1f}M) | {row['layout']} | "
                         f"{row['s_per_step']:.3f} | {base / row['s_per_step']:.2f}× | {rss} | {comm} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
