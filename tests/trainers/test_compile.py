"""``compile: true``: the transformer blocks run through torch.compile and training gives the eager run's model.

One eager and one compiled PPO run of the same config (one rollout in 2 minibatches, so the no-grad old-log-prob
pass and the training forward are different compiled graphs); then a GRPO run with LoRA, whose reference is the
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

from configs import nested
from rlhf.config import config_from_dict
from rlhf.models.loading import apply_lora, check_compiler, compile_blocks
from rlhf.models.tiny import toy_corpus
from rlhf.trainers.rl import grpo, ppo

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
def test_compiled_ppo_trains_the_same_model_as_eager(tiny_llama_dir, prompts, tmp_path, clipped_gradients, adam_steps):
    # one rollout, two minibatches: the no-grad old-log-prob pass and the training forward are separate graphs
    def run(name: str, compile_: bool) -> tuple[Path, list[dict[str, torch.Tensor]]]:
        config = config_from_dict("ppo", nested({
            "model.name": str(tiny_llama_dir), "reward.source": f"{REWARDS}:length_chars", "data.train": str(prompts),
            "output_dir": str(tmp_path / name), "ppo.steps": 1, "batch.size": 8, "sampling.max_new_tokens": 8,
            "sampling.temperature": 1.0, "optim.learning_rate": 1e-3, "optim.scheduler": "constant", "ppo.epochs": 1,
            "ppo.num_minibatches": 2, "run.eval_every": 0, "run.save_every": 0, "run.progress": False, "model.compile": compile_,
        }))  # fmt: skip
        final = ppo.run(config)
        grads = list(clipped_gradients)
        clipped_gradients.clear()
        size = len(names)  # the policy's parameters, then the value head's weight and bias
        return final, [dict(zip(names, grads[i : i + size], strict=True)) for i in range(0, len(grads), size)]

    initial = load_file(tiny_llama_dir / "model.safetensors")
    names = [name for name, _ in AutoModelForCausalLM.from_pretrained(tiny_llama_dir).named_parameters()]
    hidden = initial["model.embed_tokens.weight"].shape[1]
    initial |= {"value.linear.weight": torch.zeros(1, hidden), "value.linear.bias": torch.zeros(1)}
    names += ["value.linear.weight", "value.linear.bias"]
    (eager, eager_grads), (compiled, compiled_grads) = run("eager", False), run("compiled", True)
    (a,), (b,) = rows(tmp_path / "eager"), rows(tmp_path / "compiled")
    assert b["policy/first_ratio_max_dev"] == 0.0  # no-grad and training graphs agree bit for bit
    assert b["reward/mean"] == a["reward/mean"]  # the same samples: sampling runs the model's eager decoder
    # the first minibatch's gradient, at the same weights: inductor's fused kernels sum float32 terms in
    # another order, a few ulp of partial sums (|g| ≤ 1)
    assert len(eager_grads) == len(compiled_grads) == 2
    for name, g in eager_grads[0].items():
        torch.testing.assert_close(compiled_grads[0][name], g, rtol=1e-4, atol=1e-6)
    # each run's weights are exactly its two clipped AdamW steps
    for out, grads in ((eager, eager_grads), (compiled, compiled_grads)):
        predicted, tolerance = adam_steps(initial, grads, [1e-3, 1e-3], 1.0)
        final = load_file(out / "model.safetensors")
        final |= {f"value.{k}": v for k, v in load_file(out / "value_head.safetensors").items()}
        for name in names:
            assert ((final[name] - predicted[name]).abs() <= tolerance[name]).all(), (out.parent.name, name)


@pytest.mark.slow
@needs_compiler
def test_compiled_grpo_with_lora_runs(tiny_llama_dir, prompts, tmp_path):
    config = config_from_dict("grpo", nested({
        "model.name": str(tiny_llama_dir), "reward.source": f"{REWARDS}:length_chars", "data.train": str(prompts),
        "output_dir": str(tmp_path), "grpo.steps": 2, "batch.size": 2, "grpo.group_size": 4, "sampling.max_new_tokens": 8,
        "kl.coef": 0.1, "model.lora": {"r": 4}, "run.eval_every": 0, "run.save_every": 0, "run.progress": False, "model.compile": True,
    }))  # fmt: skip
    grpo.run(config)
    for row in rows(tmp_path):
        assert all(math.isfinite(row[k]) for k in ("reward/mean", "kl/mean", "policy/loss", "grad/norm"))
