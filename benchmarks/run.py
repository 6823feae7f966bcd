"""Speed and memory of `rlhf ppo` / `rlhf grpo` side by side with TRL, from one command.

    python benchmarks/run.py                      # every case, 12 steps per run
    python benchmarks/run.py --quick              # a smoke run: 4 steps per run
    python benchmarks/run.py --only ppo32,grpo    # some cases
    python benchmarks/run.py --update-readme README.md        # also put the table between the README markers
    python benchmarks/run.py --from-results --update-readme README.md   # re-render saved results, run nothing
    python benchmarks/run.py --only grpo-110m --merge --steps 6     # re-run some cases, keep the others' results

Run it with the Python that has rlhf installed. It builds tiny models offline into benchmarks/.work/,
installs each TRL version into its own venv under benchmarks/.venvs/ (reused when the versions match),
runs every (case, run) in its own process (child_ours.py / child_trl.py) and writes
benchmarks/results/results.{json,md}. Fairness notes: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import measure

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
VENVS = HERE / ".venvs"
RESULTS = HERE / "results"

TORCH_PIN = "torch==2.13.0"  # installed first in each peer venv: the CPU build this machine serves locally
PEERS = {"trl-ppo": "1.0.0", "trl-grpo": "1.16.0"}
"""TRL 1.0.0 is the last release with PPOTrainer (trl.experimental.ppo); GRPO runs on the newest TRL."""

SIZES = {
    "3m": {"hidden_size": 256, "num_layers": 3, "num_heads": 4},
    "25m": {"hidden_size": 512, "num_layers": 6, "num_heads": 8},
    "110m": {"hidden_size": 768, "num_layers": 12, "num_heads": 12},
}
"""Llama policy and reward model sizes (≈3.4M, ≈25.6M and ≈113.9M parameters with the 398-token
tokenizer; the MLP is 4× the hidden size, so 110m has GPT-2 small's shape: 768 wide, 12 layers, 12 heads,
MLP 3072)."""
PROMPT_TOKENS = 10  # every prompt is exactly this long, so neither side pads a prompt
NUM_PROMPTS = 64
BUSY = 0.1  # share of the CPU used by other processes just before a run above which the results say "busy"

PPO = {"batch_size": 16, "ppo_epochs": 4, "num_minibatches": 1, "learning_rate": 3e-6, "kl_coef": 0.05,
       "temperature": 0.7}  # fmt: skip
# TRL's GRPO default beta is 0.0 (no reference model); ours is 0 too, so neither side loads a reference.
GRPO = {"batch_size": 4, "group_size": 4, "num_iterations": 1, "learning_rate": 1e-6, "kl_coef": 0.0,
        "temperature": 1.0}  # fmt: skip


@dataclass(frozen=True)
class Run:
    label: str
    side: str  # "ours" or a key of PEERS
    critic: str | None = None  # ours ppo only
    micro_batch_size: int | None = None  # ours: smaller micro-batches, the same update, less activation memory
    compile: bool = False  # ours: `compile: true` (torch.compile of the transformer blocks)
    checkpointing: bool = False  # ours: `model.gradient_checkpointing` (activations recomputed in the backward)


@dataclass(frozen=True)
class Case:
    algo: str
    size: str
    max_new_tokens: int
    runs: tuple[Run, ...]
    settings: dict
    steps: int | None = None  # steps per run instead of --steps (slow cases); with --quick the smaller one


def sequences_per_step(case: Case) -> int:
    """Sequences a step samples and trains on: the prompt batch, times the group size for GRPO."""
    return case.settings["batch_size"] * case.settings.get("group_size", 1)


PPO_RUNS = (
    Run("rlhf ppo, critic: separate", "ours", "separate"),
    Run("rlhf ppo, critic: shared", "ours", "shared"),
    Run("rlhf ppo, critic: shared, micro-batch 8", "ours", "shared", 8),
    Run("rlhf ppo, critic: shared, compile", "ours", "shared", compile=True),
    Run(f"TRL {PEERS['trl-ppo']} PPOTrainer", "trl-ppo"),
)
"""The runs of the 3M PPO cases (ppo32, ppo128): our three layouts, compile, and TRL."""

CASES = {
    "ppo32": Case("ppo", "3m", 32, PPO_RUNS, PPO),
    "ppo128": Case("ppo", "3m", 128, PPO_RUNS, PPO),
    "grpo": Case("grpo", "3m", 32, (
        Run("rlhf grpo", "ours"),
        Run("rlhf grpo, compile", "ours", compile=True),
        Run(f"TRL {PEERS['trl-grpo']} GRPOTrainer", "trl-grpo"),
    ), GRPO),
    "ppo32-25m": Case("ppo", "25m", 32, (
        Run("rlhf ppo, critic: separate", "ours", "separate"),
        Run("rlhf ppo, critic: shared", "ours", "shared"),
        Run("rlhf ppo, critic: shared, checkpointing", "ours", "shared", checkpointing=True),
    ), PPO),
    # GPT-2-small-sized: seconds per step, so 6 steps per run (2 warm-up + 4 timed)
    "ppo32-110m": Case("ppo", "110m", 32, (
        Run("rlhf ppo, critic: shared", "ours", "shared"),
        Run("rlhf ppo, critic: shared, checkpointing", "ours", "shared", checkpointing=True),
        Run("rlhf ppo, critic: separate", "ours", "separate"),
        Run(f"TRL {PEERS['trl-ppo']} PPOTrainer", "trl-ppo"),
    ), PPO, steps=6),
    "grpo-110m": Case("grpo", "110m", 32, (
        Run("rlhf grpo", "ours"),
        Run("rlhf grpo, checkpointing", "ours", checkpointing=True),
        Run(f"TRL {PEERS['trl-grpo']} GRPOTrainer", "trl-grpo"),
    ), GRPO, steps=6),
}  # fmt: skip


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------------
# Assets: tokenizer, prompts, policy and reward model per size — built offline once, reused afterwards
# ------------------------------------------------------------------------------------------------------------


def matmul_params(model) -> int:
    """Parameters that take part in matmuls: all but the input embedding; a tied LM head still counts."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    tied = getattr(model.config, "tie_word_embeddings", False) and hasattr(model, "lm_head")
    return total - embedding + (embedding if tied else 0)


