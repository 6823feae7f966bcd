"""Which PPO settings survive seeds and CPU kernels: each setting re-runs the demo's PPO stage from the same SFT
model and reward model, over several seeds and both kernel families, and is judged by the gold judge and the
training doctor.

    python benchmarks/ppo_study.py                                  # every setting, seeds 0-4 × default, avx2
    python benchmarks/ppo_study.py --settings demo adaptive_kl --seeds 0 1 --kernels default
    python benchmarks/ppo_study.py --update-doc docs/ppo_study.md   # also rewrite the study's table
    python benchmarks/ppo_study.py --from-results --update-doc docs/ppo_study.md   # the table of the runs so far

A *base* is one `rlhf demo --seed S` run under one kernel family (``BASES/<kernel>_seed_<S>``, the layout of
``tools/demo_figures.py``, which it shares: a base already there is reused, a missing one is run first). Its
SFT model, reward model and ``ppo/ppo.yaml`` are the start of every setting; a setting is a set of
``--section.field value`` overrides on that config (`SETTINGS`). Each (setting, base) is three commands in
their own process: ``rlhf ppo`` (the overrides on the base's config), ``rlhf eval`` (the base's PPO eval
config: the same 48 held-out prompts, the gold judge, KL from the SFT model) and ``rlhf doctor --json``.
DPO, GRPO and best-of-N come from the base's own summary: every setting is compared on equal labels.

Kernels: ``default`` is what torch picks on this CPU (AVX-512 on the AMD EPYC of our machines), ``avx2`` sets
``ATEN_CPU_CAPABILITY=avx2``. Other kernels round float32 sums otherwise, and sampling turns that into another
trajectory: a kernel family acts like another seed (docs/reproducibility.md). ``--jobs 2`` runs two
processes of one thread each (the demo's sizes give the same numbers on 1 and 2 threads). Results of every run
go to ``OUT/results.jsonl`` (a run already there is not repeated); the table is built from them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tools"))
import demo_figures  # noqa: E402  (tools/ is not a package: the bases are its runs)

SHARED: dict[str, object] = {"ppo.critic": "shared"}
"""The recipe before the study: the value head on the policy's trunk. The one-change rows change this one."""

SETTINGS: dict[str, dict[str, object]] = {
    # name: overrides on the base demo's ppo/ppo.yaml (the preset's PPO: lr 1e-4 constant, β 0.2 fixed,
    # 4 epochs × 2 minibatches of 16, 60 steps of 32 prompts; ppo.critic auto: separate, from the reward model)
    "demo": {},
    "shared_critic": SHARED,
    "separate_critic": {"ppo.critic": "separate"},
    "adaptive_kl": SHARED | {"kl.control": "adaptive", "kl.target": 3.0, "kl.horizon": 320},
    "critic_warmup": SHARED | {"ppo.critic_warmup_steps": 5},
    "lr_5e-5": SHARED | {"optim.learning_rate": 5e-5},
    "epochs_2": SHARED | {"ppo.epochs": 2},
    "whiten_rewards": SHARED | {"ppo.whiten_rewards": True},
    "entropy_0.01": SHARED | {"ppo.entropy_coef": 0.01},
    "beta_0.4": SHARED | {"kl.coef": 0.4},
    "batch_64": SHARED | {"batch.size": 64, "ppo.steps": 30},
    "pg_warmup": SHARED | {"ppo.warmup_pg_steps": 5},
    "separate_critic+warmup": {"ppo.critic": "separate", "ppo.critic_warmup_steps": 5},
    "reference_ema_0.9": SHARED | {"kl.reference_ema": 0.9},
    "separate_critic+reference_ema_0.9": {"ppo.critic": "separate", "kl.reference_ema": 0.9},
    "no_kl": SHARED | {"kl.coef": 0.0},
    "no_kl+separate_critic": {"kl.coef": 0.0, "ppo.critic": "separate"},
    "no_kl+separate_critic+lr_3e-4": {"kl.coef": 0.0, "ppo.critic": "separate", "optim.learning_rate": 3e-4},
}
"""Each setting the study measures: overrides on the base's PPO config."""


def flags(overrides: dict[str, object]) -> list[str]:
    """``--section.field value`` for each override; a boolean is ``--section.field`` or ``--section.no_field``."""
    out: list[str] = []
    for key, value in overrides.items():
        if isinstance(value, bool):
            section, _, field = key.rpartition(".")
            out.append(f"--{key}" if value else f"--{section}.no_{field}")
        else:
            out += [f"--{key}", json.dumps(value) if isinstance(value, (list, dict)) else str(value)]
    return out


def command(args: list[str], env: dict[str, str]) -> None:
    """Run one rlhf command; a failure raises with the command and the end of what it said."""
    done = subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")


