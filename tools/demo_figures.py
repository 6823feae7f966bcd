"""The demo's figures over several seeds: mean ± standard deviation, and the range, of each headline number.

    python tools/demo_figures.py                                   # seeds 0-4, a markdown table on stdout
    python tools/demo_figures.py --seeds 0 1 2 --out runs/figures  # other seeds / where the runs go
    python tools/demo_figures.py --update-readme README.md         # also rewrite the README's table

Each seed is one `rlhf demo --seed S` in its own process and directory (``OUT/seed_S``; a seed whose
``summary.json`` is already there is read, not re-run, so an interrupted sweep continues). One seed's run
is deterministic on one machine, but the figures of a seed differ between CPUs: float32 sums are
rounded differently by other kernels (another instruction set, another BLAS code path, another thread
count), and RL amplifies those last bits into another trajectory within a few hundred updates. A
single seed's numbers are therefore not what a README can promise; their spread over seeds is.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# (summary.json key, what the README calls it, digits). Wall time is left out: it measures the machine's load
# as much as the demo (the same seed took 110 s on an idle 2-core machine and 38 minutes at load average 12).
FIGURES = (
    ("gold/sft_mean", "gold score of the SFT policy", 2),
    ("gold/ppo_mean", "gold score of PPO", 2),
    ("gold/grpo_mean", "gold score of GRPO", 2),
    ("gold/win_rate_vs_sft", "win rate of PPO vs SFT under the gold judge", 2),
    ("gold/grpo_win_rate_vs_sft", "win rate of GRPO vs SFT under the gold judge", 2),
    ("rm/accuracy", "reward-model accuracy on held-out gold pairs", 2),
    ("kl/final", "KL to the reference at the end of PPO (nats per response)", 1),
    ("ppo/held_out_gold_last", "PPO, held-out gold score at its last step", 2),
    ("ppo_no_kl/kl_last", "PPO without the KL penalty: KL at the end", 0),
    ("ppo_no_kl/held_out_gold_last", "PPO without the KL penalty: held-out gold score at the end", 2),
)
START, END = "<!-- demo-figures:start -->", "<!-- demo-figures:end -->"


def run_seed(seed: int, out: Path, preset: str) -> dict:
    """The summary of `rlhf demo --seed seed` in ``out/seed_<seed>`` (run now unless it is already there)."""
    directory = out / f"seed_{seed}"
    summary = directory / "summary.json"
    if not summary.is_file():
        command = [sys.executable, "-m", "rlhf", "demo", "--seed", str(seed), "--output_dir", str(directory),
                   "--preset", preset, "--no-progress"]  # fmt: skip
        if directory.exists():  # an interrupted run of this seed: start it again
            command.append("--overwrite")
        print(f"seed {seed}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
        subprocess.run(command, check=True)
    return json.loads(summary.read_text())


def machine() -> str:
    from rlhf.runlog.seeding import environment

    env = environment()
    return (
        f"{env['cpu']} ({env['cpu_capability']} kernels), {env['threads']} threads, torch {env['torch']}, "
        f"transformers {env['transformers']}"
    )


def table(summaries: dict[int, dict], preset: str) -> str:
    seeds = sorted(summaries)
    lines = [
        f"Seeds {', '.join(map(str, seeds))} of `rlhf demo --preset {preset}` on {machine()}; "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}. `python tools/demo_figures.py --update-readme README.md`.",
        "",
        "| figure | mean ± sd over seeds | min – max | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---|---|---|" + "---|" * len(seeds),
    ]
    for key, label, digits in FIGURES:
        values = [summaries[s][key] for s in seeds]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        cells = " | ".join(f"{v:.{digits}f}" for v in values)
        lines.append(
            f"| {label} | {statistics.mean(values):.{digits}f} ± {sd:.{digits}f} | "
            f"{min(values):.{digits}f} – {max(values):.{digits}f} | {cells} |"
        )
    return "\n".join(lines)


def update_readme(path: Path, text: str) -> None:
    readme = path.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(readme):
        raise SystemExit(f"{path} has no {START} … {END} block to replace")
    path.write_text(pattern.sub(lambda _: f"{START}\n{text}\n{END}", readme))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, default=Path("runs/demo_figures"))
    parser.add_argument("--preset", default="small")
    parser.add_argument("--update-readme", type=Path, default=None)
    args = parser.parse_args()
    summaries = {seed: run_seed(seed, args.out, args.preset) for seed in args.seeds}
    text = table(summaries, args.preset)
    print(text)
    if args.update_readme:
        update_readme(args.update_readme, text)


if __name__ == "__main__":
    main()
