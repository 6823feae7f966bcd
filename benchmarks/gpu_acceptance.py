"""GPU acceptance: `rlhf grpo` and `rlhf ppo` at 1.5B parameters on one GPU in the default precision, beside TRL.

    python benchmarks/gpu_acceptance.py           # on one CUDA GPU (H100 / H200): about 4 minutes
    python benchmarks/gpu_acceptance.py --tiny    # the same code on a tiny shape (on the CPU: under a minute)

Offline: a child process (child_gpu.py) builds random-init Qwen2 models — the policy of Qwen2.5-1.5B's shape, the
reward model of Qwen2.5-0.5B's — and saves them in bfloat16 with benchmarks/run.py's tokenizer and 10-token prompts.
Then, each in its own process with a time limit: `rlhf grpo` and `rlhf ppo` through the public trainers with
`model.bf16` unset (bf16 mixed precision on a GPU), and, when trl imports, TRL's GRPOTrainer with bf16=True on the
same models, prompts and settings. A child that fails or runs out of time is a row of the table, not a crash. After
every run: benchmarks/results/gpu_acceptance.{json,md} (`--tiny`: in benchmarks/.work/gpu_acceptance/tiny/).
Notes: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import measure
import run as bench  # the CPU benchmark: prompts, our config, child processes, machine info

QWEN25_1_5B = {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
               "intermediate_size": 8960}  # fmt: skip
QWEN25_0_5B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
               "intermediate_size": 4864}  # fmt: skip
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128}  # fmt: skip
COLUMNS = ("run", "s/step", "vs TRL", "episodes/s", "gen tok/s", "rollout / score / logprobs / train s",
           "measured peak MB", "planned MB", "planned / measured", "update/changed_frac min–max",
           "weights changed")  # fmt: skip
PHASES = ("rollout", "score", "logprobs", "train")
"""The trainers' ``time/<phase>_s`` (rlhf.trainers.rl.loop.step_metrics): sampling, reward model, no-grad pass, update."""


@dataclass(frozen=True)
class Mode:
    name: str
    policy: dict
    reward: dict
    vocab_size: int  # both models'; the tokenizer has ~400 tokens, so most sampled ids decode to nothing
    grpo: dict  # run.py's flat settings, with batch_size (prompts) and max_new_tokens
    ppo: dict
    ppo_micro_size: int | None  # batch.micro_size of the PPO run
    steps: int  # per run: 2 warm-up, the rest timed
    timeout: float  # seconds per child
    bf16: bool | None  # our model.bf16 (None: the default, on for a CUDA GPU); TRL's bf16 is what it resolves to


MODES = {
    # 64 completions × 128 new tokens both ways; PPO's 64 × 138-token update in 4 micro-batches (the plan: 49 GiB,
    # 80 GiB in one); GRPO's in one (59 GiB), as TRL's per_device_train_batch_size=64 does it
    "full": Mode("full", QWEN25_1_5B, QWEN25_0_5B, 151936, {**bench.GRPO, "batch_size": 16, "max_new_tokens": 128},
                 {**bench.PPO, "batch_size": 64, "max_new_tokens": 128}, 16, steps=5, timeout=200, bf16=None),
    # on the CPU, mixed precision as on a GPU (CPU autocast: slow without bfloat16 units, but the same code)
    "tiny": Mode("tiny", TINY, TINY, 1024, {**bench.GRPO, "max_new_tokens": 16},
                 {**bench.PPO, "batch_size": 8, "ppo_epochs": 1, "max_new_tokens": 16}, 4, steps=3, timeout=120,
                 bf16=True),
}  # fmt: skip


@dataclass(frozen=True)
class Run:
    label: str
    side: str  # "ours" or "trl"
    algo: str
    sampling: tuple = ()  # (field, value) pairs of our config's sampling section

    @property
    def folder(self) -> str:
        return f"{self.side}-{self.algo}" + "".join(f"-{key}" for key, _ in self.sampling)


RUNS = (
    Run("rlhf grpo", "ours", "grpo"),
    Run("rlhf grpo, sampling.cuda_graphs", "ours", "grpo", (("cuda_graphs", True),)),
    Run("rlhf ppo", "ours", "ppo"),
    Run("TRL GRPOTrainer", "trl", "grpo"),
)


def build_models(mode: Mode, work: Path, timeout: float) -> dict:
    """The policy and reward model directories and sizes, built by a child (on the GPU when there is one) unless
    ``work/models`` holds this recipe's already."""
    spec = {"side": "build", "dir": str(work / "models"), "vocab_size": mode.vocab_size, "policy": mode.policy,
            "reward": mode.reward}  # fmt: skip
    recipe = work / "models" / "recipe.json"
    if recipe.exists() and json.loads(recipe.read_text())["spec"] == spec:
        return json.loads(recipe.read_text())["models"]
    bench.log(f"building the {mode.name} models into {work / 'models'}")
    raw = bench.run_child(Path(sys.executable), "child_gpu.py", spec, work / "build", os.cpu_count(), timeout)
    if "error" in raw:
        raise RuntimeError(f"building the models failed: {raw['error']}")
    models = {"policy": spec["dir"] + "/policy", "reward": spec["dir"] + "/reward", **raw}
    recipe.write_text(json.dumps({"spec": spec, "models": models}, indent=1))
    return models


