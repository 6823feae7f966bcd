"""Reward-model ensembles against over-optimisation, in the demo's gold set-up (Coste et al. 2024's comparison):
one reward model against the ensemble's mean, WCO and UWO, in best-of-n and in PPO without and with a small KL
penalty, over the demo's bases (seeds × CPU kernel families).

    python tools/demo_figures.py --jobs 2                               # the bases: 10 demos, each with its ensemble
    python benchmarks/ensembles.py --jobs 2                             # then this, over every demo found there
    python benchmarks/ensembles.py --from-results                       # re-render the .md from the saved .json

Each base is one ``rlhf demo`` directory: its SFT model, its reward-model ensemble (``rm/final``, 4 members differing
by seed; member 0 is the demo's one reward model), its prompts and its gold judge (``rlhf.demo.task:gold``), which
the reward models never see. For each base:

- **best-of-n**: 64 samples of the SFT model per held-out prompt (``rlhf sample --mode candidates``, the demo's
  sampling), each scored by every member (its own normalisation) and by the gold judge; for n in 1, 4, 16, 64 the
  64 are cut into 64/n groups of n, each objective picks its best in every group, and the gold scores of the picks
  are averaged (every sample used once: the estimate with the least variance from one draw). The KL of best-of-n
  from the SFT model is the bound log n − (n − 1)/n.
- **PPO**: the demo's β = 0 stage (shared critic, 60 steps, the same seed) against one reward model (the demo's
  ``ppo_no_kl``), the ensemble by UWO (the demo's ``ppo_no_kl_ensemble``), and here by the mean and by WCO; then
  all four again with β = 0.02, a tenth of the demo's leashed PPO. Read: the held-out gold score at the last step
  and its best over the run, the KL at the end, and the score phase's seconds per step (of the runs made here: the
  demo's ``ppo_no_kl`` also scores the ensemble beside its one reward model).

Every run is its own process with one torch thread under its base's kernel family (``ATEN_CPU_CAPABILITY``); a run
whose output is there is read, not run again. Writes benchmarks/results/ensembles.{json,md}. Notes: docs/ensembles.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
OBJECTIVES = ("single", "mean", "wco", "uwo")
"""One reward model (the ensemble's member 0), then the ensemble by each objective (UWO with λ = 0.5, the default)."""
UWO_LAMBDA = 0.5
BEST_OF = (1, 4, 16, 64)
SMALL_BETA = 0.02
DEMO_STAGE = {"single": "ppo_no_kl", "uwo": "ppo_no_kl_ensemble"}
"""The β = 0 runs the demo itself made (its ``ppo_no_kl`` scores the ensemble beside the one reward model: its score
seconds are not one model's, and are left out)."""


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def base_env(base: Path) -> dict[str, str]:
    """One thread, under the kernel family the base's directory name gives (``<kernel>_seed_<s>``)."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    kernel = base.name.partition("_seed_")[0]
    if kernel != "default":
        env["ATEN_CPU_CAPABILITY"] = kernel
    return env | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def rlhf(command: str, config: dict[str, Any], where: Path, env: dict[str, str]) -> None:
    """``rlhf <command> --config where.yaml`` with ``config`` written there; the log beside it."""
    where.parent.mkdir(parents=True, exist_ok=True)
    path = where.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    with where.with_suffix(".log").open("w") as logfile:
        done = subprocess.run([sys.executable, "-m", "rlhf", command, "--config", str(path)], env=env,
                              stdout=logfile, stderr=subprocess.STDOUT)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"rlhf {command} failed ({done.returncode}): see {where.with_suffix('.log')}")


# -------------------------------------------------------------------------------------------------------------------
# PPO
# -------------------------------------------------------------------------------------------------------------------


def ppo_config(base: Path, objective: str, beta: float, out: Path) -> dict[str, Any]:
    """The demo's β = 0 stage's config against ``objective``'s reward, with ``beta``, into ``out``."""
    config = yaml.safe_load((base / "ppo_no_kl_ensemble" / "ppo.yaml").read_text())
    rm = next(source for source in config["reward"]["source"] if source["name"] == "rm")
    if objective == "single":
        rm["source"] = str(Path(rm["source"]) / "member_0")
    else:
        config["reward"]["ensemble"] = {"objective": objective, "uwo_lambda": UWO_LAMBDA}
    config["kl"]["coef"] = beta
    config["output_dir"], config["run"] = str(out), config["run"] | {"overwrite": True, "progress": False}
    return config


def ppo_run(base: Path, objective: str, beta: float) -> dict[str, Any]:
    """The run's numbers; trained now unless the demo or an earlier sweep did."""
    if beta == 0 and objective in DEMO_STAGE:
        run = base / DEMO_STAGE[objective]
    else:
        run = base / "ensembles" / f"ppo_beta{beta:g}_{objective}"
        if not (run / "final").is_dir():
            log(f"{base.name}: ppo β={beta:g} {objective}")
            rlhf("ppo", ppo_config(base, objective, beta, run), run, base_env(base))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(row["step"], row["eval/reward/gold/mean"], row.get("kl/mean", 0.0)) for row in rows
             if "eval/reward/gold/mean" in row]  # fmt: skip
    steps = [row for row in rows if "kl/mean" in row]
    return {
        "gold_last": evals[-1][1],
        "gold_best": max(gold for _, gold, _ in evals),
        "gold_start": evals[0][1],
        "kl_last": steps[-1]["kl/mean"],
        "score_s": statistics.median(row["time/score_s"] for row in steps),
        "path": [[step, gold, kl] for step, gold, kl in evals],
    }


