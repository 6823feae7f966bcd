"""Asynchronous RL, what it learns: ``sampling.max_staleness`` k = 1 against k = 0 for ``rlhf ppo`` and ``rlhf grpo``,
over seeds × CPU kernel families, on two tasks: the test suite's toy digits task and the demo's PPO and GRPO stages.

    python benchmarks/async_learning.py                              # seeds 0-7 × default, avx2 kernels, both tasks
    python benchmarks/async_learning.py --snapshot                   # the same, from a copy of HEAD's src/
    python benchmarks/async_learning.py --only digits                # the toy task alone (~8 min on one core)
    python benchmarks/async_learning.py --only demo --seeds 0 1 2    # the demo alone, fewer seeds
    python benchmarks/async_learning.py --from-results               # re-render the .md from the saved .json

Tasks (``--only digits|demo``):

- ``digits``: the learning tests of tests/trainers (``test_reward_rises_on_a_toy_task`` in test_grpo.py and
  test_ppo.py): a random-init 2-layer Llama (hidden 64, the 512-token toy tokenizer, built here with
  `rlhf.models.tiny`) learns to write digits, reward = digits / 8 of an 8-token answer (:func:`digit_count`, the
  suite's ``ppo_rewards.py:digit_count``). GRPO: 60 steps of 4 prompts × 8, one update per batch, lr 2e-3; PPO:
  50 steps of 16 prompts, 4 epochs, lr 2e-3, β 0.01. Each (seed, kernel) runs both algorithms at k = 0 and at
  k = 1 (``--sampling.max_staleness 1 --sampling.is_correction token``), ``run.seed`` = the seed.
- ``demo``: ``rlhf demo --preset small --seed S`` (its PPO and GRPO stages are the k = 0 runs), then the PPO and the
  GRPO stage again from the configs the demo wrote beside them (``ppo/ppo.yaml``, ``grpo/grpo.yaml``: the same SFT
  model, reward model, prompts and seed) at k = 1 into ``ppo_k1/`` and ``grpo_k1/``, and the demo's gold
  evaluation of each k = 1 policy (``eval/<algo>/eval.yaml`` with the k = 1 model: 48 held-out prompts against the
  SFT model, the gold judge deciding) into ``eval_k1/``.

Measured per run, from its ``metrics.jsonl``: the final training reward (the mean of ``reward/mean`` over the last 5
steps, as the suite's learning tests take it); digits: the held-out reward after the last step and the mean reward
over every step (how fast it learned); demo: the held-out gold score at the last step (``eval/reward/gold/mean``,
summary.json's ``ppo/held_out_gold_last``), the gold score of the final policy in the demo's evaluation
(summary.json's ``gold/ppo_mean``) and its win rate against SFT, the training gold score, the final KL. Then
``rlhf doctor RUN_DIR --json`` on every run (k = 0 and k = 1): its status and each finding.

Every run is its own process with one torch thread (``OMP_NUM_THREADS=1``), under ``kernel``'s environment
(``avx2`` sets ``ATEN_CPU_CAPABILITY=avx2``, as tools/demo_figures.py does; k = 1's sampling worker inherits it).
With ``--jobs 1`` (the default) each run is pinned to the idler core, its sampling worker with it: a k = 1 run
then takes one core, as a k = 0 run does, and the comparison is of learning, not of speed (k = 1's schedule is
fixed, so its numbers do not depend on the timing: docs/async.md). The sweep resumes: a run whose outputs are
there (a demo's summary.json, a run's final/, an eval's json) is read, not run again. ``--snapshot`` runs rlhf
from a copy of HEAD's src/ (under ``--out``): edits to the working tree during the sweep do not reach its runs.
Writes benchmarks/results/async_learning.{json,md} (``--results`` elsewhere); runs under ``--out``
(runs/async_learning).
Notes: benchmarks/README.md, "Asynchronous RL: learning".

This file is also the digits runs' reward function (:func:`digit_count`): the trainers load it by path, so
everything at its top level is the standard library.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import async_overlap  # noqa: E402  (benchmarks/ is not a package: its runner, standard library only)

HERE = Path(__file__).resolve().parent
SCRIPT = Path(__file__).resolve()
RESULTS = HERE / "results"
FORMAT = 1

KERNELS = ("default", "avx2")
"""Kernel families: ``default`` is what torch picks on this CPU, ``avx2`` sets ``ATEN_CPU_CAPABILITY=avx2``."""
TASKS = ("digits", "demo")
ALGORITHMS = ("ppo", "grpo")
STALENESS = (0, 1)
ASYNC_FLAGS = ("--sampling.max_staleness", "1", "--sampling.is_correction", "token")
"""What turns a k = 0 run into the k = 1 run: one batch sampled ahead, the per-token importance weight."""
LAST = 5
"""Steps the final training reward is averaged over (the suite's learning tests take the last 5)."""
DIGIT_TOKENS = 8

DIGITS_COMMON = {"sampling": {"max_new_tokens": DIGIT_TOKENS, "temperature": 1.0},
                 "optim": {"learning_rate": 2e-3, "scheduler": "constant"},
                 "run": {"save_every": 0, "progress": False, "report_to": ["jsonl"]}}  # fmt: skip
DIGITS = {
    # tests/trainers/test_grpo.py::test_reward_rises_on_a_toy_task: seeds 0-7 end at 0.91-0.97 after 60 steps
    "grpo": {"grpo": {"steps": 60, "group_size": 8, "num_minibatches": 1}, "batch": {"size": 4}},
    # tests/trainers/test_ppo.py::test_reward_rises_on_a_toy_task: seeds 0-7 end at 0.67-0.96 after 50 steps
    "ppo": {"ppo": {"steps": 50, "epochs": 4, "num_minibatches": 1}, "batch": {"size": 16}, "kl": {"coef": 0.01}},
}
"""The digits task's configs: the suite's learning tests (and their make_config defaults), nothing tuned here."""

TIMEOUT = {"demo": 3600, "rl": 1800, "eval": 600, "digits": 900}
"""Seconds a process may take before it is killed (with its sampling worker) and recorded as failed."""


def digit_count(completions, **kwargs) -> list[float]:
    """The digits task's reward: digits in the completion / 8, the share of an 8-token answer that is digits (digits
    are single tokens in the toy tokenizer; a random-init model starts near 0.02, one that only writes digits
    scores 1). The same function as tests/trainers/ppo_rewards.py:digit_count."""
    return [sum(ch.isdigit() for ch in c) / DIGIT_TOKENS for c in completions]


# -------------------------------------------------------------------------------------------------------------------
# Running: one process per run, one thread, one core
# -------------------------------------------------------------------------------------------------------------------


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def kernel_env(kernel: str) -> dict[str, str]:
    """This process's environment for a run under ``kernel`` (one of `KERNELS`), with one torch thread: the runs
    share the machine with other work, and at the demo's sizes 1 and 2 threads give the same figures
    (docs/reproducibility.md)."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if kernel != "default":
        env["ATEN_CPU_CAPABILITY"] = kernel
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled"}  # fmt: skip
    if not async_overlap.rlhf_importable():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent / "src"), env.get("PYTHONPATH")]))
    return env


def idler_core(seconds: float = 0.5) -> int | None:
    """The core of this process's affinity set that was busy least over the next ``seconds`` (/proc/stat), None
    when that cannot be read. Pinning a k = 1 run there keeps its trainer and worker on one core."""

    def busy() -> dict[int, tuple[int, int]]:
        out = {}
        for line in Path("/proc/stat").read_text().splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name != "cpu":
                ticks = [int(x) for x in fields[:8]]
                out[int(name[3:])] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))
        return out

    try:
        allowed = os.sched_getaffinity(0)
        before = busy()
        time.sleep(seconds)
        after = busy()
    except (OSError, AttributeError, ValueError):
        return None
    share = {c: (after[c][0] - before[c][0]) / max(1, after[c][1] - before[c][1]) for c in allowed if c in after}
    return min(share, key=lambda c: (share[c], c)) if share else None


def execute(command: list[str], env: dict[str, str], logfile: Path, timeout: float, pin: bool) -> dict[str, Any]:
    """``command`` run as the overlap benchmark runs its own (`async_overlap.run_in_session`), pinned to the idler
    core when ``pin``: its exit code and seconds, with the log's tail when it failed, and the core."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    core = idler_core() if pin else None
    preexec = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    return async_overlap.run_in_session(command, env, logfile, timeout, preexec) | {"core": core}


def rlhf(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlhf", *args]


def trained(run_dir: Path) -> bool:
    """Whether the trainer run in ``run_dir`` finished: it writes final/ after its last step."""
    return (run_dir / "final").is_dir() and (run_dir / "metrics.jsonl").is_file()


def train(command: list[str], run_dir: Path, env: dict[str, str], timeout: float, pin: bool) -> dict[str, Any]:
    """A trainer run into ``run_dir`` unless it finished before (then it is read): ``{"ran": ...}`` and, when it ran
    now, its exit code and seconds. An interrupted run's directory is replaced (``--run.overwrite``)."""
    if trained(run_dir):
        return {"ran": False}
    if run_dir.exists():
        command = [*command, "--run.overwrite"]
    return {"ran": True, **execute(command, env, run_dir.with_name(run_dir.name + ".log"), timeout, pin)}


def doctor(run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """``rlhf doctor RUN_DIR --json``: the run's status and findings (rule, severity, steps, evidence)."""
    if not (run_dir / "metrics.jsonl").is_file():
        return {"status": "no run", "findings": []}
    done = subprocess.run(rlhf("doctor", str(run_dir), "--json"), env=env, capture_output=True, text=True)
    try:
        verdict = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"status": "doctor failed", "findings": [], "error": (done.stderr or done.stdout)[-600:]}
    runs = verdict.get("runs") or [{}]
    findings = [{k: f.get(k) for k in ("rule", "severity", "steps", "evidence")} for f in runs[0].get("findings", [])]
    return {"status": verdict.get("status"), "exit_code": verdict.get("exit_code"), "findings": findings}


# -------------------------------------------------------------------------------------------------------------------
# Reading a run's numbers
# -------------------------------------------------------------------------------------------------------------------


def read_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_rows(rows: list[dict]) -> list[dict]:
    """The training rows (those with ``reward/mean``; an eval-only row at step 0 has none), in step order."""
    return sorted((row for row in rows if "reward/mean" in row), key=lambda row: row["step"])


def last_mean(rows: list[dict], column: str, n: int = LAST) -> float | None:
    values = [row[column] for row in rows if row.get(column) is not None][-n:]
    return statistics.fmean(values) if values else None


def last_eval(rows: list[dict], column: str) -> float | None:
    """``column`` of the run's last held-out evaluation (the row with the highest step that has it)."""
    evals = sorted((row for row in rows if row.get(column) is not None), key=lambda row: row["step"])
    return evals[-1][column] if evals else None


def async_numbers(steps: list[dict]) -> dict[str, Any]:
    """How stale the k = 1 batches were and how much the importance weight corrected (absent at k = 0)."""
    stale = [row for row in steps if row.get("async/staleness")]
    if not stale:
        return {}

    def values(column: str) -> list[float]:
        return [row[column] for row in stale if row.get(column) is not None]

    weights, capped, gap = (
        values("rollout/is_weight_mean"),
        values("rollout/is_capped_frac"),
        values("rollout/logprob_diff_mean"),
    )
    return {
        "staleness_max": max(row["async/staleness"] for row in stale),
        "is_weight_mean": statistics.fmean(weights) if weights else None,
        "is_capped_frac_max": max(capped) if capped else None,
        "logprob_diff_mean": statistics.fmean(gap) if gap else None,
    }


def digits_numbers(run_dir: Path) -> dict[str, Any]:
    rows = read_rows(run_dir)
    steps = step_rows(rows)
    if not steps:
        return {}
    rewards = [row["reward/mean"] for row in steps]
    return {
        "steps": len(steps),
        "reward_first": statistics.fmean(rewards[:LAST]),
        "reward_last": last_mean(steps, "reward/mean"),
        "reward_auc": statistics.fmean(rewards),
        "held_out_last": last_eval(rows, "eval/reward/mean"),
        "kl_last": steps[-1].get("kl/mean"),
        **async_numbers(steps),
    }


def demo_numbers(run_dir: Path, evaluation: Path) -> dict[str, Any]:
    """A demo RL stage's numbers: its metrics (training reward = the reward model's score, gold rides along with
    weight 0) and the demo's gold evaluation of its final policy (``evaluation``, rlhf eval's json)."""
    rows = read_rows(run_dir)
    steps = step_rows(rows)
    if not steps:
        return {}
    out = {
        "steps": len(steps),
        "reward_first": statistics.fmean(row["reward/mean"] for row in steps[:LAST]),
        "reward_last": last_mean(steps, "reward/mean"),
        "train_gold_last": last_mean(steps, "reward/gold/mean"),
        "held_out_gold_last": last_eval(rows, "eval/reward/gold/mean"),
        "held_out_rm_last": last_eval(rows, "eval/reward/rm/mean"),
        "kl_last": steps[-1].get("kl/mean"),
        **async_numbers(steps),
    }
    if evaluation.is_file():
        judged = json.loads(evaluation.read_text())
        out |= {"gold_eval": judged["reward/gold/mean"], "win_rate_vs_sft": judged["win_rate"],
                "sft_gold_eval": judged["baseline/reward/gold/mean"], "kl_eval": judged.get("kl/mean")}  # fmt: skip
    return out


# -------------------------------------------------------------------------------------------------------------------
# The two tasks
# -------------------------------------------------------------------------------------------------------------------


def digits_assets(out: Path) -> dict[str, str]:
    """The tiny Llama of the suite's learning tests (tests/conftest.py's ``tiny_llama_dir``: seed 0, hidden 64,
    2 layers, the 512-token tokenizer on ``toy_corpus(2000, seed=0)``), its prompts (test_grpo.py's
    ``prompts_file``: the first 3-4 words of ``toy_corpus(40, seed=5)``), 16 held-out prompts and the two
    configs; built once under ``out/assets``."""
    assets = out / "assets"
    paths = {"model": assets / "tiny_llama", "train": assets / "prompts.jsonl", "eval": assets / "eval_prompts.jsonl"}
    paths |= {algo: assets / f"{algo}.yaml" for algo in ALGORITHMS}
    if not all(p.exists() for p in paths.values()):
        import torch

        from rlhf.models.tiny import save_tiny, tiny_causal_lm, toy_corpus, train_tokenizer

        torch.set_num_threads(1)
        tokenizer = train_tokenizer(toy_corpus(2000, seed=0), vocab_size=512)
        save_tiny(tiny_causal_lm("llama", tokenizer, seed=0), tokenizer, paths["model"])
        for name, lines in (("train", toy_corpus(40, seed=5)), ("eval", toy_corpus(16, seed=6))):
            rows = [{"prompt": " ".join(line.split()[: 3 + i % 2])} for i, line in enumerate(lines)]
            paths[name].write_text("".join(json.dumps(row) + "\n" for row in rows))
        for algo in ALGORITHMS:
            steps = DIGITS[algo][algo]["steps"]
            config = {"model": {"name": str(paths["model"])},
                      "data": {"train": str(paths["train"]), "eval": str(paths["eval"])},
                      "reward": {"source": f"{SCRIPT}:digit_count"}, **DIGITS_COMMON, **DIGITS[algo]}  # fmt: skip
            # held out before the first step and after the last only: every eval is a pass over the prompts
            config["run"] = config["run"] | {"eval_every": steps}
            paths[algo].write_text(json.dumps(config, indent=1) + "\n")  # JSON is YAML
    return {name: str(path) for name, path in paths.items()}


def digits_run(kernel: str, seed: int, algo: str, k: int, out: Path, assets: dict, pin: bool) -> dict[str, Any]:
    """One digits run (``out/digits/<kernel>_seed_<seed>/<algo>_k<k>``), run unless it finished before."""
    run_dir = out / "digits" / f"{kernel}_seed_{seed}" / f"{algo}_k{k}"
    env = kernel_env(kernel)
    command = rlhf(algo, "--config", assets[algo], "--output_dir", str(run_dir), "--run.seed", str(seed))
    if k:
        command += ASYNC_FLAGS
    ran = train(command, run_dir, env, TIMEOUT["digits"], pin)
    record = {"task": "digits", "algo": algo, "k": k, "kernel": kernel, "seed": seed, "run_dir": str(run_dir)}
    record |= {"process": ran, "numbers": digits_numbers(run_dir), "doctor": doctor(run_dir, env)}
    if ran.get("error") or not trained(run_dir):
        record["error"] = ran.get("error", "no final/ after the run")
    return record


def demo_seed(kernel: str, seed: int, out: Path, preset: str, pin: bool) -> list[dict[str, Any]]:
    """One demo (``out/demo/<kernel>_seed_<seed>``) and its PPO and GRPO stages again at k = 1, each stage's gold
    evaluation at k = 1 too; the four runs' records (k = 0 and k = 1 of each algorithm)."""
    directory = out / "demo" / f"{kernel}_seed_{seed}"
    env = kernel_env(kernel)
    base = {"task": "demo", "kernel": kernel, "seed": seed}
    demo: dict[str, Any] = {"ran": False}
    if not (directory / "summary.json").is_file():
        command = rlhf("demo", "--preset", preset, "--seed", str(seed), "--output_dir", str(directory), "--no-progress")
        if directory.exists():  # an interrupted demo: start it again, its k = 1 runs too (they start from its models)
            command.append("--overwrite")
            for stale in ("ppo_k1", "grpo_k1", "eval_k1"):
                shutil.rmtree(directory / stale, ignore_errors=True)
        log(f"demo, {kernel} kernels, seed {seed}: rlhf demo --seed {seed}")
        demo = {"ran": True, **execute(command, env, directory.with_name(directory.name + ".log"), TIMEOUT["demo"],
                                       pin)}  # fmt: skip
    records = []
    for algo in ALGORITHMS:
        stage = directory / algo
        k0 = base | {"algo": algo, "k": 0, "run_dir": str(stage), "process": demo}
        k0 |= {"numbers": demo_numbers(stage, directory / "eval" / f"{algo}.json"), "doctor": doctor(stage, env)}
        if not (directory / "summary.json").is_file():
            k0["error"] = demo.get("error", "the demo wrote no summary.json")
            records.append(k0)
            records.append(base | {"algo": algo, "k": 1, "error": "no k = 0 demo to start from", "numbers": {}})
            continue
        k0["seconds"] = json.loads((directory / "summary.json").read_text())["time/" + algo + "_s"]
        records.append(k0)
        records.append(demo_k1(directory, algo, env, pin, base))
    return records


def demo_k1(directory: Path, algo: str, env: dict[str, str], pin: bool, base: dict) -> dict[str, Any]:
    """The demo's ``algo`` stage again at k = 1 from the config it wrote (same models, data and seed), then the
    demo's gold evaluation of its final policy (the stage's eval config, the k = 1 model)."""
    run_dir, evaluation = directory / f"{algo}_k1", directory / "eval_k1" / f"{algo}.json"
    if not trained(run_dir):
        evaluation.unlink(missing_ok=True)  # it judged an earlier k = 1 model
        log(f"  {directory.name}: {algo} at k = 1")
    command = rlhf(algo, "--config", str(directory / algo / f"{algo}.yaml"), "--output_dir", str(run_dir),
                   "--run.no-progress", *ASYNC_FLAGS)  # fmt: skip
    ran = train(command, run_dir, env, TIMEOUT["rl"], pin)
    record = base | {"algo": algo, "k": 1, "run_dir": str(run_dir), "process": ran}
    if ran.get("error") or not trained(run_dir):
        record |= {"error": ran.get("error", "no final/ after the run"), "numbers": demo_numbers(run_dir, evaluation)}
        record["doctor"] = doctor(run_dir, env)
        return record
    record["seconds"] = ran.get("wall_s")
    if not evaluation.is_file():
        command = rlhf("eval", "--config", str(directory / "eval" / algo / "eval.yaml"), "--model.name",
                       str(run_dir / "final"), "--output", str(evaluation), "--samples_output",
                       str(evaluation.with_name(f"{algo}_samples.jsonl")), "--overwrite")  # fmt: skip
        judged = execute(command, env, evaluation.with_suffix(".log"), TIMEOUT["eval"], pin)
        if judged.get("error"):
            record["eval_error"] = judged["error"]
    record |= {"numbers": demo_numbers(run_dir, evaluation), "doctor": doctor(run_dir, env)}
    return record


# -------------------------------------------------------------------------------------------------------------------
# Over the runs: mean ± sd, worst, per kernel, k = 1 against the seed-to-seed spread
# -------------------------------------------------------------------------------------------------------------------

METRICS = {
    "digits": (
        ("reward_last", "final training reward (last 5 steps)", True),
        ("held_out_last", "held-out reward after the last step", True),
        ("reward_auc", "mean reward over every step (how fast it learned)", True),
    ),
    "demo": (
        ("held_out_gold_last", "held-out gold score at the last step", True),
        ("gold_eval", "gold score of the final policy (the demo's eval)", True),
        ("win_rate_vs_sft", "win rate against SFT (the demo's eval)", True),
        ("reward_last", "final training reward (reward model, last 5 steps)", True),
        ("train_gold_last", "training gold score (last 5 steps)", True),
        ("kl_last", "KL to the reference at the end (nats)", False),
    ),
}
"""Per task: (number, what the table calls it, whether higher is better: the worst run is the lowest)."""
HEADLINE = {"digits": ("reward_last",), "demo": ("held_out_gold_last", "gold_eval", "reward_last")}
"""The numbers of the headline table (docs/async.md)."""


def values(runs: list[dict], task: str, algo: str, k: int, key: str, kernel: str | None = None) -> list[float]:
    out = []
    for run in runs:
        if (run["task"], run["algo"], run["k"]) == (task, algo, k) and kernel in (None, run["kernel"]):
            value = run.get("numbers", {}).get(key)
            if value is not None and not run.get("error") and math.isfinite(value):
                out.append(value)
    return out


def spread(xs: list[float]) -> dict[str, Any] | None:
    if not xs:
        return None
    return {"n": len(xs), "mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs)}  # fmt: skip


def comparison(runs: list[dict], task: str, algo: str, key: str, higher_is_better: bool) -> dict[str, Any] | None:
    """k = 1 against k = 0 on one number: each side's spread over its runs, the difference of the means against the
    k = 0 runs' standard deviation (the seed-to-seed spread), the paired differences (same seed and kernel: the same
    first batch, and for the demo the same SFT and reward models) and the means per kernel family."""
    k0, k1 = (spread(values(runs, task, algo, k, key)) for k in STALENESS)
    if k0 is None or k1 is None:
        return None
    pairs = {}
    for run in runs:
        if (run["task"], run["algo"], run["k"]) == (task, algo, 0):
            pairs[(run["kernel"], run["seed"])] = run
    diffs = []
    for run in runs:
        if (run["task"], run["algo"], run["k"]) == (task, algo, 1) and (run["kernel"], run["seed"]) in pairs:
            a, b = pairs[(run["kernel"], run["seed"])].get("numbers", {}).get(key), run.get("numbers", {}).get(key)
            if a is not None and b is not None:
                diffs.append(b - a)
    delta = k1["mean"] - k0["mean"]
    kernels = sorted({run["kernel"] for run in runs}, key=lambda k: KERNELS.index(k) if k in KERNELS else 99)
    per_kernel = {kernel: {k: (statistics.fmean(v) if (v := values(runs, task, algo, k, key, kernel)) else None)
                           for k in STALENESS} for kernel in kernels}  # fmt: skip
    worst = "min" if higher_is_better else "max"
    # a second reading of "within the spread": how many k = 1 runs land inside the range the k = 0 runs cover
    inside = sum(k0["min"] <= x <= k0["max"] for x in values(runs, task, algo, 1, key))
    # Welch's t of the two means: how far apart they are for runs this few (|t| above about 2.3: p < 0.05 at 8 runs
    # a side; 2.0 at 16)
    se = math.sqrt(k0["sd"] ** 2 / k0["n"] + k1["sd"] ** 2 / k1["n"])
    return {"k0": k0, "k1": k1, "delta": delta, "within_spread": abs(delta) <= k0["sd"],
            "delta_over_sd": delta / k0["sd"] if k0["sd"] > 0 else None, "paired": spread(diffs),
            "k1_inside_k0_range": inside, "welch_t": delta / se if se > 0 else None,
            "kernels_agree": kernels_agree(runs, task, algo, key), "worst": {"k0": k0[worst], "k1": k1[worst]},
            "per_kernel": per_kernel, "higher_is_better": higher_is_better}  # fmt: skip


def kernels_agree(runs: list[dict], task: str, algo: str, key: str) -> dict[str, int]:
    """Of the (seed, k) pairs run under every kernel family, how many gave the same number (to 1e-9) under all of
    them: where they all agree, the runs are fewer independent samples than they look."""
    by_pair: dict[tuple[int, int], list[float]] = {}
    kernels = {run["kernel"] for run in runs if run["task"] == task}
    for run in runs:
        value = run.get("numbers", {}).get(key)
        if (run["task"], run["algo"]) == (task, algo) and value is not None and not run.get("error"):
            by_pair.setdefault((run["seed"], run["k"]), []).append(value)
    complete = [v for v in by_pair.values() if len(v) == len(kernels) > 1]
    return {"pairs": len(complete), "same": sum(max(v) - min(v) <= 1e-9 for v in complete)}


def summarize_all(runs: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for task, metrics in METRICS.items():
        for algo in ALGORITHMS:
            for key, _, higher in metrics:
                c = comparison(runs, task, algo, key, higher)
                if c is not None:
                    out[f"{task}/{algo}/{key}"] = c
    return out


# -------------------------------------------------------------------------------------------------------------------
# The report
# -------------------------------------------------------------------------------------------------------------------


def fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def machine_line(results: dict) -> str:
    """The machine, as tools/demo_figures.py writes it, with each kernel family's level."""
    envs = results.get("environment", {})
    if not envs:
        return "machine unknown"
    env = next(iter(envs.values()))
    levels = ", ".join(f"{k}: {e['cpu_capability']}" for k, e in envs.items())
    return (f"{env['cpu']}, {env['threads']} thread(s), torch {env['torch']}, transformers {env['transformers']} "
            f"(kernels {levels})")  # fmt: skip


def digits_of(key: str) -> int:
    return 1 if key == "kl_last" else 3


def headline_table(results: dict) -> str:
    lines = [
        "| task | algorithm | number | k = 0: mean ± sd (worst) | k = 1: mean ± sd (worst) | Δ = k1 − k0 | "
        "within the spread (\\|Δ\\| ≤ sd of k = 0) | k = 1 runs inside k = 0's range | Welch t |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    labels = {task: {key: label for key, label, _ in metrics} for task, metrics in METRICS.items()}
    for task in TASKS:
        for algo in ALGORITHMS:
            for key in HEADLINE[task]:
                c = results["summary"].get(f"{task}/{algo}/{key}")
                if c is None:
                    continue
                d = digits_of(key)
                k0, k1 = c["k0"], c["k1"]
                verdict = "yes" if c["within_spread"] else ("no: better" if (c["delta"] > 0) == c["higher_is_better"]
                                                            else "**no: worse**")  # fmt: skip
                ratio = f" ({c['delta_over_sd']:+.1f} sd)" if c["delta_over_sd"] is not None else ""
                lines.append(
                    f"| {task} | {algo.upper()} | {labels[task][key]} | {fmt(k0['mean'], d)} ± {fmt(k0['sd'], d)} "
                    f"({fmt(c['worst']['k0'], d)}) | {fmt(k1['mean'], d)} ± {fmt(k1['sd'], d)} "
                    f"({fmt(c['worst']['k1'], d)}) | {c['delta']:+.{d}f}{ratio} | {verdict} "
                    f"| {c['k1_inside_k0_range']} of {k1['n']} | {fmt(c['welch_t'], 1)} |"
                )
    return "\n".join(lines)


def full_table(results: dict, task: str) -> str:
    kernels = results["kernels"]
    head = " | ".join(f"k = {k}, {kernel}" for k in STALENESS for kernel in kernels)
    lines = [
        f"| algorithm | number | k = 0 (n) | k = 1 (n) | worst k = 0 / k = 1 | paired Δ: mean ± sd | {head} "
        "| the kernel families agree |",
        "|---|---|---|---|---|---|" + "---|" * (2 * len(kernels)) + "---|",
    ]
    for algo in ALGORITHMS:
        for key, label, _ in METRICS[task]:
            c = results["summary"].get(f"{task}/{algo}/{key}")
            if c is None:
                continue
            d = digits_of(key)
            per = " | ".join(fmt(c["per_kernel"].get(kernel, {}).get(k), d) for k in STALENESS for kernel in kernels)
            paired = c["paired"]
            paired_text = f"{paired['mean']:+.{d}f} ± {paired['sd']:.{d}f}" if paired else "—"
            lines.append(
                f"| {algo.upper()} | {label} | {fmt(c['k0']['mean'], d)} ± {fmt(c['k0']['sd'], d)} ({c['k0']['n']}) "
                f"| {fmt(c['k1']['mean'], d)} ± {fmt(c['k1']['sd'], d)} ({c['k1']['n']}) "
                f"| {fmt(c['worst']['k0'], d)} / {fmt(c['worst']['k1'], d)} | {paired_text} | {per} "
                f"| {agree_text(c.get('kernels_agree'))} |"
            )
    return "\n".join(lines)


def agree_text(agree: dict | None) -> str:
    if not agree or not agree["pairs"]:
        return "—"
    return f"{agree['same']} of {agree['pairs']} (seed, k)"


def runs_table(results: dict, task: str) -> str:
    keys = [key for key, _, _ in METRICS[task]]
    lines = [
        "| algorithm | kernel | seed | k | " + " | ".join(keys) + " | IS weight / capped max / gap | doctor |",
        "|---|---|---|---|" + "---|" * len(keys) + "---|---|",
    ]
    for run in sorted((r for r in results["runs"] if r["task"] == task),
                      key=lambda r: (ALGORITHMS.index(r["algo"]), r["kernel"], r["seed"], r["k"])):  # fmt: skip
        n = run.get("numbers", {})
        cells = " | ".join(fmt(n.get(key), digits_of(key)) for key in keys)
        weights = "—"
        if n.get("is_weight_mean") is not None:
            weights = (
                f"{n['is_weight_mean']:.3f} / {fmt(n.get('is_capped_frac_max'))} / {fmt(n.get('logprob_diff_mean'))}"
            )
        verdict = doctor_text(run.get("doctor"))
        if run.get("error"):
            verdict = f"**failed** ({run['error'][:160]}…)"
        lines.append(
            f"| {run['algo'].upper()} | {run['kernel']} | {run['seed']} | {run['k']} | {cells} | {weights} "
            f"| {verdict} |"
        )
    return "\n".join(lines)


def doctor_text(verdict: dict | None) -> str:
    if not verdict:
        return "—"
    names = ", ".join(f"{f['rule']} ({f['severity']})" for f in verdict.get("findings", []))
    return verdict.get("status", "?") + (f": {names}" if names else "")


def doctor_section(results: dict) -> str:
    runs = [r for r in results["runs"] if r.get("doctor")]
    counts: dict[str, int] = {}
    for run in runs:
        counts[run["doctor"].get("status", "?")] = counts.get(run["doctor"].get("status", "?"), 0) + 1
    lines = [
        f"`rlhf doctor RUN_DIR --json` on all {len(runs)} runs: "
        + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        + "."
    ]
    flagged = [
        (run, f)
        for run in runs
        for f in run["doctor"].get("findings", [])
        if f.get("severity") in ("warning", "critical")
    ]
    if flagged:
        lines += ["", "Warnings and critical findings:", ""]
        for run, f in flagged:
            lines.append(
                f"- {run['task']} {run['algo'].upper()} k = {run['k']}, {run['kernel']} kernels, seed {run['seed']}: "
                f"**{f['rule']}** ({f['severity']}, steps {f.get('steps')}): {f.get('evidence')}"
            )
    else:
        lines += ["", "No warning or critical finding on any run."]
    infos = [(run, f) for run in runs for f in run["doctor"].get("findings", []) if f.get("severity") == "info"]
    if infos:
        by_rule: dict[str, list[str]] = {}
        for run, f in infos:
            by_rule.setdefault(f["rule"], []).append(
                f"{run['task']} {run['algo']} k{run['k']} {run['kernel']} s{run['seed']}"
            )
        lines += [
            "",
            "Info findings: "
            + "; ".join(f"`{rule}` on {len(w)} run(s) ({', '.join(w)})" for rule, w in by_rule.items())
            + ".",
        ]
    if any(f["rule"] == "async_does_not_pay" for _, f in infos):
        lines += ["", "`async_does_not_pay` (info) is expected here: a k = 1 run's trainer and sampling worker share "
                  "the one core the run is pinned to, so nothing overlaps; this sweep measures learning, not speed "
                  "(benchmarks/results/async_overlap.md measures the speed)."]  # fmt: skip
    return "\n".join(lines)


def code_line(code: dict) -> str:
    line = f"Code: commit {(code.get('commit') or '?')[:12]}, rlhf from {code.get('rlhf_from', '?')}"
    if code.get("src_modified") and not code.get("src_modified_ignored"):
        line += f"; src/ then differed from the commit in: {', '.join(code['src_modified'])}"
    return line + "."


def render(results: dict) -> str:
    kernels, seeds = results["kernels"], results["seeds"]
    failed = [r for r in results["runs"] if r.get("error")]
    parts = [
        "# Asynchronous RL, what it learns: k = 1 against k = 0",
        "",
        f"Seeds {', '.join(map(str, seeds))} × {' and '.join(kernels)} kernels, every run in its own process with "
        f"one thread, pinned to one core with its sampling worker, on {machine_line(results)}; "
        f"{results.get('date', '')}. `python benchmarks/async_learning.py` (notes: benchmarks/README.md, "
        '"Asynchronous RL: learning"). k = 1: `--sampling.max_staleness 1 --sampling.is_correction token`, '
        "everything else as at k = 0.",
        "",
        code_line(results.get("code", {})),
        "",
        "Within the spread: the difference of the means, k = 1 − k = 0, is at most one standard deviation of the "
        "k = 0 runs (seed to seed and kernel to kernel). Beside it: how many k = 1 runs land inside the range of "
        "the k = 0 runs, and Welch's t of the two means (|t| above about 2.3: p < 0.05 at 8 runs a side; 2.0 at 16). Where the "
        "two kernel families give the same numbers (the per-task tables' last column), the runs are half as many "
        "independent samples as they look and t is √2 too large. Worst: the lowest run (for KL the highest).",
        "",
        "## Headline",
        "",
        headline_table(results),
    ]
    for task, title in (("digits", "Digits task (the suite's learning tests)"), ("demo", "The demo's PPO and GRPO")):
        if not any(r["task"] == task for r in results["runs"]):
            continue
        parts += ["", f"## {title}", "", results["descriptions"][task], "", full_table(results, task), "",
                  "Every run (the IS columns: k = 1's mean importance weight, the most tokens capped in a step, "
                  "the mean behaviour–proximal gap in nats per token):", "", runs_table(results, task)]  # fmt: skip
    parts += ["", "## The doctor", "", doctor_section(results)]
    if failed:
        parts += ["", "## Failed runs", ""]
        parts += [
            f"- {r['task']} {r['algo']} k = {r['k']}, {r['kernel']} kernels, seed {r['seed']}: {r['error']}"
            for r in failed
        ]
    if results.get("note"):
        parts += ["", results["note"]]
    return "\n".join(parts) + "\n"


DESCRIPTIONS = {
    "digits": "A random-init 2-layer Llama (hidden 64) learns to write digits: reward = digits / 8 of an 8-token "
    "answer (tests/trainers/ppo_rewards.py:digit_count). GRPO: 60 steps of 4 prompts × 8, one update per batch, "
    "lr 2e-3; PPO: 50 steps of 16 prompts, 4 epochs, lr 2e-3, β 0.01 (the suite's learning tests). Held out: 16 "
    "other prompts after the last step.",
    "demo": "`rlhf demo --preset small --seed S` (k = 0: its `ppo/` and `grpo/` stages), then each stage again from "
    "the config the demo wrote (`ppo/ppo.yaml`, `grpo/grpo.yaml`) at k = 1, and the demo's gold evaluation of the "
    "k = 1 policy (`eval/<algo>/eval.yaml`, 48 held-out prompts against SFT). PPO: 60 steps of 32 prompts, 4 epochs "
    "× 2 minibatches, β 0.2; GRPO: 40 steps of 4 prompts × 8; both against the reward model, the gold judge "
    "riding along with weight 0.",
}


# -------------------------------------------------------------------------------------------------------------------
# Main
# -------------------------------------------------------------------------------------------------------------------


def environments(kernels: list[str]) -> dict[str, dict]:
    """`rlhf.runlog.seeding.environment()` under each kernel family (its level differs), in a child process."""
    code = (
        "import json, rlhf; from rlhf.runlog.seeding import environment; "
        "print(json.dumps(environment() | {'rlhf': rlhf.__file__}))"
    )
    out = {}
    for kernel in kernels:
        done = subprocess.run([sys.executable, "-c", code], env=kernel_env(kernel), capture_output=True, text=True)
        out[kernel] = json.loads(done.stdout) if done.returncode == 0 else {"cpu_capability": "?", "error": done.stderr}
    return out


def code_state(snapshot_under: Path | None) -> dict[str, Any]:
    """The code the runs use: the repository's commit and the files of src/ that differ from it; with
    ``snapshot_under``, HEAD's src/ copied to ``snapshot_under/code/<commit>/src`` (``git archive``) and put first on
    this process's and every run's path (PYTHONPATH, inherited through `kernel_env`): a sweep takes an hour, and a
    src/ edited meanwhile would give its later runs other code than its first."""
    repo = HERE.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    state: dict[str, Any] = {
        "commit": commit or None,
        "src_modified": [line.split()[-1] for line in git("status", "--porcelain", "--", "src").splitlines()],
    }
    if snapshot_under is None or not commit:
        state["rlhf_from"] = "the installed rlhf (the working tree's src/ when installed editable)"
        return state
    src = snapshot_under / "code" / commit[:12] / "src"
    if not (src / "rlhf").is_dir():
        src.parent.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(repo), "archive", commit, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(src.parent)], input=archive.stdout, check=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(src))
    state |= {"rlhf_from": f"a copy of commit {commit[:12]}'s src/ ({src})", "src_modified_ignored": True}
    return state


def write(results: dict, where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    results["summary"] = summarize_all(results["runs"])
    (where / "async_learning.json").write_text(json.dumps(results, indent=1) + "\n")
    (where / "async_learning.md").write_text(render(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--only", choices=TASKS, help="one task (default: digits, then demo)")
    parser.add_argument("--out", type=Path, default=Path("runs/async_learning"), help="where the runs go")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where async_learning.{json,md} go")
    parser.add_argument("--preset", default="small", help="the demo's preset")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (above 1 they are not pinned to a core)")
    parser.add_argument("--note", help="a line for the end of the .md (e.g. why fewer seeds)")
    parser.add_argument("--from-results", action="store_true", help="re-render the .md from the saved .json")
    parser.add_argument("--snapshot", action="store_true",
                        help="run rlhf from a copy of HEAD's src/ (OUT/code/<commit>/src), not the working tree: "
                        "edits to src/ during the sweep do not reach its runs")  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_results:
        results = json.loads((args.results / "async_learning.json").read_text())
        results["note"] = args.note or results.get("note")
        write(results, args.results)
        print(render(results))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM ends the current run too (execute)
    out = args.out.resolve()  # the demo writes absolute paths into its configs
    code = code_state(out if args.snapshot else None)
    tasks = [args.only] if args.only else list(TASKS)
    pin = args.jobs == 1
    results: dict[str, Any] = {
        "format": FORMAT, "seeds": args.seeds, "kernels": args.kernels, "tasks": tasks, "preset": args.preset,
        "environment": environments(args.kernels), "descriptions": DESCRIPTIONS, "note": args.note,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"), "runs": [], "code": code,
        "config": {"digits": DIGITS, "digits_common": DIGITS_COMMON, "async_flags": list(ASYNC_FLAGS)},
    }  # fmt: skip
    lock = threading.Lock()
    start = time.perf_counter()

    def keep(records: list[dict]) -> None:
        with lock:  # every finished run is in the results at once: an interrupted sweep leaves a readable report
            results["runs"].extend(records)
            results["wall_s"] = time.perf_counter() - start
            write(results, args.results)
        for r in records:
            what = "failed: " + r["error"][:300] if r.get("error") else doctor_text(r.get("doctor"))
            numbers = {k: round(v, 4) for k, v in r.get("numbers", {}).items() if isinstance(v, float)}
            log(f"{r['task']} {r['algo']} k={r['k']} {r['kernel']} seed {r['seed']}: {json.dumps(numbers)} {what}")

    units: list[Any] = []
    if "digits" in tasks:
        assets = digits_assets(out / "digits")
        for seed in args.seeds:
            for kernel in args.kernels:
                for algo in ALGORITHMS:
                    for k in STALENESS:
                        units.append(lambda s=seed, n=kernel, a=algo, k=k: [digits_run(n, s, a, k, out, assets, pin)])
    if "demo" in tasks:
        for seed in args.seeds:
            for kernel in args.kernels:
                units.append(lambda s=seed, n=kernel: demo_seed(n, s, out, args.preset, pin))
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for future in concurrent.futures.as_completed([pool.submit(unit) for unit in units]):
            keep(future.result())
    results["wall_s"] = time.perf_counter() - start
    write(results, args.results)
    print(render(results))
    log(f"{results['wall_s']:.0f} s in all; results in {args.results}")
    return 1 if any(r.get("error") for r in results["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
