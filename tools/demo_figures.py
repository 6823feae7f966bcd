"""The demo's figures over seeds and CPU kernel families: mean ± standard deviation, worst and best run of each
headline number, and its mean per kernel family.

    python tools/demo_figures.py                                   # seeds 0-4 × default, avx2 kernels: 10 runs
    python tools/demo_figures.py --seeds 0 1 2 --kernels default   # other seeds / kernels
    python tools/demo_figures.py --jobs 2                          # two demos at once, one thread each
    python tools/demo_figures.py --update-readme README.md         # also rewrite the README's tables

Two tables: the headline figures over every run, and the methods compared on equal labels (SFT, best-of-N, DPO,
PPO, GRPO: summary.json's ``methods``) in the first run (first kernel, first seed).

Each run is one `rlhf demo --seed S` in its own process and directory (``OUT/<kernel>_seed_<S>``; a run whose
``summary.json`` is already there is read, not re-run, so an interrupted sweep continues). ``default`` kernels
are what torch picks on this CPU; ``avx2`` sets ``ATEN_CPU_CAPABILITY=avx2`` (it can only lower the level).
One seed's run is deterministic on one machine, but the figures of a seed differ between CPUs: float32 sums
are rounded differently by other kernels (another instruction set, another BLAS code path), and RL amplifies
those last bits into another trajectory within a few hundred updates. A kernel family acts like another seed;
a README can promise the spread over both, not one run's numbers (docs/reproducibility.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Wall time is left out: it measures the machine's load as much as the demo (the same seed took 110 s on an idle
# 2-core machine and 38 minutes at load average 12).
FIGURES = (
    ("gold/sft_mean", "gold score of the SFT policy", 2, True),
    ("gold/ppo_mean", "gold score of PPO", 2, True),
    ("gold/grpo_mean", "gold score of GRPO", 2, True),
    ("gold/dpo_mean", "gold score of DPO (on the reward model's labels)", 2, True),
    ("gold/best_of_n_mean", "gold score of best-of-8 (SFT samples, the reward model picks)", 2, True),
    ("gold/win_rate_vs_sft", "win rate of PPO vs SFT under the gold judge", 2, True),
    ("gold/grpo_win_rate_vs_sft", "win rate of GRPO vs SFT under the gold judge", 2, True),
    ("gold/dpo_win_rate_vs_sft", "win rate of DPO vs SFT under the gold judge", 2, True),
    ("gold/best_of_n_win_rate_vs_sft", "win rate of best-of-8 vs SFT under the gold judge", 2, True),
    ("ppo_minus_dpo", "PPO's gold score minus DPO's on the same base", 2, True),
    ("rm/accuracy", "reward-model accuracy on held-out gold pairs", 2, True),
    ("rm/ensemble_accuracy_mean", "the ensemble's accuracy (the mean of 4 members)", 2, True),
    ("kl/final", "KL to the reference at the end of PPO (nats per response)", 1, False),
    ("ppo/held_out_gold_last", "PPO, held-out gold score at its last step", 2, True),
    ("ppo_no_kl/kl_last", "PPO without the KL penalty: KL at the end", 0, False),
    ("ppo_no_kl/held_out_gold_last", "PPO without the KL penalty: held-out gold score at the end", 2, True),
    ("ppo_no_kl_ensemble/kl_last", "the same against the ensemble (UWO): KL at the end", 0, False),
    ("ppo_no_kl_ensemble/held_out_gold_last", "the same against the ensemble (UWO): held-out gold at the end", 2, True),
)
"""(summary.json key, or one of `DERIVED`; what the README calls it, digits, whether higher is better: the worst run is
the lowest)."""
DERIVED = {"ppo_minus_dpo": lambda summary: summary["gold/ppo_mean"] - summary["gold/dpo_mean"]}
"""Figures computed from one run's summary.json."""
MAIN_RUNS = ("sft", "rm/members/member_0", "rm/members/member_1", "rm/members/member_2", "rm/members/member_3", "dpo",
             "ppo", "grpo")  # fmt: skip
