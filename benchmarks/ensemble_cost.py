"""What a reward-model ensemble costs to train, in two forms, and what each form's diversity buys: ``rlhf rm`` on one
demo base's pairs with one member, four full members (every weight trained, the default), and four LoRA members
(adapters over the frozen pretrained trunk, rank 16, the score head trained whole; merged into each member when
saved), each run alone with every core.

    python benchmarks/ensemble_cost.py                                      # the first base of the sweep
    python benchmarks/ensemble_cost.py --base runs/demo_figures/avx2_seed_3

Per form: wall seconds and peak RSS of the whole ``rlhf rm`` process (``/usr/bin/time``), the held-out accuracy of
each member and of the ensemble (``ensemble.json``), the members' disagreement on the SFT model's 64 samples per
held-out prompt (the mean over samples of the members' standard deviation, their scores normalised as the trainers
read them) and the gold score of best-of-16 and best-of-64 picked by each objective (`ensembles.best_of_table` over
the candidates `benchmarks/ensembles.py` drew for that base). Writes benchmarks/results/ensemble_cost.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

import ensembles

FORMS = {
    "one reward model": {"rm": {"ensemble": 1}},
    "4 full members": {"rm": {"ensemble": 4}},
    "4 LoRA members": {"rm": {"ensemble": 4}, "model": {"lora": {"r": 16, "alpha": 32, "dropout": 0.0}}},
}


def train(base: Path, name: str, changes: dict) -> dict:
    out = base / "ensembles" / ("cost_" + name.replace(" ", "_"))
    config = yaml.safe_load((base / "rm" / "rm.yaml").read_text())
    for section, values in changes.items():
        config[section] = (config.get(section) or {}) | values
    config["output_dir"], config["run"] = str(out), config["run"] | {"overwrite": True, "progress": False}
    path = out.with_suffix(".yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    ensembles.log(f"rlhf rm: {name}")
    command = ["/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "rlhf", "rm", "--config", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, env=ensembles.base_env(base) | _all_cores())
    if done.returncode:
        raise RuntimeError(f"rlhf rm ({name}) failed:\n{done.stderr[-2000:]}")
    wall, peak_kb = done.stderr.strip().splitlines()[-1].split()
    return {"seconds": float(wall), "peak_rss_mb": int(peak_kb) / 1024, "final": str(out / "final")}


def _all_cores() -> dict[str, str]:
    cores = str(len(os.sched_getaffinity(0)))
    return {"OMP_NUM_THREADS": cores, "MKL_NUM_THREADS": cores}


def measure(base: Path) -> dict:
    candidates = base / "ensembles" / "candidates.jsonl"
    if not candidates.is_file():
        raise SystemExit(f"{candidates} is missing: run benchmarks/ensembles.py over {base.parent} first")
    forms = {}
    for name, changes in FORMS.items():
        form = train(base, name, changes)
        final = Path(form.pop("final"))
        if (final / "ensemble.json").is_file():
            form["held_out_accuracy"] = json.loads((final / "ensemble.json").read_text())["held_out_accuracy"]
            scores = ensembles.score_candidates(base, candidates, final)
            form["disagreement"] = statistics.fmean(v for row in scores["std"] for v in row)
            table = ensembles.best_of_table(scores)
            form["best_of"] = {str(n): table[n] for n in (16, 64)}
        forms[name] = form
    epochs = yaml.safe_load((base / "rm" / "rm.yaml").read_text())["rm"]["epochs"]
    return {"base": base.name, "machine": ensembles.machine(), "epochs": epochs, "forms": forms}


def render(results: dict) -> str:
    lines = [
        "# Reward-model ensembles: what each form costs",
        "",
        f"{results['machine']}; base {results['base']} (the demo's labels, {results['epochs']} epochs, every core, one run each). "
        "`python benchmarks/ensemble_cost.py`; method: its docstring.",
        "",
        "| form | `rlhf rm` seconds | peak RSS MB | member accuracy | mean / wco accuracy | disagreement | "
        "best-of-16 gold: single · mean · wco · uwo | best-of-64 gold: single · mean · wco · uwo |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, form in results["forms"].items():
        cells = [name, f"{form['seconds']:.0f}", f"{form['peak_rss_mb']:.0f}"]
        if "held_out_accuracy" in form:
            accuracy = form["held_out_accuracy"]
            members = [v for k, v in accuracy.items() if k.startswith("member_")]
            cells += [f"{min(members):.3f}–{max(members):.3f}", f"{accuracy['mean']:.3f} / {accuracy['wco']:.3f}"]
            cells.append(f"{form['disagreement']:.3f}")
            cells += [" · ".join(f"{form['best_of'][n][o]:.2f}" for o in ensembles.OBJECTIVES) for n in ("16", "64")]
        else:
            cells += ["—"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, default=None, help="a demo directory (default: the sweep's first)")
    parser.add_argument("--results", type=Path, default=ensembles.HERE / "results" / "ensemble_cost")
    parser.add_argument("--from-results", action="store_true")
    args = parser.parse_args(argv)
    json_path, md_path = args.results.with_suffix(".json"), args.results.with_suffix(".md")
    if not args.from_results:
        base = args.base or sorted(Path("runs/demo_figures").glob("*_seed_*/summary.json"))[0].parent
        started = time.time()
        json_path.write_text(json.dumps(measure(base), indent=1) + "\n")
        ensembles.log(f"done in {time.time() - started:.0f} s")
    md_path.write_text(render(json.loads(json_path.read_text())))
    print(md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
