"""The demo's labels: one Plackett–Luce ranking per prompt against a Bradley–Terry label of every pair on its own, on
the same candidates, by the reward model each trains (held-out accuracy and log loss over its epochs).

    python tools/demo_figures.py --jobs 2 --out runs/demo_figures   # the bases: 10 demos (seeds 0-4 × 2 kernels)
    python benchmarks/demo_labels.py --jobs 2                         # then this, over every demo found there
    python benchmarks/demo_labels.py --from-results                   # re-render the .md from the saved .json

For each base (one ``rlhf demo`` directory: its SFT model's 8 candidates for each of 192 training prompts, its held-out
noiseless gold pairs and its pretrained model) each kind of label is drawn from the same candidates with the demo's
rater noise (`rlhf.demo.pipeline.label`, seed = the base's), and one reward model is trained on it exactly as the
demo's member 0 (its ``rm.yaml``: 3 epochs, grouped by prompt, the same seed; no ensemble, no normalisation). A
rater's cost differs: a ranking of k answers takes about k actions on the labelling page, k(k − 1)/2 pairs take
k(k − 1)/2 (docs/rankings.md, counted in the browser test). Every run is its own process with one torch thread under
its base's kernel family; a run whose metrics are there is read, not run again. Writes
benchmarks/results/demo_labels.{json,md}.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ensembles import base_env, log, rlhf  # noqa: E402  (one way to run a command per base, shared)

KINDS = ("ranking", "pairs")


def train(base: Path, kind: str) -> dict[str, Any]:
    """``kind``'s labels of ``base``'s candidates and the reward model trained on them: its held-out curve."""
    from rlhf.demo.pipeline import label

    out = base / "labels" / kind
    if not (out / "rm" / "final").is_dir():
        demo = yaml.safe_load((base / "rm" / "rm.yaml").read_text())
        stats = label(base / "sample", out / "label", seed=demo["run"]["seed"], kind=kind)
        (out / "label" / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
        config = demo | {"output_dir": str(out / "rm")}
        config["data"] = demo["data"] | {"train": str(out / "label" / "preferences.jsonl")}
        config["rm"] = demo["rm"] | {"ensemble": 1}
        config["normalize"] = {"policy": None}
        config["run"] = demo["run"] | {"overwrite": True, "progress": False}
        log(f"{base.name}: rm on {kind}")
        rlhf("rm", config, out / "rm", base_env(base))
    rows = [json.loads(line) for line in (out / "rm" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [row for row in rows if "eval/accuracy" in row]
    stats = json.loads((out / "label" / "stats.json").read_text())
    return {
        "pairs": stats["label/train_pairs"],
        "agreement": stats["label/train_gold_agreement"],
        "accuracy": [row["eval/accuracy"] for row in evals],
        "loss": [row["eval/loss"] for row in evals],
        "steps": [row["step"] for row in evals],
    }


def summary(runs: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """kind → mean, std, worst of the last held-out accuracy and log loss, and the labels' implied pairs."""
    table = {}
    for kind in KINDS:
        accuracy = [runs[base][kind]["accuracy"][-1] for base in runs]
        loss = [runs[base][kind]["loss"][-1] for base in runs]
        best = [max(runs[base][kind]["accuracy"]) for base in runs]
        pairs = [runs[base][kind]["pairs"] for base in runs]
        agreement = [runs[base][kind]["agreement"] for base in runs]
        table[kind] = {
            "accuracy_mean": statistics.fmean(accuracy),
            "accuracy_std": statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0,
            "accuracy_worst": min(accuracy),
            "accuracy_best_epoch_mean": statistics.fmean(best),
            "loss_mean": statistics.fmean(loss),
            "loss_worst": max(loss),
            "pairs_mean": statistics.fmean(pairs),
            "agreement_mean": statistics.fmean(agreement),
        }
    wins = sum(runs[base]["ranking"]["accuracy"][-1] >= runs[base]["pairs"]["accuracy"][-1] for base in runs)
    table["ranking_at_least_pairs"] = {"bases": wins, "of": len(runs)}
    return table


def render(runs: dict[str, dict[str, dict[str, Any]]]) -> str:
    table = summary(runs)
    lines = [
        "# The demo's labels: rankings against pairs",
        "",
        "`python benchmarks/demo_labels.py` over the demo directories of `python tools/demo_figures.py` "
        f"({len(runs)} bases: {', '.join(sorted(runs))}). One reward model per base and kind, trained as the demo's "
        "member 0; accuracy and log loss on the base's noiseless held-out gold pairs after each epoch.",
        "",
        "| labels | implied pairs | agree with gold | held-out accuracy (last epoch) | worst | best epoch | log loss | worst |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        t = table[kind]
        lines.append(
            f"| {kind} | {t['pairs_mean']:.0f} | {100 * t['agreement_mean']:.1f} % | {t['accuracy_mean']:.3f} ± "
            f"{t['accuracy_std']:.3f} | {t['accuracy_worst']:.3f} | {t['accuracy_best_epoch_mean']:.3f} | "
            f"{t['loss_mean']:.3f} | {t['loss_worst']:.3f} |"
        )
    wins = table["ranking_at_least_pairs"]
    lines += [
        "",
        f"Rankings at least as accurate as pairs on {wins['bases']} of {wins['of']} bases.",
        "",
        "Per base:",
        "",
    ]
    lines += ["| base | ranking: accuracy by epoch | pairs: accuracy by epoch |", "|---|---|---|"]
    for base in sorted(runs):
        cells = [" → ".join(f"{a:.3f}" for a in runs[base][kind]["accuracy"]) for kind in KINDS]
        lines.append(f"| {base} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bases", type=Path, default=Path("runs/demo_figures"), help="directory of demo runs")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (one torch thread each)")
    parser.add_argument("--from-results", action="store_true", help="re-render the .md from the saved .json")
    args = parser.parse_args()
    results = HERE / "results" / "demo_labels"
    if args.from_results:
        runs = json.loads(results.with_suffix(".json").read_text())
    else:
        bases = sorted(p.parent for p in args.bases.glob("*/summary.json"))
        if not bases:
            raise SystemExit(f"no demo directories (with summary.json) under {args.bases}")
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = {(b.name, k): pool.submit(train, b, k) for b in bases for k in KINDS}
            runs = {b.name: {k: futures[b.name, k].result() for k in KINDS} for b in bases}
        results.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
    results.with_suffix(".md").write_text(render(runs))
    print(render(runs))


if __name__ == "__main__":
    main()