MODEL_KEYS = ("policy_params", "reward_params", "policy_matmul_params", "reward_matmul_params", "vocab_size",
              "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim")  # fmt: skip
"""What the manifest records per size: parameter counts (FLOPs, memory) and dimensions (memory)."""


def describe(policy, reward) -> dict:
    """The manifest's numbers for one size (:data:`MODEL_KEYS`) from its built or loaded models."""
    c = policy.config
    heads = c.num_attention_heads
    return {
        "policy_params": sum(p.numel() for p in policy.parameters()),
        "reward_params": sum(p.numel() for p in reward.parameters()),
        "policy_matmul_params": matmul_params(policy),
        "reward_matmul_params": matmul_params(reward),
        "vocab_size": c.vocab_size, "num_layers": c.num_hidden_layers, "hidden_size": c.hidden_size,
        "num_heads": heads, "num_kv_heads": getattr(c, "num_key_value_heads", None) or heads,
        "head_dim": getattr(c, "head_dim", None) or c.hidden_size // heads,
    }  # fmt: skip


def build_assets(sizes: set[str]) -> dict:
    """``.work/assets/manifest.json``: directories, parameter counts, dimensions and prompt length.

    Each size keeps its own recipe (its :data:`SIZES` entry): only the sizes that are missing or whose
    dimensions changed are built, the others are reused (``measure.reusable_models``); a reused entry that
    lacks some of :data:`MODEL_KEYS` (an older manifest) is completed by loading its models, not rebuilt.
    A change of the prompts' recipe rebuilds everything.
    """
    root = WORK / "assets"
    manifest_path = root / "manifest.json"
    recipe = {"prompt_tokens": PROMPT_TOKENS, "num_prompts": NUM_PROMPTS}
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    models = {size: entry for size, entry in measure.reusable_models(old, recipe, SIZES).items()
              if Path(entry["policy"]).is_dir() and Path(entry["reward"]).is_dir()}  # fmt: skip
    shared = {k: v for k, v in (old.get("recipe") or {}).items() if k != "sizes"}  # an older manifest's too
    same_prompts = shared == recipe and (root / "prompts.jsonl").exists()
    missing = [s for s in sorted(sizes) if s not in models]
    incomplete = [s for s in sorted(sizes) if s in models and not all(k in models[s] for k in MODEL_KEYS)]
    manifest = {"recipe": recipe, "models": models, "prompts": str(root / "prompts.jsonl"),
                "prompt_len": PROMPT_TOKENS}  # fmt: skip
    if not missing and not incomplete and same_prompts:
        return manifest
    if missing or not same_prompts:
        from rlhf.models.tiny import save_tiny, tiny_causal_lm, tiny_reward_model, toy_corpus, train_tokenizer

        log(f"building tiny models ({', '.join(missing) or 'prompts'}) into {root}")
        tokenizer = train_tokenizer(toy_corpus(2000), vocab_size=512)
        root.mkdir(parents=True, exist_ok=True)
        if not same_prompts:
            # Prompts: toy lines of exactly PROMPT_TOKENS tokens, so both sides see the same unpadded batches.
            lines = [line for line in toy_corpus(4000, seed=1)
                     if len(tokenizer(line, add_special_tokens=False)["input_ids"]) == PROMPT_TOKENS]  # fmt: skip
            if len(lines) < NUM_PROMPTS:
                raise RuntimeError(f"only {len(lines)} toy prompts of {PROMPT_TOKENS} tokens; change PROMPT_TOKENS")
            (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines[:NUM_PROMPTS]))
        for size in missing:
            dims = SIZES[size]
            policy = tiny_causal_lm("llama", tokenizer, **dims, seed=0)
            reward = tiny_reward_model("llama", tokenizer, **dims, seed=1)
            save_tiny(policy, tokenizer, root / f"policy-{size}")
            save_tiny(reward, tokenizer, root / f"reward-{size}")
            models[size] = {"recipe": dims, "policy": str(root / f"policy-{size}"),
                            "reward": str(root / f"reward-{size}"), **describe(policy, reward)}  # fmt: skip
    if incomplete:
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

        log(f"recording the dimensions of {', '.join(incomplete)} (loaded, not rebuilt)")
        for size in incomplete:
            entry = models[size]
            policy = AutoModelForCausalLM.from_pretrained(entry["policy"])
            reward = AutoModelForSequenceClassification.from_pretrained(entry["reward"])
            entry.update(describe(policy, reward))
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest


# ------------------------------------------------------------------------------------------------------------
# Peer venvs
# ------------------------------------------------------------------------------------------------------------

PROBE = (
    "import json, importlib.metadata as m; "
    "print(json.dumps({p: m.version(p) for p in ('trl', 'torch', 'transformers', 'accelerate', 'datasets')}))"
)


def venv_versions(python: Path) -> dict | None:
    if not python.exists():
        return None
    probe = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True)
    return json.loads(probe.stdout) if probe.returncode == 0 else None


def imports_trainer(python: Path, peer: str) -> bool:
    """Whether the peer's trainer imports (TRL 1.0.0 predates transformers 5 and may not)."""
    module = "from trl.experimental.ppo import PPOTrainer" if peer == "trl-ppo" else "from trl import GRPOTrainer"
    return subprocess.run([str(python), "-c", module], capture_output=True).returncode == 0


def ensure_venv(peer: str) -> tuple[Path, dict]:
    """The peer venv's python and its package versions; created (torch first, then trl) unless it matches."""
    version = PEERS[peer]
    venv = VENVS / f"trl-{version}"
    python = venv / "bin" / "python"
    found = venv_versions(python)
    matches = found and found["trl"] == version and found["torch"].startswith(TORCH_PIN.split("==")[1])
    if matches and imports_trainer(python, peer):
        return python, found
    log(f"installing TRL {version} into {venv} (torch first: a bare torch could pull a CUDA build)")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, TORCH_PIN], check=True)
    subprocess.run([*pip, f"trl=={version}"], check=True)  # pip picks a transformers this trl accepts
    if not imports_trainer(python, peer):
        log(f"TRL {version} does not import with this transformers; pinning transformers<5")
        subprocess.run([*pip, "transformers<5"], check=True)
        if not imports_trainer(python, peer):
            raise RuntimeError(f"TRL {version}'s trainer does not import in {venv}")
    return python, venv_versions(python)


