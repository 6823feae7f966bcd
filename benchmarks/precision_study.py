"""Does bfloat16 mixed precision (``model.bf16``) learn what float32 learns, and does pure bfloat16 at a small
learning rate move the weights at all? Every run goes through the public trainers, in its own process.

    python benchmarks/precision_study.py                          # seeds 0-2 × default, avx2 kernels, every part: ≈5 min
    python benchmarks/precision_study.py --seeds 0 --kernels default --parts learn
    python benchmarks/precision_study.py --from-results            # the tables of the runs in OUT so far

1. ``learn``: the toy task of tests/trainers/test_ppo.py and test_grpo.py ``test_reward_rises_on_a_toy_task`` with
   their exact settings — a random-init 2-layer llama (``rlhf.models.tiny``, built as tests/conftest.py builds
   ``tiny_llama_dir``) learns to write digits (reward = digits / 8 of an 8-token response; `digit_count`, a copy of
   tests/trainers/ppo_rewards.py's) — PPO 50 iterations, GRPO 60, in float32 (``model.bf16: false``) and in
   bf16-mixed (``model.bf16: true``: float32 master weights and AdamW state, forwards under bfloat16 autocast, the
   frozen reference in bfloat16), per seed (``run.seed``) and kernel family. Reported: the mean reward of the
   first and last 5 iterations, their difference (the rise), ``update/changed_frac`` and the final ``kl/mean``.
2. ``vanish``: GRPO on the same task at ``optim.learning_rate: 1e-6`` for 20 iterations, pure bfloat16
   (``model.dtype: bfloat16``, ``model.bf16: false``: weights and AdamW state in bfloat16) against bf16-mixed:
   ``update/changed_frac``, the share of the policy's weights whose value differs between ``final/`` and the
   start (the start in the run's own dtype: pure bfloat16 rounds every weight once when it loads), and the rules
   ``rlhf doctor RUN --json`` names (``updates_vanishing`` fires when changed_frac stays under 0.5 for 3 steps).
3. ``doctor``: ``rlhf doctor RUN --json`` over every run of part 1.

Beside them a probe checks that autocast is on: the log-probs of 16 sampled responses from the float32 model
against the same weights hooked by ``rlhf.models.precision.compute_in_bf16`` (what ``model.bf16`` does), at the
start and after float32 training.

Kernels: ``default`` is what torch picks on this CPU, ``avx2`` sets ``ATEN_CPU_CAPABILITY=avx2`` (read when torch is
imported, hence a process per run). It switches ATen's own kernels (elementwise ops, reductions, softmax); the
matrix products go through MKL and oneDNN, which pick their instructions themselves. Another family rounds float32
sums otherwise, and sampling turns that into another trajectory: it acts like another seed
(docs/reproducibility.md). Each run has ``--threads`` threads (default 1). Runs go one at a time; a run's record
goes to ``OUT/results.jsonl`` and a run already there is not repeated. Writes results/precision_study.json and .md.
The runs use the ``rlhf`` this Python imports; the results name its commit and whether src/ had uncommitted changes.
To measure one commit while others edit the working tree: ``git clone . /tmp/snap`` and ``PYTHONPATH=/tmp/snap/src``.
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

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
NAME = "precision_study"

DIGIT_TOKENS = 8
"""The task samples this many tokens; digits are single tokens in the tiny tokenizer."""


def digit_count(completions, **kwargs):
    """Digits in the completion / 8 (tests/trainers/ppo_rewards.py's ``digit_count``): a random-init model starts
    near 0.02, a policy that only writes digits scores 1. The runs load it from this file."""
    return [sum(ch.isdigit() for ch in c) / DIGIT_TOKENS for c in completions]


PRECISIONS: dict[str, dict[str, object]] = {
    "float32": {"model.dtype": "float32", "model.bf16": False},
    "bf16_mixed": {"model.dtype": "float32", "model.bf16": True},
    "bf16_pure": {"model.dtype": "bfloat16", "model.bf16": False},
}
"""Each precision as config overrides."""

COMMON: dict[str, object] = {
    "sampling.max_new_tokens": 8,
    "sampling.temperature": 1.0,
    "optim.scheduler": "constant",
    "run.eval_every": 0,
    "run.save_every": 0,
    "run.progress": False,
    "run.overwrite": True,
}
"""What both tests' ``make_config`` and the learning tests set alike."""

TASKS: dict[str, tuple[str, dict[str, object]]] = {
    # name: (command, overrides): the learning tests' make_config with the test's own fields on top
    "ppo": ("ppo", {"ppo.steps": 50, "batch.size": 16, "ppo.epochs": 4, "ppo.num_minibatches": 1,
                    "optim.learning_rate": 2e-3, "kl.coef": 0.01}),
    "grpo": ("grpo", {"grpo.steps": 60, "batch.size": 4, "grpo.group_size": 8, "grpo.num_minibatches": 1,
                      "optim.learning_rate": 2e-3}),
    "grpo_lr1e-6": ("grpo", {"grpo.steps": 20, "batch.size": 4, "grpo.group_size": 8, "grpo.num_minibatches": 1,
                             "optim.learning_rate": 1e-6}),
}  # fmt: skip
"""The tasks: PPO's and GRPO's learning tests, and part 2's GRPO at a learning rate pure bfloat16 rounds away."""

PARTS: dict[str, tuple[list[str], list[str]]] = {
    "learn": (["ppo", "grpo"], ["float32", "bf16_mixed"]),
    "vanish": (["grpo_lr1e-6"], ["bf16_pure", "bf16_mixed"]),
}
"""part: (tasks, precisions). ``vanish`` runs under the default kernels only."""

WINDOW = 5
"""Iterations averaged at either end of a run (the tests' first 5 and last 5)."""


# --------------------------------------------------------------------------------------------------------------
# Assets and the run in its own process
# --------------------------------------------------------------------------------------------------------------


def build_assets(work: Path) -> dict[str, str]:
    """The tiny llama and tokenizer of tests/conftest.py (``tiny_llama_dir``) and each test module's prompts file
    (``prompts_file``), built once into ``work``."""
    manifest = work / "manifest.json"
    if manifest.is_file():
        return json.loads(manifest.read_text())
    from transformers import AutoTokenizer

    from rlhf.models.tiny import save_tiny, tiny_causal_lm, toy_corpus, train_tokenizer

    work.mkdir(parents=True, exist_ok=True)
    train_tokenizer(toy_corpus(2000, seed=0), vocab_size=512).save_pretrained(work / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    llama = save_tiny(tiny_causal_lm("llama", tokenizer, seed=0), tokenizer, work / "llama_causal_lm")
    lines = [" ".join(line.split()[: 3 + i % 2]) for i, line in enumerate(toy_corpus(40, seed=5))]
    # test_ppo.py: 40 prompts of 3-4 words; test_grpo.py: the same, every other one flagged `constant`
    ppo_rows = [{"prompt": p} for p in lines]
    grpo_rows = [{"prompt": p, "constant": i % 2 == 0} for i, p in enumerate(lines)]
    for name, rows in (("ppo_prompts.jsonl", ppo_rows), ("grpo_prompts.jsonl", grpo_rows)):
        (work / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    assets = {"policy": str(llama), "ppo": str(work / "ppo_prompts.jsonl"), "grpo": str(work / "grpo_prompts.jsonl")}
    manifest.write_text(json.dumps(assets, indent=1) + "\n")
    return assets


def nested(values: dict[str, object]) -> dict[str, object]:
    """``{"a.b": 1}`` → ``{"a": {"b": 1}}``: the mapping a YAML config with those values holds."""
    out: dict[str, object] = {}
    for key, value in values.items():
        *heads, name = key.split(".")
        place = out
        for head in heads:
            place = place.setdefault(head, {})  # type: ignore[assignment]
        place[name] = value  # type: ignore[index]
    return out


def child_train(spec: dict) -> None:
    """In the run's process: build the config with ``config_from_dict`` and call the trainer's ``run``; writes the
    trainer's seconds and the process's environment to ``spec["report"]``."""
    import torch

    torch.set_num_threads(spec["threads"])
    from rlhf.config import config_from_dict
    from rlhf.runlog.seeding import environment
    from rlhf.trainers.rl import grpo, ppo

    config = config_from_dict(spec["command"], nested(spec["fields"]))
    start = time.perf_counter()
    {"ppo": ppo, "grpo": grpo}[spec["command"]].run(config)
    seconds = time.perf_counter() - start
    Path(spec["report"]).write_text(json.dumps({"seconds": seconds, "environment": environment()}) + "\n")


def child_probe(spec: dict) -> None:
    """In its own process: the per-token |Δ log p| between each model of ``spec["models"]`` computing in float32 and
    the same weights hooked by ``compute_in_bf16`` (autocast bfloat16), on 16 of its own samples of 8 tokens."""
    import torch

    torch.set_num_threads(spec["threads"])
    from rlhf.data import left_pad
    from rlhf.models.loading import load_causal_lm, load_tokenizer
    from rlhf.models.policy import score_response_tokens
    from rlhf.models.precision import compute_in_bf16
    from rlhf.rollout.engine import RowGenerators, SamplingParams, row_seeds, sample

    prompts = [json.loads(line)["prompt"] for line in Path(spec["prompts"]).read_text().splitlines()[:16]]
    out = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "models": {}}
    for name, path in spec["models"].items():
        tokenizer, exact_model = load_tokenizer(path), load_causal_lm(path)
        mixed_model = compute_in_bf16(load_causal_lm(path))
        with torch.no_grad():
            ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
            query, query_mask = left_pad(ids, tokenizer.pad_token_id)
            noise = RowGenerators.of(row_seeds(torch.Generator().manual_seed(0), range(16)))
            params = SamplingParams(DIGIT_TOKENS, 1.0)
            responses, _ = sample(exact_model, query, query_mask, params, [], tokenizer.pad_token_id, noise)
            full = torch.cat([query, responses], 1)
            mask = torch.cat([query_mask, torch.ones_like(responses)], 1)
            T = responses.shape[1]
            exact = score_response_tokens(exact_model, full, mask, T, 1.0).logprobs
            mixed = score_response_tokens(mixed_model, full, mask, T, 1.0).logprobs.float()
            logits_dtype = str(mixed_model(full, attention_mask=mask).logits.dtype)
        error = (mixed - exact).abs().flatten()
        out["models"][name] = {
            "logits_dtype_under_hook": logits_dtype,
            "logprob_abs_error_mean": error.mean().item(),
            "logprob_abs_error_max": error.max().item(),
            "exact_logprob_mean": exact.mean().item(),
        }
    Path(spec["report"]).write_text(json.dumps(out) + "\n")


def kernel_env(kernel: str, threads: int) -> dict[str, str]:
    """This process's environment for a child under ``kernel`` (``default`` or an ATEN_CPU_CAPABILITY value)."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if kernel != "default":
        env["ATEN_CPU_CAPABILITY"] = kernel
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def in_child(mode: str, spec: dict, env: dict[str, str]) -> None:
    """Run this file with ``--child mode`` and ``spec``; a failure raises with the end of what it said."""
    args = [sys.executable, str(Path(__file__).resolve()), "--child", mode, json.dumps(spec)]
    done = subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} {spec.get('fields', spec)} exited {done.returncode}: {done.stderr[-3000:]}")


def doctor_rules(run_dir: Path, env: dict[str, str]) -> list[str]:
    """The rule names ``rlhf doctor RUN_DIR --json`` finds (its exit code says warnings: not a failure)."""
    args = [sys.executable, "-m", "rlhf", "doctor", str(run_dir), "--json"]
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    verdict = json.loads(done.stdout)
    return sorted({f["rule"] for run in verdict["runs"] for f in run["findings"]})


def weights_changed(start_dir: Path, final_dir: Path) -> dict[str, float]:
    """The share of the policy's weights whose value differs between ``final_dir`` and ``start_dir`` — the start
    cast to the final weights' dtype (the run's own: pure bfloat16 rounds the float32 start once when it loads),
    over all of them and without the input embedding (whose rows of tokens never sampled or prompted get no
    gradient, and AdamW without weight decay leaves them)."""
    from safetensors.torch import load_file

    start, final = load_file(start_dir / "model.safetensors"), load_file(final_dir / "model.safetensors")
    changed = {k: (final[k] != start[k].to(final[k].dtype)) for k in final}
    total = sum(c.numel() for c in changed.values())
    moved = sum(int(c.sum()) for c in changed.values())
    rest = [k for k in changed if "embed_tokens" not in k]
    return {
        "dtype": str(next(iter(final.values())).dtype),
        "weights_changed_frac": moved / total,
        "weights_changed_frac_no_embedding": sum(int(changed[k].sum()) for k in rest)
        / sum(changed[k].numel() for k in rest),
        "weights_max_abs_change": max(
            (final[k].float() - start[k].to(final[k].dtype).float()).abs().max().item() for k in final
        ),
    }


def library() -> dict[str, object]:
    """The ``rlhf`` this Python imports (the runs' processes inherit its path): its directory, its repository's commit
    and whether src/ had uncommitted changes. Pin a snapshot with ``git clone`` and ``PYTHONPATH=CLONE/src`` when
    others edit the working tree while the study runs."""
    import rlhf

    package = Path(rlhf.__file__).resolve().parent
    git = ["git", "-C", str(package.parents[1])]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    changes = subprocess.run([*git, "status", "--porcelain", "--", "src"], capture_output=True, text=True).stdout
    return {"rlhf": str(package), "commit": head or None, "src_changes": bool(changes.strip())}


def cpu_busy(seconds: float = 0.5) -> float:
    """The share of the machine's CPU time other processes used over ``seconds`` (/proc/stat), before a run: the
    timings of a run on a busy machine are slower (the learning numbers are not)."""

    def sample() -> tuple[int, int]:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)  # idle + iowait, all

    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def run_one(
    part: str, task: str, precision: str, kernel: str, seed: int, out: Path, assets: dict, threads: int, lib: dict
) -> dict:
    """One run of ``task`` in ``precision`` under ``kernel`` with ``seed``, its metrics summarised, with the
    doctor's rules (and, in part ``vanish``, how many weights moved)."""
    command, fields = TASKS[task]
    run_dir = out / part / f"{task}_{precision}_{kernel}_seed_{seed}"
    fields = {
        "model.name": assets["policy"],
        "reward.source": f"{Path(__file__).resolve()}:digit_count",
        "data.train": assets[command],
        "output_dir": str(run_dir),
        "run.seed": seed,
        **COMMON,
        **fields,
        **PRECISIONS[precision],
    }
    env = kernel_env(kernel, threads)
    busy = cpu_busy()
    report = out / part / f"{run_dir.name}.child.json"
    spec = {"command": command, "fields": fields, "threads": threads, "report": str(report)}
    start = time.perf_counter()
    in_child("train", spec, env)
    child = json.loads(report.read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [row for row in rows if "reward/mean" in row]  # the training rows (held-out rows carry eval/ only)
    rewards = [row["reward/mean"] for row in rows]
    changed = [row["update/changed_frac"] for row in rows]
    first, last = statistics.fmean(rewards[:WINDOW]), statistics.fmean(rewards[-WINDOW:])
    record = {
        "part": part,
        "task": task,
        "algo": command,
        "precision": precision,
        "kernel": kernel,
        "seed": seed,
        "run_dir": str(run_dir),
        "first5": first,
        "last5": last,
        "rise": last - first,
        "changed_frac_mean": statistics.fmean(changed),
        "changed_frac_min": min(changed),
        "changed_frac_last3": changed[-3:],
        "kl_final": rows[-1].get("kl/mean"),  # GRPO at β = 0 (its default, the test's) logs no kl/mean
        "rewards": rewards,
        "changed_frac": changed,
        "step_s_median": statistics.median(row["time/step_s"] for row in rows),
        "trainer_s": child["seconds"],
        "cpu_busy_before": busy,
        "library": lib,
        "environment": child["environment"],
        "findings": doctor_rules(run_dir, env),
    }
    if part == "vanish":
        record |= weights_changed(Path(assets["policy"]), run_dir / "final")
    record["wall_s"] = time.perf_counter() - start  # the process's start-up, the trainer and the doctor
    return record


# --------------------------------------------------------------------------------------------------------------
# Summaries and tables
# --------------------------------------------------------------------------------------------------------------


def mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def spread(values: list[float], digits: int = 3) -> str:
    m, sd = mean_sd(values)
    return f"{m:.{digits}f} ± {sd:.{digits}f}"


def groups(records: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in records:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def learn_summary(records: list[dict]) -> list[dict]:
    """Per (algo, precision, kernel) and per (algo, precision) over both kernel families: the rise's mean, sd and
    worst run, changed_frac, the final KL, the seconds; and for bf16-mixed whether its rises lie within float32's
    seed-to-seed band (float32's mean ± 2 sd of the same algorithm and kernels)."""
    learn = [r for r in records if r["part"] == "learn"]
    rows = []
    pooled = [{**r, "kernel": "both"} for r in learn] if len({r["kernel"] for r in learn}) > 1 else []
    by = groups(learn + pooled, ("algo", "precision", "kernel"))
    for (algo, precision, kernel), runs in sorted(by.items(), key=lambda item: order(*item[0])):
        rises = [r["rise"] for r in runs]
        kls = [r["kl_final"] for r in runs if r["kl_final"] is not None]
        row = {
            "algo": algo,
            "precision": precision,
            "kernel": kernel,
            "runs": len(runs),
            "first5_mean": statistics.fmean(r["first5"] for r in runs),
            "last5_mean": statistics.fmean(r["last5"] for r in runs),
            "rise_mean": mean_sd(rises)[0],
            "rise_sd": mean_sd(rises)[1],
            "rise_worst": min(rises),
            "changed_frac_mean": statistics.fmean(r["changed_frac_mean"] for r in runs),
            "kl_final_mean": statistics.fmean(kls) if kls else None,
            "kl_final_sd": mean_sd(kls)[1] if kls else None,
            "trainer_s_mean": statistics.fmean(r["trainer_s"] for r in runs),
            "step_s_median": statistics.median(r["step_s_median"] for r in runs),
        }
        reference = by.get((algo, "float32", kernel))
        if precision == "bf16_mixed" and reference:
            m, sd = mean_sd([r["rise"] for r in reference])
            row["float32_band"] = [m - 2 * sd, m + 2 * sd]
            row["within_float32_band"] = all(m - 2 * sd <= x <= m + 2 * sd for x in rises)
            row["above_float32_band"] = sum(x > m + 2 * sd for x in rises)
            row["below_float32_band"] = sum(x < m - 2 * sd for x in rises)
            row["rise_mean_minus_float32"] = row["rise_mean"] - m
        rows.append(row)
    return rows


def identical_across_kernels(records: list[dict]) -> list[dict]:
    """Per (algo, precision) of part 1: the seeds whose reward curves are equal under every kernel family run."""
    learn = [r for r in records if r["part"] == "learn"]
    if len({r["kernel"] for r in learn}) < 2:
        return []
    out = []
    by = groups(learn, ("algo", "precision"))
    for (algo, precision), runs in sorted(by.items(), key=lambda item: order(*item[0], "default")):
        curves = groups(runs, ("seed",))
        same = sum(len({json.dumps(r["rewards"]) for r in seed_runs}) == 1 for seed_runs in curves.values())
        out.append({"algo": algo, "precision": precision, "seeds": len(curves), "identical": same})
    return out


def vanish_summary(records: list[dict]) -> list[dict]:
    """Per precision of part 2: changed_frac, the share of weights moved, and the runs the doctor flags."""
    rows = []
    for (precision,), runs in sorted(groups([r for r in records if r["part"] == "vanish"], ("precision",)).items()):
        rows.append({
            "precision": precision,
            "runs": len(runs),
            "changed_frac_mean": statistics.fmean(r["changed_frac_mean"] for r in runs),
            "weights_changed_frac_mean": statistics.fmean(r["weights_changed_frac"] for r in runs),
            "runs_with_updates_vanishing": sum("updates_vanishing" in r["findings"] for r in runs),
            "trainer_s_mean": statistics.fmean(r["trainer_s"] for r in runs),
        })  # fmt: skip
    return rows


def doctor_summary(records: list[dict]) -> list[dict]:
    """Per (algo, precision, kernel) of part 1: runs with findings and how often each rule fired."""
    rows = []
    by = groups([r for r in records if r["part"] == "learn"], ("algo", "precision", "kernel"))
    for (algo, precision, kernel), runs in sorted(by.items(), key=lambda item: order(*item[0])):
        counts: dict[str, int] = {}
        for r in runs:
            for rule in r["findings"]:
                counts[rule] = counts.get(rule, 0) + 1
        rows.append({
            "algo": algo, "precision": precision, "kernel": kernel, "runs": len(runs),
            "runs_with_findings": sum(bool(r["findings"]) for r in runs), "rules": dict(sorted(counts.items())),
        })  # fmt: skip
    return rows


def fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(results: dict) -> str:
    records, env = results["runs"], results["machine"]
    busy = [r["cpu_busy_before"] for r in records]
    libraries = " and ".join(
        f"{lib['commit']}{' with uncommitted changes to src/' if lib['src_changes'] else ''}"
        for lib in results["library"]
    )
    levels = ", ".join(f"{k} = {v}" for k, v in results["cpu_capability"].items())
    lines = [
        f"`python benchmarks/precision_study.py` on {env['cpu']} ({env['cores']} cores, {results['threads']} "
        f"thread(s) per run, kernels: {levels}), torch {env['torch']}, transformers {env['transformers']}, rlhf "
        f"{libraries}; {results['date']}. {len(records)} runs, one at a time, {results['total_wall_s'] / 60:.1f} min in all "
        f"(each run in its own process: start-up, the trainer, `rlhf doctor`). Other processes used "
        f"{statistics.median(busy):.0%} of the CPU (median; up to {max(busy):.0%}) in the half second before a "
        "run: the seconds are from a shared machine, the learning numbers do not depend on them.",
        "",
        "## 1. bf16-mixed against float32 on the learning tests' toy task",
        "",
        "The toy task of `test_reward_rises_on_a_toy_task` (tests/trainers/test_ppo.py: PPO 50 iterations of 16 "
        "prompts, 4 epochs, lr 2e-3, β 0.01; test_grpo.py: GRPO 60 iterations of 4 prompts × G = 8, lr 2e-3, β 0), "
        "a random-init 2-layer llama, reward = digits / 8 of an 8-token response. first5 / last5: the mean "
        "reward of the first / last 5 iterations; rise = last5 − first5. changed_frac: `update/changed_frac`, the "
        "mean over steps. KL: the last iteration's `kl/mean` (GRPO at β 0 has no reference and logs none). "
        "Trainer s: the trainer's `run` alone; s/step: the median `time/step_s`.",
        "",
        "| algo | precision | kernels | runs | first5 | last5 | rise mean ± sd | worst rise | changed_frac | "
        "final KL mean ± sd | trainer s | s/step | bf16 rises within float32's mean ± 2 sd? |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["learn"]:
        kl = "—" if row["kl_final_mean"] is None else f"{row['kl_final_mean']:.1f} ± {row['kl_final_sd']:.1f}"
        verdict = ""
        if "within_float32_band" in row:
            lo, hi = row["float32_band"]
            outside = f"{row['above_float32_band']} above, {row['below_float32_band']} below"
            verdict = (f"{'yes' if row['within_float32_band'] else 'no: ' + outside} (band {lo:.3f}–{hi:.3f}; "
                       f"Δ mean {row['rise_mean_minus_float32']:+.3f})")  # fmt: skip
        lines.append(
            f"| {row['algo']} | {row['precision']} | {row['kernel']} | {row['runs']} | {row['first5_mean']:.3f} | "
            f"{row['last5_mean']:.3f} | {row['rise_mean']:.3f} ± {row['rise_sd']:.3f} | {row['rise_worst']:.3f} | "
            f"{row['changed_frac_mean']:.5f} | {kl} | {row['trainer_s_mean']:.1f} | {row['step_s_median']:.3f} | "
            f"{verdict} |"
        )
    twins = results["identical_across_kernels"]
    if twins:
        lines += ["", "Seeds whose reward curve is identical, iteration for iteration, under both kernel families "
                  "(the two families then acted as one seed: the pooled `both` row counts it twice and understates "
                  "the spread): " + ", ".join(
                      f"{t['algo']} {t['precision']} {t['identical']} of {t['seeds']}" for t in twins) + "."]  # fmt: skip
    lines += ["", "Every run:", "",
              "| algo | precision | kernels | seed | first5 | last5 | rise | changed_frac (min) | final KL | "
              "trainer s | doctor |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted((r for r in records if r["part"] == "learn"), key=run_key):
        lines.append(
            f"| {r['algo']} | {r['precision']} | {r['kernel']} | {r['seed']} | {r['first5']:.3f} | {r['last5']:.3f} | "
            f"{r['rise']:.3f} | {r['changed_frac_mean']:.5f} ({r['changed_frac_min']:.4f}) | "
            f"{fmt(r['kl_final'], 1)} | {r['trainer_s']:.1f} | {', '.join(r['findings']) or 'healthy'} |"
        )
    probe = results.get("probe") or {}
    if probe:
        lines += ["", "Is autocast on? The same weights in float32 and hooked by `compute_in_bf16` (what `model.bf16` "
                  "does), per-token abs(Δ log p) over 16 of the float32 model's own 8-token samples:", "",
                  "| kernels | model | logits dtype under the hook | mean log p | mean abs(Δ log p) | max abs(Δ log p) |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for kernel, result in sorted(probe.items(), key=lambda item: item[0] != "default"):
            for name, m in result["models"].items():
                lines.append(
                    f"| {kernel} | {name} | {m['logits_dtype_under_hook']} | {m['exact_logprob_mean']:.3f} | "
                    f"{m['logprob_abs_error_mean']:.5f} | {m['logprob_abs_error_max']:.5f} |"
                )
    lines += [
        "",
        "## 2. Pure bfloat16 against bf16-mixed at lr 1e-6",
        "",
        "GRPO on the same task, 20 iterations, `optim.learning_rate: 1e-6`, default kernels. pure = `model.dtype: "
        "bfloat16`, `model.bf16: false`; mixed = `model.dtype: float32`, `model.bf16: true`. changed_frac: "
        "`update/changed_frac` (mean over steps; min–max). weights changed: the share of the policy's weights in "
        "`final/` that differ from the start (in the run's dtype); without embedding: the same, the input embedding "
        "left out. doctor: the rules `rlhf doctor RUN --json` names.",
        "",
        "| precision | seed | changed_frac mean (min–max) | weights changed | without embedding | largest change | "
        "first5 → last5 | doctor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted((r for r in records if r["part"] == "vanish"), key=run_key):
        lines.append(
            f"| {r['precision']} | {r['seed']} | {r['changed_frac_mean']:.4f} ({min(r['changed_frac']):.4f}–"
            f"{max(r['changed_frac']):.4f}) | {r['weights_changed_frac']:.2%} | "
            f"{r['weights_changed_frac_no_embedding']:.2%} | {r['weights_max_abs_change']:.2e} | "
            f"{r['first5']:.3f} → {r['last5']:.3f} | {', '.join(r['findings']) or 'healthy'} |"
        )
    lines += ["", "| precision | runs | changed_frac mean | weights changed mean | runs with updates_vanishing | "
              "trainer s |", "|---|---|---|---|---|---|"]  # fmt: skip
    for row in results["vanish"]:
        lines.append(
            f"| {row['precision']} | {row['runs']} | {row['changed_frac_mean']:.4f} | "
            f"{row['weights_changed_frac_mean']:.2%} | {row['runs_with_updates_vanishing']} of {row['runs']} | "
            f"{row['trainer_s_mean']:.1f} |"
        )
    lines += ["", "## 3. `rlhf doctor` over part 1's runs", "",
              "| algo | precision | kernels | runs | runs with findings | rules (runs) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for row in results["doctor"]:
        rules = ", ".join(f"{rule} ({n})" for rule, n in row["rules"].items()) or "—"
        lines.append(
            f"| {row['algo']} | {row['precision']} | {row['kernel']} | {row['runs']} | {row['runs_with_findings']} | "
            f"{rules} |"
        )
    return "\n".join(lines) + "\n"


def order(algo: str, precision: str, kernel: str) -> tuple:
    """Tables list PPO before GRPO, float32 before bfloat16, the default kernels, avx2, then both together."""
    return (list(TASKS).index(algo), list(PRECISIONS).index(precision), {"default": 0, "both": 2}.get(kernel, 1))


def run_key(r: dict) -> tuple:
    return (*order(r["algo"], r["precision"], r["kernel"]), r["seed"])


# --------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------


def load_records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def probe(out: Path, assets: dict, kernels: list[str], threads: int, records: list[dict]) -> dict:
    """:func:`child_probe` under each kernel family on the start model and a float32 PPO run's final model."""
    models = {"start (random init)": assets["policy"]}
    trained = [r for r in records if r["part"] == "learn" and r["algo"] == "ppo" and r["precision"] == "float32"]
    if trained:
        best = min(trained, key=lambda r: (r["kernel"] != "default", r["seed"]))
        models[f"after float32 PPO ({best['kernel']}, seed {best['seed']})"] = str(Path(best["run_dir"]) / "final")
    result = {}
    for kernel in kernels:
        report = out / f"probe_{kernel}.json"
        spec = {"models": models, "prompts": assets["ppo"], "threads": threads, "report": str(report)}
        in_child("probe", spec, kernel_env(kernel, threads))
        result[kernel] = json.loads(report.read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--kernels", nargs="+", default=["default", "avx2"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (and OMP_NUM_THREADS) of each run")
    parser.add_argument("--out", type=Path, default=Path("runs/precision_study"), help="runs, assets, results.jsonl")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where precision_study.json and .md go")
    parser.add_argument("--from-results", action="store_true", help="tables from OUT/results.jsonl; run nothing")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        {"train": child_train, "probe": child_probe}[args.child[0]](json.loads(args.child[1]))
        return
    out = args.out.resolve()
    path = out / "results.jsonl"
    assets = build_assets(out / "assets")
    start, lib = time.perf_counter(), library()
    if not args.from_results:
        done = {(r["part"], r["task"], r["precision"], r["kernel"], r["seed"]) for r in load_records(path)}
        # the precisions of one (task, kernels, seed) back to back: a drift of the machine's load lands on both
        todo = [(part, task, precision, kernel, seed) for part in args.parts for task in PARTS[part][0]
                for kernel in (args.kernels if part == "learn" else ["default"]) for seed in args.seeds
                for precision in PARTS[part][1]]  # fmt: skip
        for key in todo:
            if key in done:
                continue
            record = run_one(*key, out=out, assets=assets, threads=args.threads, lib=lib)
            with path.open("a") as log:
                log.write(json.dumps(record) + "\n")
            print(f"{' '.join(map(str, key))}: first5 {record['first5']:.3f} last5 {record['last5']:.3f}, "
                  f"changed_frac {record['changed_frac_mean']:.4f}, {record['trainer_s']:.1f} s, "
                  f"{record['findings'] or 'healthy'}", file=sys.stderr, flush=True)  # fmt: skip
    records = [r for r in load_records(path) if r["part"] in args.parts and r["seed"] in args.seeds
               and (r["part"] != "learn" or r["kernel"] in args.kernels)]  # fmt: skip
    kernels = sorted({r["kernel"] for r in records if r["part"] == "learn"} or {"default"})
    probe_path = out / "probe.json"
    if args.from_results and probe_path.is_file():
        probed = json.loads(probe_path.read_text())
    else:
        probed = probe(out, assets, kernels, args.threads, records)
        probe_path.write_text(json.dumps(probed, indent=1) + "\n")
    first = records[0]["environment"]
    capability = {r["kernel"]: r["environment"]["cpu_capability"] for r in records}
    results = {
        "machine": {k: first[k] for k in ("cpu", "cores", "torch", "transformers", "python")},
        "cpu_capability": dict(sorted(capability.items())),
        "library": [json.loads(x) for x in sorted({json.dumps(r["library"], sort_keys=True) for r in records})],
        "threads": args.threads,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "settings": {"tasks": TASKS, "common": COMMON, "precisions": PRECISIONS, "window": WINDOW},
        "total_wall_s": sum(r["wall_s"] for r in records),
        "learn": learn_summary(records),
        "identical_across_kernels": identical_across_kernels(records),
        "vanish": vanish_summary(records),
        "doctor": doctor_summary(records),
        "probe": probed,
        "runs": records,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{NAME}.json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results)
    (args.results / f"{NAME}.md").write_text(text)
    print(text)
    print(f"this invocation: {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