# -------------------------------------------------------------------------------------------------------------------
# Best-of-n
# -------------------------------------------------------------------------------------------------------------------


def best_of_n(base: Path) -> dict[str, Any]:
    """Gold score and KL bound of best-of-n for each n of `BEST_OF` and each objective (module docstring)."""
    out = base / "ensembles" / "candidates"
    candidates = out.with_suffix(".jsonl")
    if not candidates.is_file():
        log(f"{base.name}: {max(BEST_OF)} candidates per held-out prompt")
        demo = yaml.safe_load((base / "sample" / "candidates" / "sample.yaml").read_text())
        config = demo | {"output": str(candidates), "num_samples": max(BEST_OF), "overwrite": True}
        rlhf("sample", config | {"prompts": str(base / "data" / "eval_prompts.jsonl")}, out, base_env(base))
    return best_of_table(score_candidates(base, candidates))


def best_of_table(scores: dict[str, list[list[float]]]) -> dict[int, dict[str, float]]:
    """n → the KL bound and each objective's mean gold score of its picks (module docstring)."""
    table = {}
    for n in BEST_OF:
        table[n] = {"kl_bound": math.log(n) - (n - 1) / n}
        for objective in OBJECTIVES:
            picks = [
                gold[max(range(start, start + n), key=lambda i: chosen[i])]
                for gold, chosen in zip(scores["gold"], scores[objective], strict=True)
                for start in range(0, len(gold) - n + 1, n)
            ]
            table[n][objective] = statistics.fmean(picks)
    return table


def score_candidates(base: Path, candidates: Path, ensemble: Path | None = None) -> dict[str, list[list[float]]]:
    """Per prompt, each candidate's gold score, its reward by each objective and the members' standard deviation
    (``std``), by ``ensemble`` (the base's ``rm/final`` by default; cached beside the candidates). One base at a
    time: transformers' lazy imports are not safe from two threads at once."""
    with _SCORING:
        return _score_candidates(base, candidates, ensemble)


_SCORING = threading.Lock()


def _score_candidates(base: Path, candidates: Path, ensemble: Path | None) -> dict[str, list[list[float]]]:
    ensemble = ensemble or base / "rm" / "final"
    cache = candidates.with_name(
        "scores.json" if ensemble == base / "rm" / "final" else f"scores_{ensemble.parent.name}.json"
    )
    if cache.is_file():
        return json.loads(cache.read_text())
    import torch

    from rlhf.core.preference import ensemble_reward
    from rlhf.demo import task
    from rlhf.rollout.rewards import load_reward_source
    from rlhf.rollout.rewards.ensemble import member_paths

    rows = [json.loads(line) for line in candidates.read_text().splitlines() if line.strip()]
    prompts = [row["prompt"] for row in rows for _ in row["completions"]]
    completions = [c for row in rows for c in row["completions"]]
    members = [load_reward_source(str(p), batch_size=64) for p in member_paths(ensemble)]
    matrix = torch.stack([torch.tensor(m.score(prompts, completions, {})) for m in members], dim=-1)  # (N, M)
    flat = {"gold": task.gold(prompts, completions), "single": matrix[:, 0].tolist()}
    flat["std"] = matrix.std(-1, correction=0).tolist()
    for objective in OBJECTIVES[1:]:
        flat[objective] = ensemble_reward(matrix, objective, UWO_LAMBDA).tolist()
    k = len(rows[0]["completions"])
    scores = {name: [values[i : i + k] for i in range(0, len(values), k)] for name, values in flat.items()}
    cache.write_text(json.dumps(scores))
    return scores