# ------------------------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------------------------


def training_products(names: list[str], assets: dict) -> list[tuple[int, int, int]]:
    """(m, k, n) of the MLP products of each case's update, the largest it runs: m = sequences × (prompt +
    response) tokens, k and n the hidden and MLP widths (the MLP is 4× the hidden size), both ways round."""
    shapes = set()
    for name in names:
        case = CASES[name]
        h = assets["models"][case.size]["hidden_size"]
        m = sequences_per_step(case) * (assets["prompt_len"] + case.max_new_tokens)
        shapes |= {(m, h, 4 * h), (m, 4 * h, h)}
    return sorted(shapes)


def peak_gflops(threads: int, products: list[tuple[int, int, int]] = ()) -> float:
    """Best fp32 matmul rate of this machine (GFLOP/s) with ``threads`` threads: the compute floor's rate.

    The best of square products (1024², 2048²) and of the benchmark's own training products (``products``,
    each as ``x @ w.T`` like a linear layer's forward, and as the weight gradient ``g.T @ x``): on some CPUs
    the library picks kernels for the model's shapes that beat the square ones, and a floor from a slower
    rate than the step reaches would read as a step faster than its floor."""
    import torch

    torch.set_num_threads(threads)
    pairs = [(torch.randn(n, n), torch.randn(n, n)) for n in (1024, 2048)]
    for m, k, n in products:
        pairs.append((torch.randn(m, k), torch.randn(n, k).T))  # forward: (m, k) @ (k, n) from an (n, k) weight
        pairs.append((torch.randn(m, k).T, torch.randn(m, n)))  # weight gradient: (k, m) @ (m, n)
    best = 0.0
    for a, b in pairs:
        flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
        torch.matmul(a, b)  # warm-up
        for _ in range(5):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = max(best, flops / (time.perf_counter() - start) / 1e9)
    return best


def ours_config(
    algo: str,
    models: dict,
    prompts: str,
    out_dir: Path,
    steps: int,
    s: dict,
    *,
    critic: str | None = None,
    micro_batch_size: int | None = None,
    compile: bool = False,
    checkpointing: bool = False,
    parallelism: str = "auto",
) -> dict:
    """Our config for the shared settings `s` (the flat names TRL's side reads too), in rlhf's sections."""
    if algo == "ppo":
        algorithm = {"epochs": s["ppo_epochs"], "num_minibatches": s["num_minibatches"]} | (
            {"critic": critic} if critic else {}
        )
    else:
        algorithm = {"group_size": s["group_size"], "num_iterations": s["num_iterations"]}
    return {
        "output_dir": str(out_dir), "model": {"name": models["policy"], "compile": compile,
                                                   "gradient_checkpointing": checkpointing},
        "data": {"train": prompts}, "reward": {"source": models["reward"]},
        "sampling": {"max_new_tokens": s["max_new_tokens"], "temperature": s["temperature"]},
        "kl": {"coef": s["kl_coef"]}, "optim": {"learning_rate": s["learning_rate"]},
        "batch": {"size": s["batch_size"], "micro_size": micro_batch_size},
        "run": {"seed": 0, "report_to": ["jsonl"], "progress": False, "eval_every": 0, "save_every": 0,
                "overwrite": True, "parallelism": parallelism},
        algo: {"steps": steps, **algorithm},
    }  # fmt: skip


