"""``compile: true``: the transformer blocks run through torch.compile and training gives the eager run's model.

One eager and one compiled PPO run of the same config (2 steps, 2 minibatches, so the no-grad old-log-prob pass
and the training forward are different compiled graphs); then a GRPO run with LoRA, whose reference is the
compiled policy with its adapter switched off. Compiling the tiny model takes ~20 s the first time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlhf.config import config_from_dict
from rlhf.models.loading import apply_lora, check_compiler, compile_blocks
from rlhf.models.tiny import toy_corpus
from rlhf.trainers import grpo, ppo

REWARDS = Path(__file__).resolve().parent / "ppo_rewards.py"


def _has_compiler() -> bool:
    try:
        check_compiler(torch.device("cpu"))
    except RuntimeError:
        return False
    return True


needs_compiler = pytest.mark.skipif(not _has_compiler(), reason="torch.compile on CPU needs g++ or clang++")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compile_prompts") / "prompts.jsonl"
    rows = [{"prompt": " ".join(line.split()[:3])} for line in toy_corpus(20, seed=3)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def rows(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row for row in lines if "reward/mean" in row]


def compiled_blocks(model: torch.nn.Module) -> int:
    return sum(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def test_blocks_are_found_in_each_architecture(tiny_llama_dir, tiny_gpt2_dir):
    from rlhf.config import LoRAConfig

    for directory, expected in ((tiny_llama_dir, "layers"), (tiny_gpt2_dir, "h")):
        model = AutoModelForCausalLM.from_pretrained(directory)
        blocks = getattr(model.base_model, expected)
        assert compile_blocks(model) == len(blocks) == compiled_blocks(model)
    lora = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), LoRAConfig(r=2))
    assert compile_blocks(lora) == 2 == compiled_blocks(lora)
    with pytest.raises(ValueError, match="no list of transformer blocks"):
        compile_blocks(torch.nn.Linear(2, 2))


def test_a_missing_cpu_compiler_is_named_before_training(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(RuntimeError, match="C\\+\\+ compiler"):
        check_compiler(torch.device("cpu"))


@pytest.mark.slow
@needs_compiler
def test_compiled_ppo_trains_the_same_model_as_eager(tiny_llama_dir, prompts, tmp_path):
    def run(name: str, compile_: bool) -> Path:
        config = config_from_dict("ppo", {
            "policy": str(tiny_llama_dir), "reward": f"{REWARDS}:length_chars", "train_data": str(prompts),
            "output_dir": str(tmp_path / name), "steps": 2, "batch_size": 8, "max_new_tokens": 8,
            "temperature": 1.0, "learning_rate": 1e-3, "ppo_epochs": 2, "num_minibatches": 2,
            "eval_every": 0, "save_every": 0, "progress": False, "compile": compile_,
        })  # fmt: skip
        return ppo.run(config)

    eager, compiled = run("eager", False), run("compiled", True)
    for a, b in zip(rows(tmp_path / "eager"), rows(tmp_path / "compiled"), strict=True):
        assert b["policy/first_ratio_max_dev"] == 0.0  # no-grad and training graphs agree bit for bit
        for key in ("reward/mean", "kl/mean", "policy/loss", "value/loss", "grad/norm"):
            assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-6), key
    e, c = load_file(eager / "model.safetensors"), load_file(compiled / "model.safetensors")
    assert (
        max((e[k] - c[k]).abs().max().item() for k in e) < 1e-4
    )  # lr 1e-3 steps; fused kernels round differently


@pytest.mark.slow
@needs_compiler
def test_compiled_grpo_with_lora_runs(tiny_llama_dir, prompts, tmp_path):
    config = config_from_dict("grpo", {
        "policy": str(tiny_llama_dir), "reward": f"{REWARDS}:length_chars", "train_data": str(prompts),
        "output_dir": str(tmp_path), "steps": 2, "batch_size": 2, "group_size": 4, "max_new_tokens": 8,
        "kl_coef": 0.1, "lora": {"r": 4}, "eval_every": 0, "save_every": 0, "progress": False, "compile": True,
    })  # fmt: skip
    grpo.run(config)
    for row in rows(tmp_path):
        assert all(math.isfinite(row[k]) for k in ("reward/mean", "kl/mean", "policy/loss", "grad/norm"))