def run_setting(name: str, base: Path, out: Path, kernel: str, seed: int, threads: int) -> dict:
    """PPO with the setting's overrides from ``base``, its gold evaluation and the doctor's verdict. The setting
    without overrides is the base's own PPO run and evaluation (a run is a function of its config on one machine:
    running it again gives the same bits)."""
    env = demo_figures.kernel_env(kernel, threads)
    rlhf = [sys.executable, "-m", "rlhf"]
    start = time.perf_counter()
    if SETTINGS[name]:
        ppo = [*rlhf, "ppo", "--config", str(base / "ppo" / "ppo.yaml"), "--output_dir", str(out),
               "--run.no_progress", "--run.overwrite", *flags(SETTINGS[name])]  # fmt: skip
        command(ppo, env)
        evaluation = [*rlhf, "eval", "--config", str(base / "eval" / "ppo" / "eval.yaml"), "--model.name",
                      str(out / "final"), "--output", str(out / "eval.json"), "--samples_output",
                      str(out / "eval_samples.jsonl"), "--overwrite", "--no_progress"]  # fmt: skip
        command(evaluation, env)
        run_dir, result = out, json.loads((out / "eval.json").read_text())
    else:
        run_dir, result = base / "ppo", json.loads((base / "eval" / "ppo.json").read_text())
    seconds = time.perf_counter() - start
    doctor = subprocess.run([*rlhf, "doctor", str(run_dir), "--json"], env=env, capture_output=True, text=True)
    verdict = json.loads(doctor.stdout)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    held_out = [row["eval/reward/gold/mean"] for row in rows if "eval/reward/gold/mean" in row]
    rows = [row for row in rows if "kl/mean" in row]  # the training rows
    summary = json.loads((base / "summary.json").read_text())
    return {
        "setting": name,
        "kernel": kernel,
        "seed": seed,
        "gold": result["reward/gold/mean"],
        "win_rate": result["win_rate"],
        "kl_answers": result["kl/mean"],
        "kl_final": rows[-1]["kl/mean"],
        "held_out_gold_peak": max(held_out),
        "held_out_gold_last": held_out[-1],
        "findings": sorted({f["rule"] for run in verdict["runs"] for f in run["findings"]}),
        "seconds": seconds if SETTINGS[name] else summary["time/ppo_s"],
        "baselines": {m: summary["methods"][m]["gold_mean"] for m in ("sft", "best_of_n", "dpo", "ppo", "grpo")},
        "environment": summary["environment"],
    }


def load_results(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {sd:.2f}"


def table(results: list[dict], settings: list[str]) -> str:
    """setting × gold mean ± sd × worst run × final KL (to the run's reference: a moving one's is small) × the
    held-out answers' KL to the SFT model × the doctor's findings, with the baselines of the bases."""
    lines = [
        "| setting | overrides | runs | gold mean ± sd | worst run | PPO − DPO (mean, worst) | final KL | "
        "answers' KL to SFT | runs with findings (rules) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in settings:
        rows = [r for r in results if r["setting"] == name]
        if not rows:
            continue
        gold = [r["gold"] for r in rows]
        vs_dpo = [r["gold"] - r["baselines"]["dpo"] for r in rows]
        sick = [r for r in rows if r["findings"]]
        rules = sorted({rule for r in sick for rule in r["findings"]})
        overrides = ", ".join(f"`{k}: {v}`" for k, v in SETTINGS[name].items()) or "(the demo's PPO as it is)"
        lines.append(
            f"| {name} | {overrides} | {len(rows)} | {spread(gold)} | {min(gold):.2f} | "
            f"{statistics.fmean(vs_dpo):+.2f}, {min(vs_dpo):+.2f} | {spread([r['kl_final'] for r in rows])} | "
            f"{spread([r['kl_answers'] for r in rows])} | {len(sick)}{' (' + ', '.join(rules) + ')' if rules else ''} |"
        )
    bases = {(r["kernel"], r["seed"]): r["baselines"] for r in results}
    lines += ["", "The same bases' other methods (their own demo runs, equal labels):", "",
              "| method | gold mean ± sd | worst run |", "|---|---|---|"]  # fmt: skip
    for method in ("sft", "best_of_n", "dpo", "grpo"):
        values = [b[method] for b in bases.values()]
        lines.append(f"| {demo_figures.METHOD_NAMES[method]} | {spread(values)} | {min(values):.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--kernels", nargs="+", default=list(demo_figures.KERNELS))
    parser.add_argument("--bases", type=Path, default=Path("runs/demo_figures"))
    parser.add_argument("--out", type=Path, default=Path("runs/ppo_study"))
    parser.add_argument("--jobs", type=int, default=2, help="processes at once (each gets cores / jobs threads)")
    parser.add_argument("--update-doc", type=Path, default=None)
    parser.add_argument(
        "--from-results", action="store_true", help="build the table from OUT/results.jsonl, running nothing"
    )
    args = parser.parse_args()
    if args.from_results:
        report(load_results(args.out / "results.jsonl"), args)
        return
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    bases = demo_figures.run_all(args.seeds, args.kernels, args.bases, "small", args.jobs)
    path = args.out / "results.jsonl"
    done = {(r["setting"], r["kernel"], r["seed"]) for r in load_results(path)}
    todo = [(name, kernel, seed) for name in args.settings for kernel in args.kernels for seed in args.seeds
            if (name, kernel, seed) not in done]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool, path.open("a") as log:
        futures = {
            pool.submit(run_setting, name, bases[kernel, seed], args.out / name / f"{kernel}_seed_{seed}", kernel,
                        seed, threads): (name, kernel, seed)
            for name, kernel, seed in todo
        }  # fmt: skip
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            log.write(json.dumps(result) + "\n")
            log.flush()
            print(f"{result['setting']} {result['kernel']} seed {result['seed']}: gold {result['gold']:.2f}, "
                  f"KL {result['kl_final']:.1f}, {result['findings'] or 'healthy'}", file=sys.stderr, flush=True)  # fmt: skip
    report(load_results(path), args)


def report(results: list[dict], args: argparse.Namespace) -> None:
    """Print the table of ``args``'s settings, seeds and kernels; rewrite the doc's table with ``--update-doc``."""
    results = [r for r in results if r["setting"] in args.settings and r["seed"] in args.seeds
               and r["kernel"] in args.kernels]  # fmt: skip
    text = table(results, args.settings)
    print(text)
    if args.update_doc:
        demo_figures.update_readme(args.update_doc, ("<!-- ppo-study:start -->", "<!-- ppo-study:end -->"), text)


if __name__ == "__main__":
    main()
