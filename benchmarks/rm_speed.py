"""Reward-model training on a demo's labels: `rlhf rm` (a prompt's answers forwarded once) against TRL's
`RewardTrainer` (both answers of every pair forwarded), on the same tokens, model, batch and schedule.

    make demo                                   # runs/demo: the labels and the pretrained tiny model
    python benchmarks/rm_speed.py --demo runs/demo
    python benchmarks/rm_speed.py --bases runs/demo_figures   # held-out accuracy only, over tools/demo_figures.py's bases

Rows, each in its own process, one after another (run it on an idle machine):
- ``rlhf rm``: ``batch.size`` 32 prompts (the demo's: each with its 8 answers and their pairs), passes of 64 answers;
- TRL ``RewardTrainer``, float32 and no gradient checkpointing: 32 pairs a step (pairwise: its unit), like for like;
- TRL ``RewardTrainer`` with its own defaults for ``bf16`` and ``gradient_checkpointing`` (both on, even on a CPU).
All: the demo's pretrained model with a one-output head, 3 epochs, AdamW at lr 1e-3 decaying linearly, no warm-up,
gradient clipping at 1.0, seed 0, the pairs tokenised once by rlhf (prompt ids + answer ids + eos) and handed to
TRL as its processed ``chosen_ids``/``rejected_ids`` columns. Held-out accuracy is measured the same way for every
row: each saved model scores the demo's gold-labelled held-out pairs (strict, r_chosen > r_rejected). Writes
``results/rm_speed.json`` and ``results/rm_speed.md``. With ``--bases``, `rlhf rm` and TRL in float32 on every base
(one thread each, timings not kept: the machine may be busy), their held-out accuracies: ``results/rm_speed_bases.*``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EPOCHS, LEARNING_RATE, PAIRS_PER_STEP, PROMPTS_PER_STEP, ANSWERS_PER_PASS = 3, 1e-3, 32, 32, 64


def pairs_of(path: Path, model: Path) -> list:
    """The pairs of ``path`` tokenised as `rlhf rm` reads them for ``model``."""
    from rlhf.models.reward import load_reward_model, tokenize_pairs

    return tokenize_pairs(str(path), load_reward_model(str(model)), max_length=128)


def held_out_accuracy(final: Path, demo: Path) -> float:
    """Strict accuracy of the model saved in ``final`` on the demo's held-out pairs, scored at the last real token."""
    import torch

    from rlhf.data import collate_preferences
    from rlhf.models.reward import load_reward_model, reward_scores

    rm = load_reward_model(str(final))
    pairs = pairs_of(demo / "label" / "eval_preferences.jsonl", final)
    correct = 0
    with torch.no_grad():
        for start in range(0, len(pairs), 64):
            batch = collate_preferences(pairs[start : start + 64], rm.tokenizer.pad_token_id)
            chosen = reward_scores(rm.model, batch.chosen_input_ids, batch.chosen_attention_mask)
            rejected = reward_scores(rm.model, batch.rejected_input_ids, batch.rejected_attention_mask)
            correct += int((chosen > rejected).sum())
    return correct / len(pairs)


def our_flags(demo: Path, out: Path) -> list[str]:
    """`rlhf rm`'s flags for the demo's labels into ``out``."""
    return ["--model.name", str(demo / "pretrain" / "final"), "--data.train", str(demo / "label" / "preferences.jsonl"),
            "--data.max_length", "128", "--output_dir", str(out), "--batch.size", str(PROMPTS_PER_STEP),
            "--batch.micro_size", str(ANSWERS_PER_PASS), "--rm.epochs", str(EPOCHS), "--optim.learning_rate",
            str(LEARNING_RATE), "--run.eval_every", "0", "--run.save_every", "0", "--run.no-progress",
            "--run.overwrite"]  # fmt: skip