def run_spec(case: Case, run: Run, assets: dict, steps: int, out_dir: Path) -> dict:
    """The SPEC a child reads: our config dict, or TRL's settings."""
    models = assets["models"][case.size]
    s = case.settings
    if run.side == "ours":
        config = ours_config(case.algo, models, assets["prompts"], out_dir, steps, {**s, "max_new_tokens": case.max_new_tokens},
                             critic=run.critic, micro_batch_size=run.micro_batch_size, compile=run.compile,
                             checkpointing=run.checkpointing)  # fmt: skip
        return {"algo": case.algo, "config": config}
    return {
        "algo": case.algo, "policy": models["policy"], "reward": models["reward"],
        "prompts": assets["prompts"], "output_dir": str(out_dir), "seed": 0, "steps": steps,
        "max_new_tokens": case.max_new_tokens,
        "batch_size": s["batch_size"], "group_size": s.get("group_size", 1), "epochs": s.get("ppo_epochs", 1),
        "learning_rate": s["learning_rate"], "kl_coef": s["kl_coef"], "temperature": s["temperature"],
    }  # fmt: skip


def run_child(python: Path, script: str, spec: dict, folder: Path, threads: int, timeout: float) -> dict:
    """Run one child process in ``folder``; its result JSON, or {"error": ...} with the tail of its log."""
    spec = {**spec, "threads": threads}
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps(spec, indent=1))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled"}  # fmt: skip
    env.pop("PYTHONPATH", None)  # a peer venv must not see this checkout
    result_path = folder / "result.json"
    with (folder / "log.txt").open("w") as logfile:
        try:
            code = subprocess.run(
                [str(python), str(HERE / script), str(folder / "spec.json"), str(result_path)],
                stdout=logfile, stderr=subprocess.STDOUT, env=env, timeout=timeout,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s (log: {folder / 'log.txt'})"}
    if code != 0 or not result_path.exists():
        tail = (folder / "log.txt").read_text().strip().splitlines()[-3:]
        return {"error": f"exit code {code}: {' '.join(tail)} (log: {folder / 'log.txt'})"}
    return json.loads(result_path.read_text())


def summarize_run(raw: dict, case: Case, run: Run, assets: dict, gflops: float) -> dict:
    """measure.summarize plus peak RSS and, for our runs, the peak the trainer's memory plan predicted at its
    start, the memory by phase, the FLOPs and the floor fraction."""
    summary = measure.summarize(raw["steps"], phase_peaks=raw.get("phase_peaks"))
    summary["peak_rss_mb"] = raw["peak_rss_mb"]
    if run.side == "ours":
        summary["planned_peak_mb"] = raw.get("planned_peak_mb")
        summary["rss_start_mb"] = raw.get("rss_start_mb")
        if not raw.get("phase_peaks"):
            summary["phase_peaks_note"] = raw.get("phase_peaks_note")
        models, s = assets["models"][case.size], case.settings
        flops = measure.step_flops(
            policy_params=models["policy_matmul_params"],
            reward_params=models["reward_matmul_params"],
            sequences=sequences_per_step(case),
            prompt_len=assets["prompt_len"],
            response_len=round(summary["gen_columns"]),
            epochs=s.get("ppo_epochs", s.get("num_iterations", 1)),
            critic_params=models["reward_matmul_params"] if run.critic == "separate" else 0,
            reference=case.algo == "ppo" or s["kl_coef"] > 0,
            # our grpo skips the old-log-prob pass with one update per rollout and no reference (on_policy)
            old_logprobs=not skips_old_logprob_pass(case, run),
        )
        summary["flops"] = flops
        summary["floor_s"] = flops["total"] / (gflops * 1e9)
        summary["floor_fraction"] = summary["floor_s"] / summary["s_per_step"]
    return summary


def skips_old_logprob_pass(case: Case, run: Run) -> bool:
    """Whether our trainer takes the old log-probs from the first update's forward (no separate pass):
    grpo with one update per rollout and no reference (``grpo.on_policy``); ppo with one minibatch in one
    micro-batch (``ppo.fuses_first_update``)."""
    s = case.settings
    if case.algo == "grpo":
        return s["kl_coef"] == 0 and s.get("num_iterations", 1) == 1 and s.get("num_minibatches", 1) == 1
    one_micro_batch = run.micro_batch_size is None or run.micro_batch_size >= s["batch_size"]
    return s.get("num_minibatches", 1) == 1 and one_micro_batch


def cpu_busy(seconds: float = 1.0) -> float:
    """Share of all cores' time spent busy over the next ``seconds`` (/proc/stat), while this process waits."""

    def sample() -> tuple[int, int]:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return ticks[3] + ticks[4], sum(ticks)  # idle + iowait, all

    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def machine_info(threads: int, gflops: float) -> dict:
    import torch
    import transformers

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return {
        "cpu": cpu, "cores": os.cpu_count(), "threads": threads,
        "peak_fp32_gflops": gflops, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "date": utc_now(),
    }  # fmt: skip


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


# ------------------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------------------


def caption(results: dict) -> str:
    m = results["machine"]
    peers = ", ".join(f"TRL {v['trl']} (transformers {v['transformers']})" for v in results["peers"].values())
    mode = "quick run, " if results["quick"] else ""
    n = results["repeats"]
    repeats = f"median of {n} repeats run in turn, spread min–max" if n > 1 else "one repeat"
    busy = max((run.get("cpu_busy_before", 0.0) for case in results["cases"] for run in case["runs"]), default=0)
    warning = (
        f" **Other processes used up to {100 * busy:.0f}% of the CPU just before a run: not a measurement.**"
        if busy > BUSY
        else ""
    )
    others: dict[int, list[str]] = {}
    for case in results["cases"]:
        if case.get("steps", results["steps"]) != results["steps"]:
            others.setdefault(case["steps"], []).append(case["name"])
    exceptions = "; ".join(f"{n} in {', '.join(names)}" for n, names in others.items())
    exceptions = f" ({exceptions})" if exceptions else ""
    dates: dict[str, list[str]] = {}  # a merged table (--merge): each case's own date
    for case in results["cases"]:
        dates.setdefault(case.get("date", m["date"]), []).append(case["name"])
    when = m["date"] if len(dates) == 1 else "; ".join(f"{d} ({', '.join(n)})" for d, n in sorted(dates.items()))
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['threads']} threads, torch {m['torch']}, fp32 matmul peak "
        f"{m['peak_fp32_gflops']:.0f} GFLOP/s; {peers}; {mode}{results['steps']} steps per run{exceptions}, "
        f"a repeat's s/step the median of its steps after {measure.WARMUP_STEPS} warm-up; {repeats}; "
        f"{when}. `python benchmarks/run.py`; notes in benchmarks/README.md.{warning}"
    )


