"""``rlhf demo``: the whole RLHF pipeline on the advice task (`rlhf.demo.task`), offline, on a CPU; what it shows and
measures: the README's opening section.

Each stage of `STAGES` (numbered and explained in `_stages`) runs in its own directory under ``output_dir``, the
trainers through their public runners, each config written beside it as ``<command>.yaml``. ``summary.json`` is
computed from those outputs only (`summarize`, its ``methods`` table `compare_methods`); ``report.html``
(`rlhf.report.demo`) from the same files (``rlhf report OUTPUT_DIR`` rebuilds it)."""

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
from rlhf.report.runs import read_jsonl
from rlhf.runlog import rundir
from rlhf.runlog.seeding import environment

GOLD = "rlhf.demo.task:gold"
"""The gold judge as a reward source (module:function)."""

ENSEMBLE_OBJECTIVE = "uwo"
"""How the ``ppo_no_kl_ensemble`` stage combines the reward models (``reward.ensemble.objective``): measured over
the demo's bases in docs/ensembles.md."""

MAX_LENGTH = 128
"""``data.max_length`` of sft, rm and dpo: the tiny model's positions, so every example is trained on whole
(docs/ppo_study.md, finding 1); batches pad to their own longest row, so the room costs nothing."""


@dataclasses.dataclass(frozen=True)
class Preset:
    """Sizes of one demo preset; every stage reads its numbers from here. The defaults are the ``small`` preset: a
    few CPU minutes, enough for PPO to beat SFT under the gold judge."""

    hidden_size: int = 128
    num_layers: int = 2
    vocab_size: int = 512
    pretrain_steps: int = 400
    pretrain_batch: int = 32
    corpus_size: int = 4000
    """Lines of the pretraining corpus (prompt + response, every quality equally often)."""
    sft_examples: int = 960
    sft_epochs: int = 2
    sample_prompts: int = 192
    """How many training prompts the SFT model answers for the preference pairs (at most all of them)."""
    num_samples: int = 8
    rm_epochs: int = 3
    """Epochs of each reward model, 32 prompts a step (18 steps; docs/rankings.md)."""
    rm_micro_size: int = 64
    """Answers per forward/backward of the reward models (8 prompts of 8): one reward model on seed 0's labels (`rlhf
    rm --rm.ensemble 1`) peaked at 585 MB RSS in 13.5 s, against 950 MB in 15.5 s for the 256 answers of a step in
    one pass."""
    rm_members: int = 4
    """Members of the reward-model ensemble (`rlhf rm --rm.ensemble`); member 0 is the demo's one reward model."""
    ppo_steps: int = 60
    ppo_batch: int = 32
    grpo_steps: int = 40
    grpo_batch: int = 4
    group_size: int = 8
    max_new_tokens: int = 24
    eval_prompts: int = 48
    eval_every: int = 10
    """PPO/GRPO answer the held-out prompts every this many steps (``samples/``, ``eval/reward/*``)."""
    learning_rate: float = 3e-4
    """GRPO's learning rate (one update per rollout)."""
    ppo_learning_rate: float = 1e-4
    """PPO's: it takes 8 updates per rollout (4 epochs × 2 minibatches); at 3e-4 it over-optimised the reward
    model in one of two measured seeds' worlds (gold score peaking mid-run, then falling), at 1e-4 in neither."""
    kl_coef: float = 0.2
    dpo_epochs: int = 1
    dpo_batch: int = 4
    """Prompts per DPO step, each with its 8 answers and their pairs (docs/rankings.md): 48 steps an epoch."""
    dpo_learning_rate: float = 1e-3
    """DPO's: one epoch over the reward model's labels. On seed 0's labels (docs/rankings.md) 4 prompts a step at 1e-3
    reach the held-out loss and accuracy that 32 pairs a step at 3e-4 reached when DPO trained pair by pair (0.404 and
    0.814 against 0.407 and 0.815); at 3e-4, 4 or 8 prompts a step stayed near the reference (0.58, 0.64)."""
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
            rm_members=2,
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
        "small": Preset(),  # the defaults: a few CPU minutes
    }
)
"""Preset name → sizes (`DemoConfig.preset`)."""