def child_spec(run: Run, mode: Mode, models: dict, prompts: str, out: Path, device: str) -> dict:
    """What child_gpu.py reads: run.py's spec of the same run (our config, or TRL's settings) and the side."""
    settings = getattr(mode, run.algo)
    case = bench.Case(run.algo, "model", settings["max_new_tokens"], (), settings)
    assets = {"models": {"model": models}, "prompts": prompts}
    if run.side == "trl":
        spec = bench.run_spec(case, bench.Run(run.label, "trl-grpo"), assets, mode.steps, out)
        return spec | {"side": "trl", "device": device, "bf16": device == "cuda" if mode.bf16 is None else mode.bf16}
    micro = mode.ppo_micro_size if run.algo == "ppo" else None
    spec = bench.run_spec(case, bench.Run(run.label, "ours", micro_batch_size=micro), assets, mode.steps, out)
    if mode.bf16 is not None:
        spec["config"]["model"]["bf16"] = mode.bf16
    spec["config"]["sampling"].update(dict(run.sampling))
    return spec | {"side": "ours"}


def weights_changed(start: Path, final: Path) -> dict:
    """The share of the policy's weights whose value differs between ``final/`` (the float32 master weights the
    run saved) and the start (bfloat16, cast to the saved dtype exactly), over every saved tensor."""
    from safetensors.torch import load_file

    def load(folder: Path) -> dict:
        return {k: v for shard in sorted(folder.glob("*.safetensors")) for k, v in load_file(shard).items()}

    before, after = load(start), load(final)
    moved = sum(int((w != before[k].to(w.dtype)).sum()) for k, w in after.items())
    return {"frac": moved / sum(w.numel() for w in after.values()), "dtype": str(next(iter(after.values())).dtype)}


def summarize(run: Run, raw: dict, out: Path, models: dict) -> dict:
    """Seconds per step and rates (measure.summarize), the peak memory against the plan, and for ours each
    phase's median seconds, ``update/changed_frac`` per step and the share of weights that moved."""
    summary = measure.summarize(raw["steps"])
    cuda = raw.get("cuda")
    summary["memory"] = {
        "measured": "torch.cuda.max_memory_allocated" if cuda else "peak RSS (VmHWM)",
        "measured_mb": cuda["max_allocated_mb"] if cuda else raw["peak_rss_mb"],
        "reserved_mb": cuda and cuda["max_reserved_mb"],
        "planned_mb": raw.get("planned_peak_mb"),
    }
    summary["gpu"] = cuda and cuda["gpu"]
    if run.side == "ours":
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rows = [row for row in rows if "time/step_s" in row]
        summary["phase_s"] = {p: measure.median_after_warmup([row.get(f"time/{p}_s", 0.0) for row in rows])
                              for p in PHASES}  # fmt: skip
        summary["changed_frac"] = [row["update/changed_frac"] for row in rows]
        summary["weights_changed"] = weights_changed(Path(models["policy"]), out / "final")
    return summary


def run_one(run: Run, mode: Mode, models: dict, prompts: str, work: Path, device: str, timeout: float) -> dict:
    """One run in its own process: its summary, or the error that stopped it (a failed child, a time-out, results
    that cannot be read), said on stderr too."""
    folder = work / "runs" / run.folder
    spec = child_spec(run, mode, models, prompts, folder / "out", device)
    raw = bench.run_child(Path(sys.executable), "child_gpu.py", spec, folder, os.cpu_count(), timeout)
    record = {"label": run.label, "side": run.side, "algo": run.algo, "spec": spec, "raw": raw}
    if "error" not in raw:
        try:
            record["summary"] = summarize(run, raw, folder / "out", models)
        except (OSError, KeyError, ValueError) as error:  # the run finished but left no readable results
            raw["error"] = f"{type(error).__name__}: {error}"
    if "error" in raw:
        record["error"] = raw["error"]
    bench.log(f"  failed: {raw['error']}" if "error" in raw else f"  {record['summary']['s_per_step']:.2f} s/step")
    return record


def has_trl() -> bool:
    return importlib.util.find_spec("trl") is not None


def machine(records: list[dict]) -> dict:
    info = bench.machine_info(os.cpu_count(), 0.0)
    info.pop("peak_fp32_gflops")
    trl = importlib.metadata.version("trl") if has_trl() else None
    return {"gpu": next((r["summary"]["gpu"] for r in records if r.get("summary", {}).get("gpu")), None), **info,
            "trl": trl}  # fmt: skip