def render(results: dict) -> str:
    return f"{caption(results)}\n\n{measure.markdown_table(results['cases'])}"


LEGEND = """
Columns: **s/step** wall seconds of a step: per repeat the median of the steps after warm-up, then the
median over the repeats, with their min–max in brackets (and `[k of N repeats]` when some failed); **speed vs TRL** TRL's median s/step ÷ ours
(> 1: we are faster), in brackets the min–max of the per-repeat ratios (repeat i of ours against repeat i
of TRL, run back to back); **peak RSS** of the run's own process, median over repeats; **RSS vs TRL** our
median peak RSS ÷ TRL's. The other columns come from the repeat whose s/step is the median one:
**warm-up s** the warm-up steps together (start-up work that the median leaves out, such as
`compile: true` compiling); **episodes/s** sampled responses per second; **gen tok/s** generated tokens
(up to and including the stop token) per second; **mean gen len** generated tokens per response;
**% gen / reward / score / train** our step's median split into sampling, the reward model, the no-grad
pass (old log-probs, values, reference), and the update epochs; **floor fraction** the step's model FLOPs
at the machine's fp32 matmul peak ÷ the measured step (`measure.step_flops`); **peak MB by phase** ours
only: the process's peak RSS within each phase the trainer times, median over the timed steps ("rollout":
sampling, and in GRPO the reward model; "logprobs": the no-grad pass; "train": the update epochs;
"other": the rest of the step, in PPO the reward model). Cases: `ppo32` / `ppo128`
16 prompts × 32 / 128 new tokens, 4 epochs, 1 minibatch; `grpo` 4 prompts × 4 samples, 32 new tokens,
one update; `ppo32-25m` as ppo32 with a 25M-parameter policy; `ppo32-110m` / `grpo-110m` as ppo32 / grpo
with a 114M-parameter policy (GPT-2 small's shape), 6 steps per run.
"""


