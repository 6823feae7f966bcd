"""One benchmark run of TRL in its own process, inside a peer venv: ``python child_trl.py SPEC RESULT``.

Imports only torch, transformers, datasets and trl (never rlhf). SPEC carries the model directories, the
prompts file and the shared settings (see ``run.py``); RESULT has the same shape as ``child_ours.py``'s:
per-step records and the process's peak RSS.

Timing: a TrainerCallback takes the wall clock at ``on_train_begin`` and at every ``on_step_end``; a step is
the time between two of them. Generated tokens are counted by wrapping the policy's ``generate`` (a
counter around the call, nothing else changes).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from procmem import peak_rss_mb


def count_generated(model, stop_ids: list[int], tally: dict) -> None:
    """Wrap ``model.generate`` to add each call's generated tokens to ``tally["tokens"]``.

    A row's tokens run up to and including its first stop token (all columns when ``stop_ids`` is empty:
    TRL's PPO with ``stop_token=None`` trains on every generated column).
    """
    import torch

    original = model.generate

    def generate(*args, **kwargs):
        out = original(*args, **kwargs)
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        new = sequences[:, kwargs["input_ids"].shape[1] :]
        lengths = torch.full((new.shape[0],), new.shape[1])
        if stop_ids:
            is_stop = torch.isin(new, torch.tensor(stop_ids, device=new.device)).cpu()
            first = is_stop.int().argmax(-1) + 1
            lengths = torch.where(is_stop.any(-1), first, lengths)
        tally["tokens"] += int(lengths.sum())
        return out

    model.generate = generate


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    import datasets
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

    after_import = peak_rss_mb()
    sequences = spec["batch_size"] * spec.get("group_size", 1)
    steps: list[dict] = []
    tally = {"tokens": 0}

    class StepTimer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            steps.append({"step_s": now - self.last, "sequences": sequences, "gen_tokens": tally["tokens"]})
            tally["tokens"], self.last = 0, now

    f32 = {"dtype": torch.float32}
    tokenizer = AutoTokenizer.from_pretrained(spec["policy"], padding_side="left")
    policy = AutoModelForCausalLM.from_pretrained(spec["policy"], **f32)
    reward = AutoModelForSequenceClassification.from_pretrained(spec["reward"], num_labels=1, **f32)
    prompts = [json.loads(line)["prompt"] for line in Path(spec["prompts"]).read_text().splitlines()]
    # Everything that would add work outside the algorithm is off: mixed precision (bf16 is TRL's default; off
    # unless the spec asks, as gpu_acceptance.py does on a GPU), gradient checkpointing (TRL's default; it re-runs
    # forwards), checkpoints, reporting, progress bars. The device is the CPU unless the spec names another.
    common = {
        "output_dir": spec["output_dir"],
        "learning_rate": spec["learning_rate"],
        "temperature": spec["temperature"],
        "seed": spec["seed"],
        "gradient_accumulation_steps": 1,
        "bf16": spec.get("bf16", False),
        "fp16": False,
        "use_cpu": spec.get("device", "cpu") == "cpu",
        "gradient_checkpointing": False,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "logging_steps": 1,
    }
    if spec["algo"] == "ppo":
        from trl.experimental.ppo import PPOConfig, PPOTrainer

        B = spec["batch_size"]
        data = datasets.Dataset.from_dict({"prompt": prompts}).map(
            lambda row: {"input_ids": tokenizer(row["prompt"])["input_ids"]}, remove_columns=["prompt"]
        )
        args = PPOConfig(
            **common,
            per_device_train_batch_size=B,
            num_mini_batches=1,
            num_ppo_epochs=spec["epochs"],
            total_episodes=spec["steps"] * B,
            response_length=spec["max_new_tokens"],
            stop_token=None,  # generate every column: the same work whether or not EOS comes up
            kl_coef=spec["kl_coef"],
            local_rollout_forward_batch_size=B,
            num_sample_generations=0,  # no sample generations during the timed run
        )
        trainer = PPOTrainer(
            args=args,
            processing_class=tokenizer,
            model=policy,
            ref_model=AutoModelForCausalLM.from_pretrained(spec["policy"], **f32),
            reward_model=reward,
            train_dataset=data,
            # TRL's recipe: the value model starts from the reward model
            value_model=AutoModelForSequenceClassification.from_pretrained(spec["reward"], num_labels=1, **f32),
            eval_dataset=data,
            callbacks=[StepTimer()],
        )
        stop_ids: list[int] = []
    else:
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(
            **common,
            per_device_train_batch_size=sequences,
            num_generations=spec["group_size"],
            max_completion_length=spec["max_new_tokens"],
            num_iterations=1,
            beta=spec["kl_coef"],
            max_steps=spec["steps"],
            use_vllm=False,
            log_completions=False,
        )
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=reward,
            args=args,
            train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
            reward_processing_classes=tokenizer,
            callbacks=[StepTimer()],
        )
        stop_ids = [tokenizer.eos_token_id]
    count_generated(policy, stop_ids, tally)
    trainer.train()
    result = {
        "steps": steps,
        "peak_rss_mb": peak_rss_mb(),
        "rss_after_import_mb": after_import,
        "threads": torch.get_num_threads(),
        # what TRL actually ran with, to check against the settings above
        "trl_args": {
            "bf16": args.bf16,
            "gradient_checkpointing": args.gradient_checkpointing,
            "optim": str(args.optim),
            "device": str(trainer.accelerator.device),
        },
        "versions": {
            "trl": trl.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "datasets": datasets.__version__,
        },
    }
    Path(sys.argv[2]).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