"""The demo's runs the doctor must find healthy (its acceptance test asks the same of one run)."""
FIGURES_BLOCK = ("<!-- demo-figures:start -->", "<!-- demo-figures:end -->")
METHODS_BLOCK = ("<!-- demo-methods:start -->", "<!-- demo-methods:end -->")
METHOD_NAMES = {"sft": "SFT", "best_of_n": "best-of-N", "dpo": "DPO", "ppo": "PPO", "grpo": "GRPO"}


KERNELS = ("default", "avx2")
"""Kernel families: ``default`` is what torch picks on this CPU, ``avx2`` sets ``ATEN_CPU_CAPABILITY=avx2``."""


def kernel_env(kernel: str, threads: int | None = None) -> dict[str, str]:
    """This process's environment for a run under ``kernel`` (one of `KERNELS`) with ``threads`` OMP threads
    (None: torch's default, every core)."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if kernel != "default":
        env["ATEN_CPU_CAPABILITY"] = kernel
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_one(seed: int, kernel: str, out: Path, preset: str, threads: int | None = None) -> dict:
    """The summary of `rlhf demo --seed seed` under ``kernel`` in ``out/<kernel>_seed_<seed>`` (run now unless it
    is already there). ``threads``: OMP_NUM_THREADS of the run (None: torch's default, every core)."""
    directory = out / f"{kernel}_seed_{seed}"
    summary = directory / "summary.json"
    if not summary.is_file():
        command = [sys.executable, "-m", "rlhf", "demo", "--seed", str(seed), "--output_dir", str(directory),
                   "--preset", preset, "--no-progress"]  # fmt: skip
        if directory.exists():  # an interrupted run of this seed: start it again
            command.append("--overwrite")
        env = kernel_env(kernel, threads)
        print(f"{kernel} kernels, seed {seed}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(summary.read_text())


def run_all(seeds: list[int], kernels: list[str], out: Path, preset: str, jobs: int = 1) -> dict[tuple[str, int], Path]:
    """Every (kernel, seed) demo under ``out``, ``jobs`` at a time (each with cores / jobs threads: at the demo's
    sizes 1 and 2 threads give the same figures, docs/reproducibility.md); returns their directories."""
    threads = None if jobs == 1 else max(1, (os.cpu_count() or 1) // jobs)
    runs = [(kernel, seed) for kernel in kernels for seed in seeds]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda run: run_one(run[1], run[0], out, preset, threads), runs))
    return {(kernel, seed): out / f"{kernel}_seed_{seed}" for kernel, seed in runs}


def machine(summary: dict) -> str:
    """The machine a run was measured on, from its summary's ``environment``."""
    env = summary["environment"]
    return f"{env['cpu']}, {env['threads']} thread(s), torch {env['torch']}, transformers {env['transformers']}"


def table(summaries: dict[tuple[str, int], dict], preset: str) -> str:
    """Each figure over every (kernel, seed) run: mean ± sd, the worst and best run, the mean per kernel family."""
    runs = sorted(summaries)
    kernels = sorted({kernel for kernel, _ in runs}, key=lambda k: KERNELS.index(k) if k in KERNELS else 99)
    seeds = sorted({seed for _, seed in runs})
    levels = {k: next(summaries[r]["environment"]["cpu_capability"] for r in runs if r[0] == k) for k in kernels}
    first = summaries[runs[0]]
    lines = [
        f"Seeds {', '.join(map(str, seeds))} × {' and '.join(f'{k} ({levels[k]})' for k in kernels)} kernels: "
        f"{len(runs)} runs of `rlhf demo --preset {preset}` on {machine(first)}; "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}. `python tools/demo_figures.py --update-readme README.md`.",
        "",
        "| figure | mean ± sd over runs | worst – best | " + " | ".join(f"mean, {levels[k]}" for k in kernels) + " |",
        "|---|---|---|" + "---|" * len(kernels),
    ]
    for key, label, digits, higher_is_better in FIGURES:
        values = [DERIVED[key](summaries[r]) if key in DERIVED else summaries[r][key] for r in runs]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        worst, best = (min(values), max(values)) if higher_is_better else (max(values), min(values))
        per_kernel = " | ".join(
            f"{statistics.fmean(v for r, v in zip(runs, values, strict=True) if r[0] == k):.{digits}f}" for k in kernels
        )
        lines.append(
            f"| {label} | {statistics.mean(values):.{digits}f} ± {sd:.{digits}f} | "
            f"{worst:.{digits}f} – {best:.{digits}f} | {per_kernel} |"
        )
    return "\n".join(lines)