def merged(old: dict, new: dict) -> dict:
    """``old`` results with the cases of ``new`` put in place of their namesakes (in :data:`CASES` order); refused
    unless both come from the same machine, threads, steps, repeats and peer versions, so one table compares like with
    like (each case keeps its own date)."""
    measure.check_results(old)
    differ = [k for k in ("quick", "steps", "repeats") if old[k] != new[k]]
    differ += [f"peers.{k}" for k, versions in new["peers"].items() if old["peers"].get(k) != versions]
    differ += [f"machine.{k}" for k in ("cpu", "cores", "threads", "torch") if old["machine"][k] != new["machine"][k]]
    if differ:
        raise ValueError(f"results.json was measured with other {', '.join(differ)}")
    for case in old["cases"]:
        case.setdefault("date", old["machine"]["date"])
    cases = {case["name"]: case for case in old["cases"]} | {case["name"]: case for case in new["cases"]}
    order = {name: i for i, name in enumerate(CASES)}
    return old | {"cases": sorted(cases.values(), key=lambda case: order.get(case["name"], len(order)))}


def write_results(results: dict, update_readme: str | None) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    table = render(results)
    (RESULTS / "results.md").write_text(f"# Benchmark: rlhf vs TRL\n\n{table}{LEGEND}")
    print(table)
    if update_readme:
        path = Path(update_readme)
        updated = measure.replace_between_markers(path.read_text(), table)
        if updated is None:
            markers = f"{measure.START_MARKER} … {measure.END_MARKER}"
            log(f"warning: {path} has no {markers} markers; left unchanged")
        else:
            path.write_text(updated)
            log(f"updated the table in {path}")


def case_steps(case: Case, args: argparse.Namespace) -> int:
    """Steps per run of ``case``: its own ``steps`` when it sets one (the smaller with ``--quick``), else
    ``--steps``."""
    if case.steps is None:
        return args.steps
    return min(case.steps, args.steps) if args.quick else case.steps