def run_ours(demo: Path, out: Path) -> float:
    """`rlhf rm` on the demo's labels; returns its training seconds (from its metrics: the steps' own times)."""
    command = [sys.executable, "-m", "rlhf", "rm", *our_flags(demo, out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return sum(row.get("time/step_s", 0.0) for row in rows)


def run_trl(demo: Path, out: Path, defaults: bool) -> float:
    """TRL's RewardTrainer in this process (``--child``); returns the seconds of ``trainer.train()``."""
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    model_dir = demo / "pretrain" / "final"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    pairs = pairs_of(demo / "label" / "preferences.jsonl", model_dir)
    data = Dataset.from_list(
        [{"chosen_ids": p.prompt_ids + p.chosen_ids, "rejected_ids": p.prompt_ids + p.rejected_ids} for p in pairs]
    )
    precision = {} if defaults else {"bf16": False, "gradient_checkpointing": False}
    args = RewardConfig(
        output_dir=str(out), per_device_train_batch_size=PAIRS_PER_STEP, num_train_epochs=EPOCHS,
        learning_rate=LEARNING_RATE, lr_scheduler_type="linear", warmup_steps=0, max_grad_norm=1.0, seed=0,
        max_length=None, report_to=[], save_strategy="no", eval_strategy="no", logging_steps=50, use_cpu=True,
        **precision,
    )  # fmt: skip
    trainer = RewardTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(str(out / "final"))
    tokenizer.save_pretrained(out / "final")
    return seconds


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", type=Path, default=Path("runs/demo"))
    parser.add_argument("--work", type=Path, default=HERE / ".work" / "rm_speed")
    parser.add_argument("--child", choices=["trl", "trl_defaults"], help=argparse.SUPPRESS)
    parser.add_argument("--bases", type=Path, help="accuracy over every demo directory under this one")
    args = parser.parse_args()
    if args.bases:
        return over_bases(args.bases, args.work)
    if args.child:  # one TRL row, in its own process
        seconds = run_trl(args.demo, args.work / args.child, defaults=args.child == "trl_defaults")
        (args.work / args.child / "seconds.json").write_text(json.dumps({"train_s": seconds}))
        return
    rows = []
    ours = args.work / "rlhf"
    wall = timed([sys.executable, "-c", "import sys; sys.exit(0)"])  # the interpreter's own start, subtracted below
    start = time.perf_counter()
    train_s = run_ours(args.demo, ours)
    rows.append({"row": "rlhf rm (a prompt's answers once)", "unit": f"{PROMPTS_PER_STEP} prompts",
                 "wall_s": time.perf_counter() - start - wall, "train_s": train_s,
                 "accuracy": held_out_accuracy(ours / "final", args.demo)})  # fmt: skip
    for child, name in (("trl", "TRL RewardTrainer, float32"), ("trl_defaults", "TRL RewardTrainer, its defaults")):
        command = [sys.executable, __file__, "--demo", str(args.demo), "--work", str(args.work), "--child", child]
        total = timed(command) - wall
        seconds = json.loads((args.work / child / "seconds.json").read_text())["train_s"]
        rows.append({"row": name, "unit": f"{PAIRS_PER_STEP} pairs", "wall_s": total, "train_s": seconds,
                     "accuracy": held_out_accuracy(args.work / child / "final", args.demo)})  # fmt: skip
    write(rows, args.demo)


def over_bases(bases: Path, work: Path) -> None:
    """Held-out accuracy of `rlhf rm` and of TRL in float32 on each base under ``bases`` (one thread each)."""
    import os
    import statistics

    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    accuracy: dict[str, dict[str, float]] = {}
    for demo in sorted(p.parent for p in bases.glob("*/summary.json")):
        out, kernel = work / demo.name, demo.name.partition("_seed_")[0]
        run_env = env | ({"ATEN_CPU_CAPABILITY": kernel} if kernel != "default" else {})
        if not (out / "rlhf" / "final").is_dir():
            command = [sys.executable, "-m", "rlhf", "rm", *our_flags(demo, out / "rlhf")]
            subprocess.run(command, check=True, env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not (out / "trl" / "final").is_dir():
            command = [sys.executable, __file__, "--demo", str(demo), "--work", str(out), "--child", "trl"]
            subprocess.run(command, check=True, env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        accuracy[demo.name] = {row: held_out_accuracy(out / row / "final", demo) for row in ("rlhf", "trl")}
        print(demo.name, accuracy[demo.name], file=sys.stderr)
    (HERE / "results" / "rm_speed_bases.json").write_text(json.dumps(accuracy, indent=1) + "\n")
    lines = [f"`python benchmarks/rm_speed.py --bases {bases}`: held-out accuracy on each base's gold pairs, "
             f"{EPOCHS} epochs, lr {LEARNING_RATE:g}, one thread per run.", "",
             "| trainer | mean ± sd | worst | best | bases where it is at least TRL's |", "|---|---|---|---|---|"]  # fmt: skip
    for row, name in (("rlhf", f"rlhf rm, {PROMPTS_PER_STEP} prompts a step"), ("trl", "TRL RewardTrainer, float32")):
        values = [a[row] for a in accuracy.values()]
        ahead = sum(a[row] >= a["trl"] for a in accuracy.values())
        lines.append(f"| {name} | {statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f} | "
                     f"{min(values):.3f} | {max(values):.3f} | {ahead} of {len(values)} |")  # fmt: skip
    lines += ["", "| base | rlhf rm | TRL |", "|---|---|---|"]
    lines += [f"| {name} | {a['rlhf']:.3f} | {a['trl']:.3f} |" for name, a in accuracy.items()]
    (HERE / "results" / "rm_speed_bases.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def write(rows: list[dict], demo: Path) -> None:
    import trl

    from rlhf.runlog.seeding import environment

    env = environment() | {"trl": trl.__version__}
    (HERE / "results" / "rm_speed.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1) + "\n")
    base = rows[0]["train_s"]
    lines = [
        f"`python benchmarks/rm_speed.py --demo {demo}` on {env['cpu']} ({env['threads']} threads), torch "
        f"{env['torch']}, trl {env['trl']}: the demo's labels, {EPOCHS} epochs, lr {LEARNING_RATE:g}.",
        "",
        "| trainer | a step | wall (process) | training | × rlhf rm's training | held-out accuracy |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['row']} | {row['unit']} | {row['wall_s']:.1f} s | {row['train_s']:.1f} s | "
            f"{row['train_s'] / base:.1f}× | {row['accuracy']:.3f} |"
        )
    (HERE / "results" / "rm_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
