"""``rlhf demo``: the whole RLHF pipeline on the advice task (`rlhf.demo.task`), offline, on a CPU.

Stages, each in its own directory under ``output_dir`` (the RL stages through the public runners, with the
configs they would read from YAML, written next to them as ``config.yaml``):

1. ``pretrain/`` — a byte-level BPE tokenizer and a tiny Llama trained on the corpus (prompt + response texts of
   every quality), with a plain next-token loop (`pretrain`);
2. ``sft/`` — `rlhf sft` on mixed-quality demonstrations (`Preset.sft_mix`: mostly not helpful);
3. ``sample/`` — `rlhf sample` (mode candidates): k responses of the SFT model per training prompt;
4. ``label/`` — the gold judge labels every pair of a prompt's candidates with Bradley–Terry noise (`task.gold_label`):
   ``preferences.jsonl`` for training; ``eval_preferences.jsonl`` (pairs of held-out prompts) labelled by the
   noiseless gold rule, so the reward model's held-out accuracy is its agreement with the truth;
5. ``rm/`` — `rlhf rm` from the pretrained LM (a decoder reward model); it sees only the labels;
   ``dpo/`` — `rlhf dpo` from the SFT model on the very pairs the reward model saw (no reward model at all);
6. ``ppo/`` — `rlhf ppo` from the SFT model against the reward model;
   ``ppo_no_kl/`` — PPO with ``kl_coef: 0`` and the shared critic: without the KL leash the policy drifts far
   from the reference and its gold score falls while its reward-model score does not — what the leash is for;
7. ``grpo/`` — `rlhf grpo` from the SFT model against the same reward model;
8. ``eval/`` — `rlhf eval` of every method on the same held-out prompts, the SFT model as the baseline, the gold
   judge deciding each comparison (``judge: rlhf.demo.task:gold``), scored by both gold and the reward model:
   best-of-N (the SFT model's best of N samples under the reward model), DPO, PPO and GRPO, with the KL of
   each one's answers from the SFT reference (best-of-N: its log N − (N−1)/N bound).

``summary.json`` is computed from those outputs only (see `summarize`); nothing in it is written in by hand. Its
``methods`` table compares SFT, best-of-N, DPO, PPO and GRPO on equal labels (`compare_methods`).
``report.html`` (`rlhf.report.demo`) is built from the same files; ``rlhf report OUTPUT_DIR`` rebuilds it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rlhf.config import DemoConfig, config_from_dict, config_to_yaml
from rlhf.core.agreement import wilson_interval
from rlhf.demo import task
from rlhf.runlog import rundir
from rlhf.runlog.seeding import environment

GOLD = "rlhf.demo.task:gold"
"""The gold judge as a reward source (module:function)."""

MAX_LENGTH = 128
"""``data.max_length`` of sft, rm and dpo: the tiny model's positions. The task's longest demonstration is about 75
tokens (prompt and response, small preset), so every example is trained on whole; batches pad to their own
longest row, so the room costs nothing."""


@dataclasses.dataclass(frozen=True)
class Preset:
    """Sizes of one demo preset; every stage reads its numbers from here."""

    hidden_size: int
    num_layers: int
    vocab_size: int
    pretrain_steps: int
    pretrain_batch: int
    corpus_size: int
    """Lines of the pretraining corpus (prompt + response, every quality equally often)."""
    sft_examples: int
    sft_epochs: int
    sample_prompts: int
    """How many training prompts the SFT model answers for the preference pairs (at most all of them)."""
    num_samples: int
    rm_epochs: int
    ppo_steps: int
    ppo_batch: int
    grpo_steps: int
    grpo_batch: int
    group_size: int
    max_new_tokens: int
    eval_prompts: int
    eval_every: int
    """PPO/GRPO answer the held-out prompts every this many steps (``samples/``, ``eval/reward/*``)."""
    learning_rate: float = 3e-4
    """GRPO's learning rate (one update per rollout)."""
    ppo_learning_rate: float = 1e-4
    """PPO's: it takes 8 updates per rollout (4 epochs × 2 minibatches); at 3e-4 it over-optimised the reward
    model in one of two measured seeds' worlds (gold score peaking mid-run, then falling), at 1e-4 in neither."""
    kl_coef: float = 0.2
    dpo_epochs: int = 1
    dpo_learning_rate: float = 3e-4
    """DPO's: one epoch over the reward model's pairs (tried on seed 0: 1e-4 stayed closer to SFT, KL 1.9 against
    5.6, and gained less gold, 1.61 against 1.81)."""
    best_of_n: int = 8
    """N of the best-of-N baseline: N samples of the SFT model per held-out prompt, the reward model picks one."""
    sft_mix: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: MappingProxyType(
            {"helpful": 0.3, "vague": 0.15, "rambling": 0.2, "off_topic": 0.25, "rude": 0.1}
        )
    )


PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        # seconds: a smoke test of every stage (the test suite runs it end to end)
        "tiny": Preset(
            hidden_size=32,
            num_layers=1,
            vocab_size=384,
            pretrain_steps=20,
            pretrain_batch=16,
            corpus_size=320,
            sft_examples=64,
            sft_epochs=1,
            sample_prompts=16,
            num_samples=4,
            rm_epochs=1,
            ppo_steps=2,
            ppo_batch=8,
            grpo_steps=2,
            grpo_batch=2,
            group_size=4,
            max_new_tokens=12,
            eval_prompts=8,
            eval_every=1,
            best_of_n=4,
        ),
        # a few CPU minutes: enough for PPO to beat SFT under the gold judge
        "small": Preset(
            hidden_size=128,
            num_layers=2,
            vocab_size=512,
            pretrain_steps=400,
            pretrain_batch=32,
            corpus_size=4000,
            sft_examples=960,
            sft_epochs=2,
            sample_prompts=192,
            num_samples=8,
            rm_epochs=3,
            ppo_steps=60,
            ppo_batch=32,
            grpo_steps=40,
            grpo_batch=4,
            group_size=8,
            max_new_tokens=24,
            eval_prompts=48,
            eval_every=10,
        ),
    }
)
"""Preset name → sizes (`DemoConfig.preset`)."""

STAGES = ("pretrain", "sft", "sample", "label", "rm", "dpo", "ppo", "ppo_no_kl", "grpo", "eval")

METHODS = ("sft", "best_of_n", "dpo", "ppo", "grpo")
"""The methods the demo compares on equal labels, in the order of its table."""

ENTRIES = (*STAGES, "data", "summary.json", "report.html")
"""What a demo writes into its output_dir: a directory holding any of them is a demo (refused without
``overwrite``, and exactly these are removed with it)."""


def run(config: DemoConfig) -> dict[str, Any]:
    """Run every stage into ``config.output_dir``; returns the summary (also written to summary.json).

    The directory is locked for the whole demo; a previous demo there is refused, or removed with ``overwrite``
    before the first stage, so that every stage starts in an empty run directory.
    """
    with rundir.claim(config, entries=ENTRIES) as out:
        if config.overwrite:
            rundir.clear_run(out, ENTRIES)
        return _stages(config, out)


def _stages(config: DemoConfig, out: Path) -> dict[str, Any]:
    """Run the demo's stages in order, each timed, and return the summary.

    Long because it is the demo's script: one numbered stage after another, each a call, sharing the paths
    the earlier stages wrote.
    """
    preset = PRESETS[config.preset]
    start = time.perf_counter()
    train_prompts, eval_prompts = task.split_prompts(config.seed)
    seconds: dict[str, float] = {}
    paths: dict[str, Path] = {}

    def stage(name: str, fn: Callable[[], Any]) -> Any:
        _announce(config, name)
        t0 = time.perf_counter()
        result = fn()
        seconds[name] = time.perf_counter() - t0
        return result

    run = {"seed": config.seed, "progress": config.progress, "eval_every": 0, "save_every": 0}
    # 1. tokenizer + tiny Llama pretrained on the corpus
    paths["pretrain"] = stage("pretrain", lambda: pretrain(out / "pretrain", train_prompts, preset, config))
    # 2. SFT on mixed-quality demonstrations
    data = out / "data"
    _write_jsonl(data / "prompts.jsonl", [{"prompt": p} for p in train_prompts])
    _write_jsonl(data / "eval_prompts.jsonl", [{"prompt": p} for p in eval_prompts[: preset.eval_prompts]])
    rng = random.Random(config.seed)
    mix = dict(preset.sft_mix)
    _write_jsonl(data / "sft.jsonl", task.demonstrations(train_prompts, mix, preset.sft_examples, rng))
    _write_jsonl(data / "sft_eval.jsonl", task.demonstrations(eval_prompts, mix, 64, rng))
    sft = _config(
        out / "sft",
        "sft",
        {
            "output_dir": str(out / "sft"),
            "model": {"name": str(paths["pretrain"])},
            "data": {"train": str(data / "sft.jsonl"), "eval": str(data / "sft_eval.jsonl"), "max_length": MAX_LENGTH},
            "optim": {"learning_rate": 3e-3},
            "batch": {"size": 32},
            "run": run,
            "sft": {"epochs": preset.sft_epochs},
        },
    )
    from rlhf.trainers import sft as sft_runner

    paths["sft"] = stage("sft", lambda: sft_runner.run(sft))
    # 3. k candidates per prompt from the SFT model (training prompts, and held-out ones for the RM's eval pairs)
    _write_jsonl(data / "sample_prompts.jsonl", [{"prompt": p} for p in train_prompts[: preset.sample_prompts]])
    rm_eval_prompts = eval_prompts[preset.eval_prompts :] or eval_prompts
    _write_jsonl(data / "rm_eval_prompts.jsonl", [{"prompt": p} for p in rm_eval_prompts])
    sample_common = {
        "seed": config.seed,
        "progress": config.progress,
        "model": {"name": str(paths["sft"])},
        "mode": "candidates",
        "num_samples": preset.num_samples,
        "batch_size": 16,
        "sampling": {"max_new_tokens": preset.max_new_tokens, "temperature": 1.0},
    }
    samples = [
        _config(
            out / "sample" / name,
            "sample",
            {**sample_common, "prompts": str(data / prompts), "output": str(out / "sample" / f"{name}.jsonl")},
        )
        for name, prompts in (("candidates", "sample_prompts.jsonl"), ("eval_candidates", "rm_eval_prompts.jsonl"))
    ]
    from rlhf import sample as sample_runner

    stage("sample", lambda: [sample_runner.run(cfg) for cfg in samples])
    # 4. the gold judge labels the pairs: noisy raters for training, the noiseless rule for the held-out pairs
    labels = stage("label", lambda: label(out / "sample", out / "label", config.seed))
    # 5. reward model from the pretrained LM; it only ever sees the labels
    labelled = out / "label"
    pairs = {
        "train": str(labelled / "preferences.jsonl"),
        "eval": str(labelled / "eval_preferences.jsonl"),
        "max_length": MAX_LENGTH,
    }
    rm = _config(
        out / "rm",
        "rm",
        {
            "output_dir": str(out / "rm"),
            "model": {"name": str(paths["pretrain"])},
            "data": pairs,
            "optim": {"learning_rate": 1e-3},
            "batch": {"size": 32},
            "run": run,
            "rm": {"epochs": preset.rm_epochs},
        },
    )
    from rlhf.trainers import reward_model as rm_runner

    paths["rm"] = stage("rm", lambda: rm_runner.run(rm))
    # 5b. DPO from the SFT model on the same labelled pairs: no reward model, no sampling
    dpo = _config(
        out / "dpo",
        "dpo",
        {
            "output_dir": str(out / "dpo"),
            "model": {"name": str(paths["sft"])},
            "data": pairs,
            "optim": {"learning_rate": preset.dpo_learning_rate},
            "batch": {"size": 32},
            "run": run,
            "dpo": {"epochs": preset.dpo_epochs},
        },
    )
    from rlhf.trainers import dpo as dpo_runner

    paths["dpo"] = stage("dpo", lambda: dpo_runner.run(dpo))

    # 6-7. PPO and GRPO from the SFT model against the reward model
    # The gold judge rides along with weight 0: logged (reward/gold/mean) but never optimised, so the report
    # can show the proxy reward and the true score side by side as the policy moves away from the reference.
    def rl(name: str, learning_rate: float, kl_coef: float, batch_size: int, **algorithm: Any) -> dict[str, Any]:
        return {
            "output_dir": str(out / name),
            "model": {"name": str(paths["sft"])},
            "data": {"train": str(data / "prompts.jsonl"), "eval": str(data / "eval_prompts.jsonl")},
            "reward": {
                "source": [{"source": str(paths["rm"]), "name": "rm"}, {"source": GOLD, "name": "gold", "weight": 0.0}]
            },
            "sampling": {"max_new_tokens": preset.max_new_tokens, "temperature": 1.0},
            "kl": {"coef": kl_coef},
            "optim": {"learning_rate": learning_rate, "scheduler": "constant"},
            "batch": {"size": batch_size},
            "run": run | {"eval_every": preset.eval_every},
            name.partition("_")[0]: algorithm,
        }

    ppo_args = (preset.ppo_learning_rate, preset.kl_coef, preset.ppo_batch)
    ppo_algorithm = {"steps": config.steps or preset.ppo_steps, "num_minibatches": 2, "epochs": 4}
    ppo = _config(out / "ppo", "ppo", rl("ppo", *ppo_args, **ppo_algorithm))
    # PPO without the KL leash (β = 0): the reward model gets exploited, and the gold monitor shows it. It keeps the
    # shared critic, whose value loss also moves the policy's trunk, so nothing but the leash holds the policy
    # near the reference: with β = 0.2 the same run was healthy on all 10 runs of docs/ppo_study.md (its row
    # "shared_critic"), with β = 0 every one over-optimised (KL 33-159). With the default critic (separate, started from
    # the reward model) a β = 0 run drifts too slowly (KL ≈ 13 after 60 steps) to show it within the demo.
    ppo_no_kl = _config(
        out / "ppo_no_kl", "ppo", rl("ppo_no_kl", ppo_args[0], 0.0, ppo_args[2], **ppo_algorithm, critic="shared")
    )
    grpo = _config(
        out / "grpo",
        "grpo",
        rl(
            "grpo",
            preset.learning_rate,
            preset.kl_coef,
            preset.grpo_batch,
            steps=config.steps or preset.grpo_steps,
            group_size=preset.group_size,
        ),
    )
    from rlhf.trainers import grpo as grpo_runner
    from rlhf.trainers import ppo as ppo_runner

    paths["ppo"] = stage("ppo", lambda: ppo_runner.run(ppo))
    stage("ppo_no_kl", lambda: ppo_runner.run(ppo_no_kl))
    paths["grpo"] = stage("grpo", lambda: grpo_runner.run(grpo))

    # 8. held-out prompts: every method against the SFT baseline, the gold judge deciding; the KL of each
    # method's answers from the SFT reference (best-of-N samples the SFT model itself: its KL is the log N bound)
    def evaluation(name: str) -> Any:
        best_of = name == "best_of_n"
        return _config(
            out / "eval" / name,
            "eval",
            {
                "seed": config.seed,
                "progress": config.progress,
                "model": {"name": str(paths["sft" if best_of else name])},
                "baseline": str(paths["sft"]),
                "eval_data": str(data / "eval_prompts.jsonl"),
                "reward": {"source": [{"source": GOLD, "name": "gold"}, {"source": str(paths["rm"]), "name": "rm"}]},
                "judge": {"source": GOLD},
                **(
                    {"best_of": {"n": preset.best_of_n, "source": str(paths["rm"])}}
                    if best_of
                    else {"reference": str(paths["sft"])}
                ),
                "sampling": {"max_new_tokens": preset.max_new_tokens, "temperature": 1.0},
                "output": str(out / "eval" / f"{name}.json"),
                "samples_output": str(out / "eval" / f"{name}_samples.jsonl"),
            },
        )

    evals = {name: evaluation(name) for name in METHODS[1:]}
    from rlhf import evaluate as eval_runner

    results = stage("eval", lambda: {name: eval_runner.run(cfg) for name, cfg in evals.items()})
    summary = summarize(out, results, labels, seconds, time.perf_counter() - start)
    rundir.atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    from rlhf import report

    page = report.write(out)
    _announce(config, f"done in {summary['seconds']:.0f} s → {out / 'summary.json'}, {page}")
    return summary


# ---------------------------------------------------------------------------------------------------------------
# Stages that are the demo's own
# ---------------------------------------------------------------------------------------------------------------


def pretrain(out: Path, train_prompts: list[str], preset: Preset, config: DemoConfig) -> Path:
    """Tokenizer + tiny Llama trained with next-token loss on the corpus; returns ``out/final``.

    The corpus holds every quality of response equally often (a pretrained LM has seen all kinds of text);
    each line is prompt + response + eos, the layout SFT and generation use.
    """
    import torch

    from rlhf.models.tiny import save_tiny, tiny_causal_lm, train_tokenizer
    from rlhf.runlog.progress import StepProgress
    from rlhf.runlog.seeding import seed_everything

    seed_everything(config.seed)
    rng = random.Random(config.seed + 1)
    mix = dict.fromkeys(task.QUALITIES, 1.0)
    corpus = [r["prompt"] + r["response"] for r in task.demonstrations(train_prompts, mix, preset.corpus_size, rng)]
    tokenizer = train_tokenizer(corpus, preset.vocab_size, model_max_length=128)
    model = tiny_causal_lm("llama", tokenizer, preset.hidden_size, preset.num_layers, num_heads=4, seed=config.seed)
    encoded = [ids + [tokenizer.eos_token_id] for ids in tokenizer(corpus)["input_ids"]]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    model.train()
    out.mkdir(parents=True, exist_ok=True)
    with (
        (out / "metrics.jsonl").open("w") as log,
        StepProgress(preset.pretrain_steps, enabled=config.progress, description="pretrain") as bar,
    ):
        for step in range(1, preset.pretrain_steps + 1):
            t0 = time.perf_counter()
            batch = rng.sample(encoded, preset.pretrain_batch)
            width = max(map(len, batch))
            ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in batch])
            mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in batch])[:, None]).long()
            labels = ids.masked_fill(mask == 0, -100)  # padding carries no loss
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            row = {"step": step, "train/loss": loss.item(), "time/step_s": time.perf_counter() - t0}
            log.write(json.dumps(row) + "\n")
            bar.update(step, row)
    return save_tiny(model, tokenizer, out / "final")


def label(sample_dir: Path, out: Path, seed: int) -> dict[str, float]:
    """Pair every two candidates of each prompt (k·(k−1)/2 pairs) and label them; returns label statistics.

    Training pairs (``candidates.jsonl``) get a noisy rater's label (`task.gold_label`); held-out pairs
    (``eval_candidates.jsonl``) the noiseless gold preference. Pairs with equal text or equal gold score are
    skipped (there is nothing to prefer), and so are pairs with an empty response (`rlhf rm` refuses them).
    """
    rng = random.Random(seed + 2)
    stats: dict[str, float] = {}
    for source, target, noisy in (
        ("candidates.jsonl", "preferences.jsonl", True),
        ("eval_candidates.jsonl", "eval_preferences.jsonl", False),
    ):
        rows, agree = [], 0
        for record in _read_jsonl(sample_dir / source):
            prompt, completions = record["prompt"], record["completions"]
            for a, b in itertools.combinations(completions, 2):
                score_a, score_b = task.gold_score(prompt, a), task.gold_score(prompt, b)
                if a == b or score_a == score_b or not a.strip() or not b.strip():
                    continue
                if noisy:
                    row = task.gold_label((prompt, a, b), rng)
                else:
                    chosen, rejected = (a, b) if score_a > score_b else (b, a)
                    row = {
                        "prompt": prompt,
                        "chosen": chosen,
                        "rejected": rejected,
                        "gold_margin": abs(score_a - score_b),
                    }
                agree += row["gold_margin"] > 0
                rows.append(row)
        if not rows:
            raise RuntimeError(
                f"demo: no labelled pairs from {sample_dir / source}: every pair of candidates tied; "
                "use a larger preset"
            )
        _write_jsonl(out / target, rows)
        kind = "train" if noisy else "eval"
        stats[f"label/{kind}_pairs"] = len(rows)
        stats[f"label/{kind}_gold_agreement"] = agree / len(rows)
    return stats


def summarize(
    out: Path,
    results: Mapping[str, Mapping[str, Any]],
    labels: Mapping[str, float],
    seconds: Mapping[str, float],
    total: float,
) -> dict[str, Any]:
    """summary.json, from the stages' own outputs: the eval results, the rm and ppo/grpo metrics files."""
    rm_rows = [row for row in _read_jsonl(out / "rm" / "metrics.jsonl") if "eval/accuracy" in row]
    ppo_rows = [row for row in _read_jsonl(out / "ppo" / "metrics.jsonl") if "kl/mean" in row]
    grpo_rows = [row for row in _read_jsonl(out / "grpo" / "metrics.jsonl") if "reward/mean" in row]
    ppo, grpo = results["ppo"], results["grpo"]
    methods = compare_methods(out, results, seconds)
    summary: dict[str, Any] = {
        "gold/sft_mean": ppo["baseline/reward/gold/mean"],
        "gold/ppo_mean": ppo["reward/gold/mean"],
        "gold/grpo_mean": grpo["reward/gold/mean"],
        "gold/dpo_mean": results["dpo"]["reward/gold/mean"],
        "gold/best_of_n_mean": results["best_of_n"]["reward/gold/mean"],
        "gold/win_rate_vs_sft": ppo["win_rate"],
        "gold/grpo_win_rate_vs_sft": grpo["win_rate"],
        "gold/dpo_win_rate_vs_sft": results["dpo"]["win_rate"],
        "gold/best_of_n_win_rate_vs_sft": results["best_of_n"]["win_rate"],
        "rm/sft_mean": ppo["baseline/reward/rm/mean"],
        "rm/ppo_mean": ppo["reward/rm/mean"],
        "rm/grpo_mean": grpo["reward/rm/mean"],
        "rm/accuracy": rm_rows[-1]["eval/accuracy"],
        "kl/final": ppo_rows[-1]["kl/mean"],
        "ppo/reward_first": ppo_rows[0].get("reward/mean"),
        "ppo/reward_last": ppo_rows[-1].get("reward/mean"),
        "grpo/reward_first": grpo_rows[0]["reward/mean"],
        "grpo/reward_last": grpo_rows[-1]["reward/mean"],
        **_held_out_end("ppo", ppo_rows),
        **_held_out_end("ppo_no_kl", _read_jsonl(out / "ppo_no_kl" / "metrics.jsonl")),
        **labels,
        "seconds": total,
        **{f"time/{name}_s": value for name, value in seconds.items()},
        "methods": methods,
        "environment": environment(),  # the same seed gives other figures on other CPU kernels
    }
    from rlhf.answering import json_safe  # here: it imports torch

    return json_safe(summary)


def compare_methods(
    out: Path, results: Mapping[str, Mapping[str, Any]], seconds: Mapping[str, float]
) -> dict[str, dict[str, Any]]:
    """Each method of `METHODS` on the same held-out prompts under the gold judge: its gold mean with a 95 %
    interval, its win rate against SFT with a 95 % Wilson interval, the KL of its answers from the SFT
    reference, its own wall time and what it needs beyond the SFT model. All read from ``eval/``."""
    sft_rows = _read_jsonl(out / "eval" / "ppo_samples.jsonl")  # every eval samples the same SFT baseline
    table: dict[str, dict[str, Any]] = {
        "sft": {
            **_gold(row["baseline_rewards"]["gold"] for row in sft_rows),
            "win_rate": None,
            "win_rate_ci95": None,
            "kl": 0.0,
            "kl_is_bound": False,
            "seconds": seconds.get("sft"),
            "needs": "demonstrations",
        }
    }
    for name in METHODS[1:]:
        result = results[name]
        rows = _read_jsonl(out / "eval" / f"{name}_samples.jsonl")
        best_of = name == "best_of_n"
        successes = result["wins"] + 0.5 * result["ties"]
        table[name] = {
            **_gold(row["rewards"]["gold"] for row in rows),
            "win_rate": result["win_rate"],
            "win_rate_ci95": wilson_interval(successes, result["compared"]),
            "kl": result["kl/best_of_n_bound" if best_of else "kl/mean"],
            "kl_is_bound": best_of,
            # best-of-N's own cost is sampling N answers per prompt and scoring them: its eval's policy phase
            "seconds": result["time/policy_s"] if best_of else seconds.get(name),
            "needs": "reward model" if name != "dpo" else "preference labels",
        }
        if best_of:
            table[name]["n"] = result["best_of/n"]
            table[name]["samples"] = result["best_of/n"] * result["num_prompts"]
    return table


def _gold(scores: Iterable[float | None]) -> dict[str, Any]:
    """Mean gold score with the half-width of its 95 % interval (normal approximation, sample std / √n)."""
    values = [v for v in scores if v is not None]
    n = len(values)
    half = 1.959963984540054 * statistics.stdev(values) / math.sqrt(n) if n > 1 else math.nan
    return {"gold_mean": statistics.fmean(values) if values else math.nan, "gold_ci95": half, "prompts": n}


def _held_out_end(name: str, rows: list[dict[str, Any]]) -> dict[str, float]:
    """The run's last held-out eval (gold and reward-model means) and its last KL, from its metrics rows."""
    last_eval = [row for row in rows if "eval/reward/gold/mean" in row][-1]
    return {
        f"{name}/held_out_gold_last": last_eval["eval/reward/gold/mean"],
        f"{name}/held_out_rm_last": last_eval["eval/reward/rm/mean"],
        f"{name}/kl_last": rows[-1]["kl/mean"],
    }


# ---------------------------------------------------------------------------------------------------------------
# Plumbing
# ---------------------------------------------------------------------------------------------------------------


def _config(run_dir: Path, command: str, values: Mapping[str, Any]) -> Any:
    """The checked config of `command`, also written as ``run_dir/<command>.yaml`` (``rlhf <command> --config``)."""
    cfg = config_from_dict(command, values)
    rundir.atomic_write_text(run_dir / f"{command}.yaml", config_to_yaml(cfg))
    return cfg


def _announce(config: DemoConfig, text: str) -> None:
    if not config.progress:
        return
    from rich.console import Console

    label = f"stage {STAGES.index(text) + 1}/{len(STAGES)}: {text}" if text in STAGES else text
    Console(stderr=True).rule(f"[bold]demo · {label}")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]