def run_case(name: str, case: Case, assets: dict, peers: dict, args: argparse.Namespace, gflops: float) -> dict:
    """Every run of one case, one process each; ours are then compared with the case's peer.

    With ``--repeats N`` the case's runs go round N times in turn (ours, TRL, ours, TRL, …): the machine's
    speed drifts by tens of percent within an hour, and a drift that hits one side's only run would decide
    the ratio. Each run reports the median over its repeats with their min–max (``measure.combine_repeats``)
    and keeps every repeat's raw records; the ratios pair repeat i of ours with repeat i of the peer.
    """
    steps = case_steps(case, args)
    entry = {"name": name, "algo": case.algo, "size": case.size, "max_new_tokens": case.max_new_tokens,
             "steps": steps, "settings": case.settings, "runs": [], "date": utc_now(),
             "model": {k: v for k, v in assets["models"][case.size].items() if k in MODEL_KEYS}}  # fmt: skip
    repeats: list[list[dict]] = [[] for _ in case.runs]  # per run: one record per repeat
    for repeat in range(args.repeats):
        for i, run in enumerate(case.runs):
            busy = cpu_busy()  # other processes skew every timing (see README.md), so their CPU use is kept
            log(f"{name}: {run.label} ({steps} steps, repeat {repeat + 1}/{args.repeats})")
            if busy > BUSY:
                log(f"  warning: other processes use {100 * busy:.0f}% of the CPU; timings will be noisy")
            ours = run.side == "ours"
            python = Path(sys.executable) if ours else peers[run.side][0]
            folder = WORK / "runs" / f"{name}-{i}-{run.side}-r{repeat}"
            spec = run_spec(case, run, assets, steps, folder / "out")
            raw = run_child(python, "child_ours.py" if ours else "child_trl.py", spec, folder, args.threads,
                            args.timeout)  # fmt: skip
            record: dict = {"repeat": repeat, "cpu_busy_before": busy}
            if "error" in raw:
                log(f"  failed: {raw['error']}")
                record["error"] = raw["error"]
            else:
                record |= {"summary": summarize_run(raw, case, run, assets, gflops), "raw": raw}
                log(f"  {record['summary']['s_per_step']:.3f} s/step, {raw['peak_rss_mb']:.0f} MB peak RSS")
            repeats[i].append(record)
    for run, tries in zip(case.runs, repeats, strict=True):
        record = {"label": run.label, "side": run.side, "critic": run.critic, "repeats": tries,
                  "cpu_busy_before": max(t["cpu_busy_before"] for t in tries)}  # fmt: skip
        summary = measure.combine_repeats([t.get("summary") for t in tries])
        if summary is None:
            record["error"] = tries[-1]["error"]
        else:
            record["summary"] = summary
        entry["runs"].append(record)
    peer = next((r for r in entry["runs"] if r["side"] != "ours" and "summary" in r), None)
    for record in entry["runs"]:
        if peer and record["side"] == "ours" and "summary" in record:
            record["vs_peer"] = measure.ratios(
                [t.get("summary") for t in record["repeats"]], [t.get("summary") for t in peer["repeats"]]
            )
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 steps per run (2 warm-up + 2 timed)")
    parser.add_argument("--only", help=f"comma-separated cases out of {','.join(CASES)}")
    parser.add_argument("--steps", type=int, help="steps per run (default 12, or 4 with --quick; the 110m cases: 6)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads, both sides")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per run")
    parser.add_argument(
        "--repeats", type=int, help="rounds of each case's runs, median reported (default 3, 1 with --quick)"
    )
    parser.add_argument("--update-readme", metavar="FILE", help="put the table between the benchmark markers")
    parser.add_argument("--from-results", action="store_true", help="re-render results/results.json only")
    parser.add_argument(
        "--merge", action="store_true", help="with --only: replace those cases in results/results.json, keep the rest"
    )
    args = parser.parse_args()
    if args.merge and not args.only:
        parser.error("--merge replaces the --only cases in results.json; name them with --only")
    if args.from_results:
        results = json.loads((RESULTS / "results.json").read_text())
        try:
            measure.check_results(results)
        except ValueError as error:
            parser.exit(2, f"{parser.prog}: {RESULTS / 'results.json'}: {error}\n")
        write_results(results, args.update_readme)
        return 0
    names = args.only.split(",") if args.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    args.steps = args.steps or (4 if args.quick else 12)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    assets = build_assets({CASES[name].size for name in names})
    needed = sorted({run.side for name in names for run in CASES[name].runs} - {"ours"})
    peers = {peer: ensure_venv(peer) for peer in needed}
    gflops = peak_gflops(args.threads, training_products(names, assets))
    log(f"fp32 matmul peak with {args.threads} threads: {gflops:.1f} GFLOP/s")
    results = {
        "format": measure.RESULTS_FORMAT,
        "machine": machine_info(args.threads, gflops),
        "quick": args.quick,
        "steps": args.steps,
        "repeats": args.repeats,
        "peers": {f"trl-{PEERS[peer]}": versions for peer, (_, versions) in peers.items()},
        "cases": [run_case(name, CASES[name], assets, peers, args, gflops) for name in names],
    }
    if args.merge:
        try:
            results = merged(json.loads((RESULTS / "results.json").read_text()), results)
        except (OSError, ValueError) as error:
            (RESULTS / "results.new.json").write_text(json.dumps(results, indent=1) + "\n")
            parser.exit(2, f"{parser.prog}: --merge: {error}; this run is in {RESULTS / 'results.new.json'}\n")
    write_results(results, args.update_readme)
    return 1 if any("error" in run for case in results["cases"] for run in case["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