def doctor_lines(dirs: dict[tuple[str, int], Path]) -> str:
    """The training doctor's verdicts over every run (`rlhf doctor <run>`): its warnings on the main runs, and where
    its over-optimisation rules fire."""
    from rlhf.demo.pipeline import STAGES
    from rlhf.doctor.checkup import examine

    serious, infos, fired = [], 0, {"over_optimisation": {}, "ensemble_disagreement_rising": {}}
    for run, directory in sorted(dirs.items()):
        # the demo's own stages only: benchmarks keep runs of their own in a base (ensembles/, labels/)
        stages = [directory / stage for stage in STAGES if (directory / stage).is_dir()]
        for checkup in (checkup for stage in stages for checkup in examine(stage)):
            stage = str(checkup.record.path.relative_to(directory))
            names = {f.rule.name for f in checkup.findings}
            for rule in fired:
                if rule in names:
                    fired[rule][stage] = fired[rule].get(stage, 0) + 1
            if stage in MAIN_RUNS:
                serious += [f"{run[0]} seed {run[1]} {stage}: {f.rule.name}" for f in checkup.findings
                            if f.rule.severity != "info"]  # fmt: skip
                infos += any(f.rule.severity == "info" for f in checkup.findings)
    counts = {rule: ", ".join(f"{stage} {n} of {len(dirs)}" for stage, n in sorted(found.items())) or "none"
              for rule, found in fired.items()}  # fmt: skip
    return "\n".join([
        f"The doctor (`rlhf doctor <run>`) on the main runs ({', '.join(MAIN_RUNS)}) of all {len(dirs)}: "
        + (f"{len(serious)} warnings ({'; '.join(serious)})" if serious else "no warning")
        + f", an info note on {infos} runs. `over_optimisation` (gold): {counts['over_optimisation']}. "
        f"`ensemble_disagreement_rising` (label-free): {counts['ensemble_disagreement_rising']}.",
    ])  # fmt: skip


def methods_table(seed: int, kernel: str, summary: dict) -> str:
    """summary.json's ``methods`` of one run as a markdown table."""
    level = summary["environment"]["cpu_capability"]
    lines = [
        f"Seed {seed} of `rlhf demo` ({kernel} kernels: {level}) on {machine(summary)}: {summary['methods']['sft']['prompts']} held-out prompts, the gold judge deciding; the whole demo "
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
        lines.append(
            f"| {label} | {m['gold_mean']:.2f} ± {m['gold_ci95']:.2f} | {win} | {kl} | {cost} | {m['needs']} |"
        )
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
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS))
    parser.add_argument("--out", type=Path, default=Path("runs/demo_figures"))
    parser.add_argument("--preset", default="small")
    parser.add_argument("--jobs", type=int, default=1, help="demos at once (each with cores / jobs threads)")
    parser.add_argument("--update-readme", type=Path, default=None)
    args = parser.parse_args()
    dirs = run_all(args.seeds, args.kernels, args.out, args.preset, args.jobs)
    summaries = {run: json.loads((directory / "summary.json").read_text()) for run, directory in dirs.items()}
    text = table(summaries, args.preset) + "\n\n" + doctor_lines(dirs)
    first = (args.kernels[0], args.seeds[0])
    methods = methods_table(first[1], first[0], summaries[first])
    print(text, methods, sep="\n\n")
    if args.update_readme:
        update_readme(args.update_readme, FIGURES_BLOCK, text)
        update_readme(args.update_readme, METHODS_BLOCK, methods)


if __name__ == "__main__":
    main()
