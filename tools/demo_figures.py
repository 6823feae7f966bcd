"""The demo's figures over several seeds: mean ± standard deviation, and the range, of each headline number.

    python tools/demo_figures.py                                   # seeds 0-4, a markdown table on stdout
    python tools/demo_figures.py --seeds 0 1 2 --out runs/figures  # other seeds / where the runs go
    python tools/demo_figures.py --update-readme README.md         # also rewrite the README's tables

Two tables: the headline figures over the seeds, and the methods compared on equal labels (SFT, best-of-N, DPO,
PPO, GRPO: summary.json's ``methods``) in the first seed's run.

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
    ("gold/dpo_mean", "gold score of DPO (on the reward model's pairs)", 2),
    ("gold/dpo_win_rate_vs_sft", "win rate of DPO vs SFT under the gold judge", 2),
    ("gold/best_of_n_mean", "gold score of best-of-8 (SFT samples, the reward model picks)", 2),
    ("gold/best_of_n_win_rate_vs_sft", "win rate of best-of-8 vs SFT under the gold judge", 2),
    ("rm/accuracy", "reward-model accuracy on held-out gold pairs", 2),
    ("kl/final", "KL to the reference at the end of PPO (nats per response)", 1),
    ("ppo/held_out_gold_last", "PPO, held-out gold score at its last step", 2),
    ("ppo_no_kl/kl_last", "PPO without the KL penalty: KL at the end", 0),
    ("ppo_no_kl/held_out_gold_last", "PPO without the KL penalty: held-out gold score at the end", 2),
)
FIGURES_BLOCK = ("<!-- demo-figures:start -->", "<!-- demo-figures:end -->")
METHODS_BLOCK = ("<!-- demo-methods:start -->", "<!-- demo-methods:end -->")
METHOD_NAMES = {"sft": "SFT", "best_of_n": "best-of-N", "dpo": "DPO", "ppo": "PPO", "grpo": "GRPO"}


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


def methods_table(seed: int, summary: dict) -> str:
    """summary.json's ``methods`` of one seed as a markdown table."""
    lines = [
        f"Seed {seed} of `rlhf demo` on {machine()}: {summary['methods']['sft']['prompts']} held-out prompts, the gold judge deciding; the whole demo "
        f"took {summary['seconds']:.0f} s.",
        "",
        "| method | gold score ± 95 % CI | win rate vs SFT [95 % CI] | KL to SFT (nats) | own wall time | needs |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in summary["methods"].items():
        label = METHOD_NAMES.get(name, name) + (f" (N = {m['n']})" if "n" in m else "")
        win = "— (baseline)" if m["win_rate"] is None else (
            f"{m['win_rate']:.2f} [{m['win_rate_ci95'][0]:.2f}, {m['win_rate_ci95'][1]:.2f}]")  # fmt: skip
        kl = ("≤ " if m["kl_is_bound"] else "") + f"{m['kl']:.2f}"
        cost = f"{m['seconds']:.1f} s" + (f" ({m['samples']} samples)" if "samples" in m else "")
        lines.append(f"| {label} | {m['gold_mean']:.2f} ± {m['gold_ci95']:.2f} | {win} | {kl} | {cost} | {m['needs']} |")
    return "\n".join(lines)


def update_readme(path: Path, block: tuple[str, str], text: str) -> None:
    start, end = block
    readme = path.read_text()
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(readme):
        raise SystemExit(f"{path} has no {start} … {end} block to replace")
    path.write_text(pattern.sub(lambda _: f"{start}\n{text}\n{end}", readme))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, default=Path("runs/demo_figures"))
    parser.add_argument("--preset", default="small")
    parser.add_argument("--update-readme", type=Path, default=None)
    args = parser.parse_args()
    summaries = {seed: run_seed(seed, args.out, args.preset) for seed in args.seeds}
    text = table(summaries, args.preset)
    methods = methods_table(args.seeds[0], summaries[args.seeds[0]])
    print(text, methods, sep="\n\n")
    if args.update_readme:
        update_readme(args.update_readme, FIGURES_BLOCK, text)
        update_readme(args.update_readme, METHODS_BLOCK, methods)


if __name__ == "__main__":
    main()
