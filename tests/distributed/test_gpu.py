"""The CUDA path of torchrun runs: NCCL, one GPU per rank (``LOCAL_RANK``). Skipped without 2 GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torchrun_runs import assert_same_gradients, assert_same_metrics, run, torchrun

from rlhf.models.tiny import toy_corpus

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

REWARDS = Path(__file__).resolve().parents[1] / "trainers" / "ppo_rewards.py"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_ppo_on_two_gpus_equals_one_gpu(tiny_llama_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(line.split()[:4])}) + "\n"
                               for line in toy_corpus(24, seed=6)))  # fmt: skip
    config = {"model.name": str(tiny_llama_dir), "reward.source": f"{REWARDS}:length_chars", "data.train": str(prompts),
              "ppo.steps": 3, "batch.size": 8, "sampling.max_new_tokens": 8, "optim.learning_rate": 1e-3, "ppo.epochs": 2,
              "ppo.num_minibatches": 2, "run.eval_every": 0, "run.save_every": 0, "run.progress": False}  # fmt: skip
    one_rows, one_grads = run("ppo", config, tmp_path / "one", gpus=True)
    two_rows, two_grads = run("ppo", config, tmp_path / "two", torchrun(), gpus=True)
    assert_same_gradients(one_grads, two_grads)
    assert_same_metrics(one_rows, two_rows)
