"""The demo's wall time against its budget: `rlhf demo` (preset small) end to end, each stage's seconds, peak RSS.

    python benchmarks/demo_time.py                 # one run of seed 0 into benchmarks/.work/demo_time
    python benchmarks/demo_time.py --repeats 3     # the median of three runs (each in a fresh directory)

Each run is its own process (`python -m rlhf demo --overwrite --no-progress`), timed from outside; the stages'
seconds come from the run's summary.json. Writes ``results/demo_time.json`` (every run's numbers, the machine)
and ``results/demo_time.md``, and prints whether the median run is within the budget (``--budget``, default 600 s:
the demo's promise of at most 10 minutes on a 2-core CPU). Wall time measures the machine's load as much as the
demo: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_once(out: Path, seed: int, preset: str) -> dict:
    """One `rlhf demo` in its own process: wall seconds, the children's peak RSS, the summary's stage times."""
    command = [sys.executable, "-m", "rlhf", "demo", "--output_dir", str(out), "--seed", str(seed), "--preset", preset,
               "--no-progress", "--overwrite"]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    summary = json.loads((out / "summary.json").read_text())
    stages = {key.removeprefix("time/").removesuffix("_s"): value for key, value in summary.items()
              if key.startswith("time/")}  # fmt: skip
    return {
        "wall_s": wall,
        "demo_s": summary["seconds"],
        # ru_maxrss of the children is the largest of any child so far (kilobytes on Linux)
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "stages_s": stages,
        "environment": summary["environment"],
    }


def markdown(runs: list[dict], budget: float, preset: str) -> str:
    walls = [run["wall_s"] for run in runs]
    median = statistics.median(walls)
    env = runs[0]["environment"]
    stages = runs[walls.index(min(walls, key=lambda w: abs(w - median)))]["stages_s"]
    lines = [
        f"`rlhf demo --preset {preset}`, {len(runs)} run(s) on {env['cpu']} ({env['threads']} threads), torch "
        f"{env['torch']}: median wall {median:.0f} s (runs: {', '.join(f'{w:.0f}' for w in walls)} s), budget "
        f"{budget:.0f} s → {'within' if median <= budget else 'OVER'} ({median / budget:.0%} of it); peak RSS "
        f"{max(run['peak_rss_mb'] for run in runs):.0f} MB.",
        "",
        "| stage | seconds (the median run) | share |",
        "|---|---|---|",
    ]
    total = sum(stages.values())
    lines += [f"| {name} | {value:.1f} | {value / total:.0%} |" for name, value in stages.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds the median run may take")
    parser.add_argument("--work", type=Path, default=HERE / ".work" / "demo_time")
    args = parser.parse_args()
    runs = []
    for i in range(args.repeats):
        runs.append(run_once(args.work / f"run_{i}", args.seed, args.preset))
        print(f"run {i + 1}/{args.repeats}: {runs[-1]['wall_s']:.0f} s", file=sys.stderr, flush=True)
    text = markdown(runs, args.budget, args.preset)
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    (results / "demo_time.json").write_text(json.dumps({"budget_s": args.budget, "runs": runs}, indent=2) + "\n")
    (results / "demo_time.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