STAGES = ("pretrain", "sft", "sample", "label", "rm", "dpo", "ppo", "ppo_no_kl", "ppo_no_kl_ensemble", "grpo", "eval")

METHODS = ("sft", "best_of_n", "dpo", "ppo", "grpo")
"""The methods the demo compares on equal labels, in the order of its table."""

ENTRIES = (*STAGES, "data", "summary.json", "report.html")
"""What a demo writes into its output_dir: a directory holding any of them is a demo (refused without
``overwrite``, and exactly these are removed with it)."""


def run(config: DemoConfig) -> dict[str, Any]:
    """Run every stage into ``config.output_dir`` (locked for the whole demo; a previous demo there is refused, or
    removed before the first stage with ``overwrite``); returns the summary (also written to summary.json)."""
    with rundir.claim(config, entries=ENTRIES) as out:
        if config.overwrite:
            rundir.clear_run(out, ENTRIES)
        return _stages(config, out)


class _Script:
    """The demo's state between its stages: the settings every stage shares, each stage's seconds and the
    ``paths`` the earlier stages wrote (a trained stage's final/ under its name)."""

    def __init__(self, config: DemoConfig, out: Path):
        self.config, self.out, self.preset = config, out, PRESETS[config.preset]
        self.data = out / "data"
        self.seconds: dict[str, float] = {}
        self.paths: dict[str, Path] = {}
        self.quiet = {"seed": config.seed, "progress": config.progress}
        self.run = self.quiet | {"eval_every": 0, "save_every": 0}
        self.sampling = {"max_new_tokens": self.preset.max_new_tokens, "temperature": 1.0}

    def stage(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Stage ``name``: ``fn(*args)``, announced and timed."""
        _announce(self.config, name)
        t0 = time.perf_counter()
        result = fn(*args)
        self.seconds[name] = time.perf_counter() - t0
        return result

    def trained(
        self,
        name: str,
        model: str,
        section: dict,
        data: dict,
        optim: dict,
        batch_size: int = 32,
        micro_size: int | None = None,
        **fields: Any,
    ):
        """Stage ``name``: its command's trainer, started from ``paths[model]``; its final/ into ``paths[name]``."""
        from rlhf.trainers import dpo, reward_model, sft  # here: they load torch
        from rlhf.trainers.rl import grpo, ppo

        command = name.partition("_")[0]
        values = {"output_dir": str(self.out / name), "model": {"name": str(self.paths[model])}, "data": data}
        batch = {"size": batch_size, "micro_size": micro_size}
        values |= {"optim": optim, "batch": batch, "run": self.run, command: section, **fields}
        cfg = _config(self.out / name, command, values)
        runner = {"sft": sft, "rm": reward_model, "dpo": dpo, "ppo": ppo, "grpo": grpo}[command]
        self.paths[name] = self.stage(name, runner.run, cfg)

    def rl(
        self, name: str, learning_rate: float, kl_coef: float, batch_size: int, ensemble: bool = False, **algorithm: Any
    ) -> None:
        """Stage ``name`` (ppo or grpo) from the SFT model against the reward model (``ensemble``: against the whole
        ensemble by `ENSEMBLE_OBJECTIVE`); the gold judge rides along with weight 0 (logged, never optimised), so the
        report can set the proxy reward and the true score side by side, and so does the ensemble beside one reward
        model (its members' disagreement, ``reward/ensemble/ensemble_std``, is the doctor's label-free warning)."""
        ensemble_source = str(self.paths["rm_ensemble"])
        rewards = [{"source": ensemble_source if ensemble else str(self.paths["rm"]), "name": "rm"}]
        rewards.append({"source": GOLD, "name": "gold", "weight": 0.0})
        if not ensemble:
            rewards.append({"source": ensemble_source, "name": "ensemble", "weight": 0.0})
        data = {"train": str(self.data / "prompts.jsonl"), "eval": str(self.data / "eval_prompts.jsonl")}
        reward = {"source": rewards, "ensemble": {"objective": ENSEMBLE_OBJECTIVE}}
        fields = {"reward": reward, "sampling": self.sampling, "run": self.run | {"eval_every": self.preset.eval_every}}
        optim = {"learning_rate": learning_rate, "scheduler": "constant"}
        self.trained(name, "sft", algorithm, data, optim, batch_size, kl={"coef": kl_coef}, **fields)


def _stages(config: DemoConfig, out: Path) -> dict[str, Any]:
    """The demo's script: its numbered stages in order, each timed, sharing the paths earlier ones wrote."""
    from rlhf import evaluate, report, sample  # here: they load torch

    script, preset, start = _Script(config, out), PRESETS[config.preset], time.perf_counter()
    train_prompts, eval_prompts = task.split_prompts(config.seed)
    # 1. tokenizer + tiny Llama pretrained on the corpus
    script.paths["pretrain"] = script.stage("pretrain", pretrain, out / "pretrain", train_prompts, preset, config)
    # 2. SFT on mixed-quality demonstrations, mostly unhelpful ones (`Preset.sft_mix`)
    sft_data = _write_data(script, train_prompts, eval_prompts)
    script.trained("sft", "pretrain", {"epochs": preset.sft_epochs}, sft_data, {"learning_rate": 3e-3})
    # 3. k candidates per prompt from the SFT model (training prompts, and held-out ones for the RM's eval pairs)
    samples = _sample_configs(script)
    script.stage("sample", lambda: [sample.run(cfg) for cfg in samples])
    # 4. the gold judge ranks each prompt's candidates as a noisy rater would (Plackett–Luce); the held-out pairs get
    # the noiseless rule
    labelled = out / "label"
    labels = script.stage("label", label, out / "sample", labelled, config.seed)
    # 5. reward models from the pretrained LM, an ensemble differing by seed; they only ever see the labels
    pairs = {"train": str(labelled / "preferences.jsonl"), "eval": str(labelled / "eval_preferences.jsonl")}
    pairs["max_length"] = MAX_LENGTH
    rm = {"epochs": preset.rm_epochs, "ensemble": preset.rm_members}
    # every member normalised on the same answers of the SFT model (PPO's and GRPO's start): mean 0, std 1 there, so
    # the ensemble's objectives compare members on one scale (docs/ensembles.md)
    normalize = {"policy": str(script.paths["sft"]), "max_new_tokens": preset.max_new_tokens}
    rm_optim, rm_micro = {"learning_rate": 1e-3}, preset.rm_micro_size
    script.trained("rm", "pretrain", rm, pairs, rm_optim, micro_size=rm_micro, normalize=normalize)
    script.paths["rm_ensemble"], script.paths["rm"] = script.paths["rm"], script.paths["rm"] / "member_0"
    # 5b. DPO from the SFT model on the same labelled pairs: no reward model, no sampling
    dpo = {"epochs": preset.dpo_epochs}
    script.trained("dpo", "sft", dpo, pairs, {"learning_rate": preset.dpo_learning_rate}, preset.dpo_batch)
    # 6-7. PPO and GRPO from the SFT model against the reward model (`_Script.rl`)
    ppo_algorithm = {"steps": config.steps or preset.ppo_steps, "num_minibatches": 2, "epochs": 4}
    script.rl("ppo", preset.ppo_learning_rate, preset.kl_coef, preset.ppo_batch, **ppo_algorithm)
    # PPO without the KL leash (β = 0): the reward model gets exploited, and the gold monitor shows it. It keeps the
    # shared critic, whose value loss also moves the policy's trunk: with the default separate critic a β = 0 run drifts
    # too slowly to show it within the demo (docs/ppo_study.md, finding 2 and its row "shared_critic").
    script.rl("ppo_no_kl", preset.ppo_learning_rate, 0.0, preset.ppo_batch, **ppo_algorithm, critic="shared")
    # The same unleashed run against the ensemble, optimised conservatively (docs/ensembles.md)
    no_kl = {**ppo_algorithm, "critic": "shared", "ensemble": True}
    script.rl("ppo_no_kl_ensemble", preset.ppo_learning_rate, 0.0, preset.ppo_batch, **no_kl)
    grpo = {"steps": config.steps or preset.grpo_steps, "group_size": preset.group_size}
    script.rl("grpo", preset.learning_rate, preset.kl_coef, preset.grpo_batch, **grpo)
    # 8. every method against the SFT baseline (best-of-N samples the SFT model itself: its KL is the log N bound)
    evals = _eval_configs(script)
    results = script.stage("eval", lambda: {name: evaluate.run(cfg) for name, cfg in evals.items()})
    summary = summarize(out, results, labels, script.seconds, time.perf_counter() - start)
    rundir.atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    page = report.write(out)
    _announce(config, f"done in {summary['seconds']:.0f} s → {out / 'summary.json'}, {page}")
    return summary


def _write_data(script: _Script, train_prompts: list[str], eval_prompts: list[str]) -> dict[str, Any]:
    """The prompt files of the later stages and SFT's demonstrations; returns SFT's data section."""
    preset, data = script.preset, script.data
    for name, prompts in (
        ("prompts", train_prompts),
        ("eval_prompts", eval_prompts[: preset.eval_prompts]),
        ("sample_prompts", train_prompts[: preset.sample_prompts]),
        ("rm_eval_prompts", eval_prompts[preset.eval_prompts :] or eval_prompts),
    ):
        _write_jsonl(data / f"{name}.jsonl", [{"prompt": p} for p in prompts])
    rng = random.Random(script.config.seed)
    mix = dict(preset.sft_mix)
    _write_jsonl(data / "sft.jsonl", task.demonstrations(train_prompts, mix, preset.sft_examples, rng))
    _write_jsonl(data / "sft_eval.jsonl", task.demonstrations(eval_prompts, mix, 64, rng))
    return {"train": str(data / "sft.jsonl"), "eval": str(data / "sft_eval.jsonl"), "max_length": MAX_LENGTH}


def _sample_configs(script: _Script) -> list[Any]:
    """`rlhf sample`'s configs of stage 3: candidates for the training prompts and for the RM's held-out ones."""
    out = script.out
    candidates = {"mode": "candidates", "num_samples": script.preset.num_samples, "batch_size": 16}
    candidates |= {"sampling": script.sampling, **script.quiet, "model": {"name": str(script.paths["sft"])}}
    configs = []
    for name, prompts in (("candidates", "sample_prompts"), ("eval_candidates", "rm_eval_prompts")):
        files = {"prompts": str(script.data / f"{prompts}.jsonl"), "output": str(out / "sample" / f"{name}.jsonl")}
        configs.append(_config(out / "sample" / name, "sample", candidates | files))
    return configs


def _eval_configs(script: _Script) -> dict[str, Any]:
    """`rlhf eval`'s configs of stage 8 by method: each against the SFT baseline under the gold judge."""
    sft_model, rm, eval_dir = str(script.paths["sft"]), str(script.paths["rm"]), script.out / "eval"
    judged = script.quiet | {
        "baseline": sft_model,
        "eval_data": str(script.data / "eval_prompts.jsonl"),
        "reward": {"source": [{"source": GOLD, "name": "gold"}, {"source": rm, "name": "rm"}]},
        "judge": {"source": GOLD},
        "sampling": script.sampling,
    }
    evals = {}
    for name in METHODS[1:]:
        best_of = {"model": {"name": sft_model}, "best_of": {"n": script.preset.best_of_n, "source": rm}}
        compared = (
            best_of if name == "best_of_n" else {"model": {"name": str(script.paths[name])}, "reference": sft_model}
        )
        files = {"output": str(eval_dir / f"{name}.json"), "samples_output": str(eval_dir / f"{name}_samples.jsonl")}
        evals[name] = _config(eval_dir / name, "eval", judged | compared | files)
    return evals


# Stages that are the demo's own
def pretrain(out: Path, train_prompts: list[str], preset: Preset, config: DemoConfig) -> Path:
    """Tokenizer + tiny Llama trained with next-token loss on the corpus; returns ``out/final``. The corpus holds
    every quality of response equally often (a pretrained LM has seen all kinds of text); each line is prompt +
    response + eos, the layout SFT and generation use."""
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


LABEL_KINDS = ("ranking", "pairs")
"""How the demo's rater labels a prompt's candidates (`label`): one ranking (the default; benchmarks/demo_labels.py
measures both) or every pair on its own."""


def label(sample_dir: Path, out: Path, seed: int, kind: str = "ranking") -> dict[str, float]:
    """Label each prompt's candidates; returns label statistics. Training labels are a noisy rater's: with ``kind``
    ``ranking`` one Plackett–Luce ranking of the prompt's distinct answers (`task.gold_ranking`), with ``pairs`` a
    Bradley–Terry label of every pair on its own (`task.gold_label`; a pair of equal text or gold score is skipped).
    Held-out labels are the noiseless gold preference of every pair of unequal gold score (so the reward model's
    held-out accuracy is its agreement with the truth). Empty responses are left out."""
    if kind not in LABEL_KINDS:
        raise ValueError(f"demo: label kind {kind!r}, expected one of {LABEL_KINDS}")
    rng = random.Random(seed + 2)
    stats: dict[str, float] = {}
    for source, target, split in (
        ("candidates.jsonl", "preferences.jsonl", "train"),
        ("eval_candidates.jsonl", "eval_preferences.jsonl", "eval"),
    ):
        rows, margins = [], []  # margins: gold(preferred) − gold(other) of every pair the labels imply
        for record in read_jsonl(sample_dir / source):
            prompt, completions = record["prompt"], record["completions"]
            if split == "train" and kind == "ranking":
                row = task.gold_ranking(prompt, completions, rng)
                if len(row["ranking"]) < 2:
                    continue
                scores = [task.gold_score(prompt, row["completions"][i]) for i in row["ranking"]]
                margins += [scores[i] - scores[j] for i, j in itertools.combinations(range(len(scores)), 2)]
                rows.append(row)
                continue
            for a, b in itertools.combinations(completions, 2):
                score_a, score_b = task.gold_score(prompt, a), task.gold_score(prompt, b)
                if a == b or score_a == score_b or not a.strip() or not b.strip():
                    continue
                if split == "train":
                    row = task.gold_label((prompt, a, b), rng)
                else:
                    better, worse = (a, b) if score_a > score_b else (b, a)
                    row = {"prompt": prompt, "chosen": better, "rejected": worse, "gold_margin": abs(score_a - score_b)}
                margins.append(row["gold_margin"])
                rows.append(row)
        if not rows:
            raise RuntimeError(
                f"demo: no labels from {sample_dir / source}: every pair of candidates tied; use a larger preset"
            )
        _write_jsonl(out / target, rows)
        stats[f"label/{split}_pairs"] = len(margins)
        stats[f"label/{split}_rankings"] = sum("ranking" in row for row in rows)
        # of the pairs whose gold scores differ, the share the labels order as the gold judge does
        decided = [m for m in margins if m != 0]
        stats[f"label/{split}_gold_agreement"] = sum(m > 0 for m in decided) / max(1, len(decided))
    return stats


def summarize(
    out: Path,
    results: Mapping[str, Mapping[str, Any]],
    labels: Mapping[str, float],
    seconds: Mapping[str, float],
    total: float,
) -> dict[str, Any]:
    """summary.json, from the stages' own outputs: the eval results, the rm and ppo/grpo metrics files."""
    rm_rows = [
        row for row in read_jsonl(out / "rm" / "members" / "member_0" / "metrics.jsonl") if "eval/accuracy" in row
    ]
    ensemble = json.loads((out / "rm" / "final" / "ensemble.json").read_text())["held_out_accuracy"]
    ppo_rows = [row for row in read_jsonl(out / "ppo" / "metrics.jsonl") if "kl/mean" in row]
    grpo_rows = [row for row in read_jsonl(out / "grpo" / "metrics.jsonl") if "reward/mean" in row]
    ppo, others = results["ppo"], ("grpo", "dpo", "best_of_n")  # PPO's win rate is gold/win_rate_vs_sft
    summary: dict[str, Any] = {
        "gold/sft_mean": ppo["baseline/reward/gold/mean"],
        **{f"gold/{name}_mean": results[name]["reward/gold/mean"] for name in ("ppo", *others)},
        "gold/win_rate_vs_sft": ppo["win_rate"],
        **{f"gold/{name}_win_rate_vs_sft": results[name]["win_rate"] for name in others},
        "rm/sft_mean": ppo["baseline/reward/rm/mean"],
        **{f"rm/{name}_mean": results[name]["reward/rm/mean"] for name in ("ppo", "grpo")},
        "rm/accuracy": rm_rows[-1]["eval/accuracy"],
        **{f"rm/ensemble_accuracy_{objective}": ensemble[objective] for objective in ("mean", "wco")},
        "kl/final": ppo_rows[-1]["kl/mean"],
        "ppo/reward_first": ppo_rows[0].get("reward/mean"),
        "ppo/reward_last": ppo_rows[-1].get("reward/mean"),
        "grpo/reward_first": grpo_rows[0]["reward/mean"],
        "grpo/reward_last": grpo_rows[-1]["reward/mean"],
        **_held_out_end("ppo", ppo_rows),
        **_held_out_end("ppo_no_kl", read_jsonl(out / "ppo_no_kl" / "metrics.jsonl")),
        **_held_out_end("ppo_no_kl_ensemble", read_jsonl(out / "ppo_no_kl_ensemble" / "metrics.jsonl")),
        **labels,
        "seconds": total,
        **{f"time/{name}_s": value for name, value in seconds.items()},
        "methods": compare_methods(out, results, seconds),
        "environment": environment(),  # the same seed gives other figures on other CPU kernels
    }
    from rlhf.answering import json_safe  # here: it imports torch

    return json_safe(summary)


def compare_methods(
    out: Path, results: Mapping[str, Mapping[str, Any]], seconds: Mapping[str, float]
) -> dict[str, dict[str, Any]]:
    """Each method of `METHODS` on the held-out prompts, read from ``eval/``: gold mean ± 95 % interval, win rate
    against SFT [95 % Wilson interval], KL from the SFT reference, own wall time, what it needs beyond SFT."""
    sft_rows = read_jsonl(out / "eval" / "ppo_samples.jsonl")  # every eval samples the same SFT baseline
    sft = {"win_rate": None, "win_rate_ci95": None, "kl": 0.0, "kl_is_bound": False, "seconds": seconds.get("sft")}
    table = {"sft": {**_gold(row["baseline_rewards"]["gold"] for row in sft_rows), **sft, "needs": "demonstrations"}}
    for name in METHODS[1:]:
        result = results[name]
        rows = read_jsonl(out / "eval" / f"{name}_samples.jsonl")
        best_of = name == "best_of_n"
        table[name] = {
            **_gold(row["rewards"]["gold"] for row in rows),
            "win_rate": result["win_rate"],
            "win_rate_ci95": wilson_interval(result["wins"] + 0.5 * result["ties"], result["compared"]),
            "kl": result["kl/best_of_n_bound" if best_of else "kl/mean"],
            "kl_is_bound": best_of,
            # best-of-N's own cost is sampling N answers per prompt and scoring them: its eval's policy phase
            "seconds": result["time/policy_s"] if best_of else seconds.get(name),
            "needs": "reward model" if name != "dpo" else "preference labels",
        }
        if best_of:
            table[name] |= {"n": result["best_of/n"], "samples": result["best_of/n"] * result["num_prompts"]}
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


# Plumbing
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
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
