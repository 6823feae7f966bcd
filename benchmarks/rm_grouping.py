"""`rlhf rm` grouped by prompt (each answer forwarded once per epoch) against the same trainer pair by pair (a commit
before the grouping), at equal data and epochs: wall, seconds in steps, seconds a step, peak RSS, and held-out accuracy
and log loss after every epoch (InstructGPT §3.5: grouped, the reward model "no longer overfits").

    git worktree add /tmp/pairwise 753b947                      # the last commit that trained pair by pair
    python benchmarks/demo_labels.py                            # each base's pair labels (labels/pairs/)
    python benchmarks/rm_grouping.py --pairwise-src /tmp/pairwise/src --bases runs/demo_figures/default_seed_0

For each base: the pair labels `demo_labels.py` drew from its candidates (a Bradley–Terry label for every pair, which
both trainers read), its noiseless held-out pairs, its pretrained model; lr 1e-3 linear, 32 examples a step (pairs
for the pairwise trainer, prompts for the grouped one: what each calls a batch), 6 epochs, all cores, one run after
another (run it on an idle machine). Peak RSS and wall come from ``/usr/bin/time``. Writes
benchmarks/results/rm_grouping.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EPOCHS, LEARNING_RATE, BATCH = 6, 1e-3, 32


def run(base: Path, name: str, source: Path | None, out: Path) -> dict:
    """One `rlhf rm` on ``base``'s pair labels from ``source`` (a checkout's src/; None: this one) into ``out``."""
    flags = ["--model.name", str(base / "pretrain" / "final"),
             "--data.train", str(base / "labels" / "pairs" / "label" / "preferences.jsonl"),
             "--data.eval", str(base / "label" / "eval_preferences.jsonl"), "--data.max_length", "128",
             "--batch.size", str(BATCH), "--rm.epochs", str(EPOCHS), "--optim.learning_rate", str(LEARNING_RATE),
             "--output_dir", str(out), "--run.eval_every", "0", "--run.save_every", "0", "--run.no-progress",
             "--run.overwrite"]  # fmt: skip
    env = os.environ | ({"PYTHONPATH": str(source)} if source else {})
    command = ["/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "rlhf", "rm", *flags]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"rlhf rm ({name}) failed:\n{done.stderr[-2000:]}")
    wall, peak_kb = done.stderr.strip().splitlines()[-1].split()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [row for row in rows if "eval/accuracy" in row]
    steps = [row["time/step_s"] for row in rows if "time/step_s" in row]
    return {
        "trainer": name,
        "wall_s": float(wall),
        "peak_rss_mb": int(peak_kb) / 1024,
        "steps": len(steps),
        "step_s": sum(steps) / len(steps),
        "train_s": sum(steps),
        "accuracy": [row["eval/accuracy"] for row in evals],
        "loss": [row["eval/loss"] for row in evals],
    }


def render(results: dict[str, list[dict]]) -> str:
    lines = ["# `rlhf rm` grouped by prompt against pair by pair", "",
             f"`python benchmarks/rm_grouping.py` (its docstring): each base's pair labels, {EPOCHS} epochs, lr "
             f"{LEARNING_RATE:g}, {BATCH} examples a step, alone on the machine. Held-out accuracy and log loss at "
             "the start and after each epoch.", ""]  # fmt: skip
    for base, rows in results.items():
        lines += [f"## {base}", "",
                  "| trainer | steps | s a step | seconds in steps | wall | peak RSS | held-out accuracy | held-out log loss |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in rows:
            accuracy = " → ".join(f"{a:.3f}" for a in r["accuracy"])
            loss = " → ".join(f"{x:.3f}" for x in r["loss"])
            lines.append(f"| {r['trainer']} | {r['steps']} | {r['step_s']:.3f} | {r['train_s']:.1f} | "
                         f"{r['wall_s']:.0f} s | {r['peak_rss_mb']:.0f} MB | {accuracy} | {loss} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bases", type=Path, nargs="+", required=True, help="demo directories")
    parser.add_argument("--pairwise-src", type=Path, required=True, help="src/ of a checkout that trains pairwise")
    parser.add_argument("--work", type=Path, default=HERE / ".work" / "rm_grouping")
    args = parser.parse_args()
    results = {}
    for base in args.bases:
        work = args.work / base.name
        results[base.name] = [run(base, "pair by pair", args.pairwise_src, work / "pairwise"),
                              run(base, "grouped by prompt", None, work / "grouped")]  # fmt: skip
        print(render({base.name: results[base.name]}), file=sys.stderr)
    (HERE / "results" / "rm_grouping.json").write_text(json.dumps(results, indent=1) + "\n")
    (HERE / "results" / "rm_grouping.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