# -------------------------------------------------------------------------------------------------------------------
# The sweep and its tables
# -------------------------------------------------------------------------------------------------------------------


def doctor(base: Path) -> dict[str, dict[str, int | None]]:
    """Per RL stage of the demo, the first step of the doctor's label-free ``ensemble_disagreement_rising`` and of
    the gold-based ``over_optimisation`` (None: it never fired), replayed over the run's metrics."""
    from rlhf.doctor.checkup import read_run
    from rlhf.doctor.rules import History
    from rlhf.doctor.watch import diagnose

    first = {}
    for stage in ("ppo", "grpo", "ppo_no_kl", "ppo_no_kl_ensemble"):
        record = read_run(base / stage)
        found = {f.rule.name: f.steps[0] for f in diagnose(History(record.rows, record.config))}
        first[stage] = {rule: found.get(rule) for rule in ("ensemble_disagreement_rising", "over_optimisation")}
        key = next(k for k in record.rows[-1] if k.startswith("reward/") and k.endswith("/ensemble_std"))
        first[stage] |= disagreement_rise([row[key] for row in record.rows if key in row])
    return first


def disagreement_rise(values: list[float], window: int = 5) -> dict[str, float]:
    """How far the members' disagreement rose over a run, in the two units of the doctor's rule: the largest ratio of
    a window's mean to the start (the median of the first window), and the largest rise over the start in units of
    its noise (the step-to-step differences' spread, trend removed, over √window), each over every step the rule
    sees (from the second window on, with only the steps so far)."""
    ratios, noises = [], []
    for n in range(2 * window, len(values) + 1):
        seen = values[:n]
        start, now = statistics.median(seen[:window]), statistics.fmean(seen[-window:])
        diffs = [b - a for a, b in itertools.pairwise(seen)]
        spread = statistics.pstdev(diffs)
        ratios.append(now / start)
        noises.append((now - start) / (spread / math.sqrt(window)) if spread else math.inf)
    return {"rise_ratio": max(ratios, default=math.nan), "rise_noises": max(noises, default=math.nan)}


def measure(base: Path) -> dict[str, Any]:
    ppo = {f"{beta:g}": {o: ppo_run(base, o, beta) for o in OBJECTIVES} for beta in (0.0, SMALL_BETA)}
    ppo["0"]["single"]["score_s"] = None
    best_of = {str(n): v for n, v in best_of_n(base).items()}
    return {"base": base.name, "best_of_n": best_of, "ppo": ppo, "doctor": doctor(base)}


def spread(values: list[float]) -> str:
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {sd:.2f} (worst {min(values):.2f})"