def millions(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def cell(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def render(results: dict) -> str:
    m, mode, models = results["machine"], MODES[results["mode"]], results["models"]
    grpo, ppo = mode.grpo, mode.ppo
    precision = "model.bf16 unset (bf16 mixed on a GPU)" if mode.bf16 is None else f"model.bf16: {mode.bf16}"
    policy, reward = millions(models.get("policy_params")), millions(models.get("reward_params"))
    caption = (
        f"{m['gpu'] or m['cpu'] + ' (no GPU)'}, torch {m['torch']}, transformers {m['transformers']}, trl "
        f"{m['trl'] or 'not installed'}; {m['date']}. Random-init Qwen2 policy of {policy} "
        f"parameters, reward model {reward}, vocabulary {mode.vocab_size}; {precision}, "
        f"TRL bf16={results['trl_bf16']}. GRPO: {grpo['batch_size']} prompts × {grpo['group_size']} = "
        f"{grpo['batch_size'] * grpo['group_size']} completions; PPO: {ppo['batch_size']} prompts, "
        f"{ppo['ppo_epochs']} epochs, micro-batches of {mode.ppo_micro_size}; {grpo['max_new_tokens']} new tokens; "
        f"{mode.steps} steps per run, medians after {measure.WARMUP_STEPS} warm-up; vs TRL: TRL's s/step ÷ ours "
        f"(> 1: ours faster). Measured peak: "
        f"{'torch.cuda.max_memory_allocated (reserved in brackets)' if m['gpu'] else 'peak RSS'}; planned: the "
        "peak of the plan the trainer checked at its start (rlhf.planning). `python benchmarks/gpu_acceptance.py`."
    )
    lines = [caption, "", f"| {' | '.join(COLUMNS)} |", "|" + "---|" * len(COLUMNS)]
    trl = next((r["summary"]["s_per_step"] for r in results["runs"] if r["side"] == "trl" and "summary" in r), None)
    for r in results["runs"]:
        if "summary" not in r:
            said = f"not run: {r['skipped']}" if "skipped" in r else f"**failed**: {r['error'].replace('|', '/')}"
            lines.append(f"| {r['label']} | {said} |" + " – |" * (len(COLUMNS) - 2))
            continue
        s, mem = r["summary"], r["summary"]["memory"]
        vs = f"{trl / s['s_per_step']:.2f}×" if trl and r["side"] == "ours" and r["algo"] == "grpo" else "–"
        phases = " / ".join(f"{s['phase_s'][p]:.2f}" for p in PHASES) if "phase_s" in s else "–"
        reserved = f" ({mem['reserved_mb']:,.0f})" if mem["reserved_mb"] else ""
        ratio = mem["planned_mb"] / mem["measured_mb"] if mem["planned_mb"] else None
        changed = f"{min(s['changed_frac']):.3f}–{max(s['changed_frac']):.3f}" if "changed_frac" in s else "–"
        moved = f"{s['weights_changed']['frac']:.1%}" if "weights_changed" in s else "–"
        lines.append(f"| {r['label']} | {s['s_per_step']:.2f} | {vs} | {s['episodes_per_s']:.1f} | "
                     f"{s['gen_tokens_per_s']:,.0f} | {phases} | {cell(mem['measured_mb'])}{reserved} | "
                     f"{cell(mem['planned_mb'])} | {cell(ratio, 2)} | {changed} | {moved} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write(results: dict, work: Path) -> None:
    """gpu_acceptance.{json,md} into benchmarks/results/, or with --tiny beside the tiny run (``work``)."""
    folder = bench.RESULTS if results["mode"] == "full" else work
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu_acceptance.json").write_text(json.dumps(results, indent=1) + "\n")
    (folder / "gpu_acceptance.md").write_text(f"# GPU acceptance: rlhf grpo and ppo, beside TRL\n\n{render(results)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a tiny shape (the CPU test of this script)")
    parser.add_argument("--timeout", type=float, help="seconds per child process (default 200; --tiny 120)")
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    mode = MODES["tiny" if args.tiny else "full"]
    if device == "cpu" and not args.tiny:
        parser.error("no CUDA GPU here; --tiny runs the same code on a tiny shape on the CPU")
    timeout = args.timeout or mode.timeout
    work = bench.WORK / "gpu_acceptance" / mode.name
    prompts = bench.build_assets(set())["prompts"]  # run.py's 64 prompts of exactly 10 tokens
    try:
        models, unbuilt = build_models(mode, work, timeout), None
    except RuntimeError as error:  # every run is then a row that says so
        models, unbuilt = {}, str(error)
    results = {"format": 1, "mode": mode.name, "machine": machine([]), "models": models, "runs": [],
               "trl_bf16": device == "cuda" if mode.bf16 is None else mode.bf16}  # fmt: skip
    for run in RUNS:
        record = {"label": run.label, "side": run.side, "algo": run.algo}
        if unbuilt:
            record["error"] = unbuilt
        elif run.side == "trl" and not has_trl():
            record["skipped"] = "trl does not import here"
        else:
            bench.log(f"{run.label} ({mode.steps} steps, {device})")
            record = run_one(run, mode, models, prompts, work, device, timeout)
        results["runs"].append(record)
        results["machine"] = machine(results["runs"])
        write(results, work)
    print(render(results))
    return 1 if any("error" in r for r in results["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