def render(results: dict[str, Any]) -> str:
    bases = results["bases"]
    lines = [
        "# Reward-model ensembles against over-optimisation",
        "",
        f"{results['machine']}; {len(bases)} bases ({', '.join(b['base'] for b in bases)}): the demo (small preset), "
        f"{results['members']} members differing by seed, UWO λ = {UWO_LAMBDA}. `python benchmarks/ensembles.py`; method: its docstring.",
        "",
        "Gold score (the hidden judge; the reward models never see it): mean ± sd over the bases (worst base).",
        "",
        "## Best-of-n (the SFT model's samples on the 48 held-out prompts)",
        "",
        "| n | KL bound | " + " | ".join(OBJECTIVES) + " |",
        "|---|---|" + "---|" * len(OBJECTIVES),
    ]
    for n in BEST_OF:
        cells = [spread([b["best_of_n"][str(n)][o] for b in bases]) for o in OBJECTIVES]
        lines.append(f"| {n} | {bases[0]['best_of_n'][str(n)]['kl_bound']:.2f} | " + " | ".join(cells) + " |")
    lines += ["", "## PPO (the demo's β = 0 stage: shared critic, 60 steps; held-out prompts every 10 steps)", ""]
    lines += ["| β | reward | gold at the end | best gold of the run | KL at the end | score s/step | ends above the single RM "
              "| kept ≥ ½ of its best gain |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for beta in (f"{0.0:g}", f"{SMALL_BETA:g}"):
        for o in OBJECTIVES:
            runs = [b["ppo"][beta][o] for b in bases]
            above = sum(b["ppo"][beta][o]["gold_last"] > b["ppo"][beta]["single"]["gold_last"] for b in bases)
            kls = [r["kl_last"] for r in runs]
            lines.append(
                f"| {beta} | {o} | {spread([r['gold_last'] for r in runs])} | "
                f"{spread([r['gold_best'] for r in runs])} | {statistics.fmean(kls):.1f} (max {max(kls):.1f}) | "
                f"{_median(r['score_s'] for r in runs)} | "
                + ("—" if o == "single" else f"{above} of {len(bases)}")
                + f" | {sum(map(kept, runs))} of {len(bases)} |"
            )
    start = [b["ppo"]["0"]["single"]["gold_start"] for b in bases]
    lines += ["", f"The SFT policy's held-out gold (every run's step 0): {spread(start)}.", ""]
    return "\n".join(lines + doctor_table(bases))


def kept(run: dict[str, Any]) -> bool:
    """Whether the run ended with at least half of its best held-out gain over its start: it did not give back
    more than the doctor's `over_optimisation` calls a fall."""
    return run["gold_last"] - run["gold_start"] >= 0.5 * (run["gold_best"] - run["gold_start"])


def doctor_table(bases: list[dict[str, Any]]) -> list[str]:
    """The doctor's label-free warning against its gold-based rule, per demo stage over the bases."""
    lines = ["## The doctor's warning from the members' disagreement", "",
             "| demo stage | bases | `over_optimisation` (gold) fired | `ensemble_disagreement_rising` fired | "
             "both: steps the disagreement came first (median, range) | disagreement without the gold rule | "
             "largest rise ÷ start: median (range) | largest rise in noise units: median (range) |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for stage in ("ppo", "grpo", "ppo_no_kl", "ppo_no_kl_ensemble"):
        firsts = [b["doctor"][stage] for b in bases]
        gold = [f["over_optimisation"] for f in firsts]
        warned = [f["ensemble_disagreement_rising"] for f in firsts]
        ahead = [g - w for g, w in zip(gold, warned, strict=True) if g is not None and w is not None]
        lead = f"{statistics.median(ahead):+g} ({min(ahead):+d} to {max(ahead):+d})" if ahead else "—"
        alone = sum(w is not None and g is None for g, w in zip(gold, warned, strict=True))
        rises = [_range([f[k] for f in firsts], digits) for k, digits in (("rise_ratio", 2), ("rise_noises", 1))]
        lines.append(f"| {stage} | {len(firsts)} | {sum(g is not None for g in gold)} | "
                     f"{sum(w is not None for w in warned)} | {lead} | {alone} | {rises[0]} | {rises[1]} |")  # fmt: skip
    return [*lines, ""]


def _range(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f} to {max(values):.{digits}f})"


def _median(values: Any) -> str:
    present = [v for v in values if v is not None]
    return f"{statistics.median(present):.3f}" if present else "—"


def machine() -> str:
    import platform

    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())  # fmt: skip
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demos", type=Path, default=Path("runs/demo_figures"), help="the demos' directory")
    parser.add_argument("--jobs", type=int, default=1, help="bases at once (each run has one thread)")
    parser.add_argument("--results", type=Path, default=HERE / "results" / "ensembles")
    parser.add_argument("--from-results", action="store_true")
    args = parser.parse_args(argv)
    json_path, md_path = args.results.with_suffix(".json"), args.results.with_suffix(".md")
    if not args.from_results:
        bases = sorted(p for p in args.demos.iterdir() if (p / "summary.json").is_file())
        if not bases:
            parser.error(f"no finished demo under {args.demos}: run tools/demo_figures.py --out {args.demos} first")
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            measured = list(pool.map(measure, bases))
        members = len(json.loads((bases[0] / "rm" / "final" / "ensemble.json").read_text())["members"])
        results = {"machine": machine(), "members": members, "bases": measured}
        json_path.write_text(json.dumps(results, indent=1) + "\n")
    md_path.write_text(render(json.loads(json_path.read_text())))
    print(md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
