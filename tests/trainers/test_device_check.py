"""Every command on a (fake) CUDA GPU: the runs of the other tests' configs, under ``fake_gpu`` (tests/fake_cuda.py),
so that a CPU tensor meeting a GPU one fails here with CUDA's own error instead of on the first GPU run.

Each run is as short as its command allows (1-2 steps) and switches on what it can of the options that put
tensors somewhere; what it checks is that it finishes, having computed on the device. The fake GPU supports
bfloat16, so runs are in mixed precision unless they set ``model.bf16: false`` (some do, for the float32 path).
The first tests check the checker: what CUDA refuses is refused, what CUDA allows is allowed.
"""

# ruff: noqa: F811 - prompts_file and pairs, imported from test_grpo.py and test_dpo.py, are fixtures the tests take
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from test_dpo import data as pairs  # noqa: F401 (a fixture: preference pairs, train and eval)
from test_grpo import local as grpo_reward
from test_grpo import make_config as grpo_config
from test_grpo import prompts_file  # noqa: F401 (a fixture: 40 prompts, every other one flagged constant)
from test_multi_turn import make_config as episode_config
from test_ppo import make_config as ppo_config
from test_ppo import reward as ppo_reward
from test_reward_model import write_jsonl
from test_sft import LORA, questions

from configs import nested
from episode_envs import WORDS
from fake_cuda import MIXED, FakeCudaTensor, fake_cuda, to_fake
from rlhf import evaluate, sample
from rlhf.config import config_from_dict
from rlhf.trainers import dpo, reward_model, sft
from rlhf.trainers.rl import grpo, ppo
from runs import finite, train_rows
from test_sample_eval import eval_config, judge, sample_config

# --------------------------------------------------------------------------------------------------------------
# The checker
# --------------------------------------------------------------------------------------------------------------


def test_mixing_a_gpu_tensor_and_a_cpu_tensor_raises_what_cuda_raises():
    with fake_cuda():
        gpu, cpu = torch.ones(3, device="cuda"), torch.ones(3)
        assert gpu.device == torch.device("cuda", 0) and gpu.is_cuda and not gpu.is_cpu
        for op in (
            lambda: gpu + cpu,
            lambda: cpu * gpu,
            lambda: torch.cat([gpu, cpu]),
            lambda: torch.where(gpu > 0, cpu, gpu),
            lambda: gpu.masked_fill(cpu > 0, 0.0),
            lambda: torch.nn.functional.linear(gpu, torch.ones(2, 3)),
            lambda: torch.ones(4, 3)[torch.tensor([0, 1], device="cuda")],  # GPU indices of a CPU tensor
            lambda: cpu + gpu.sum(),  # a 0-dim GPU tensor is no scalar to a CPU op
        ):
            with pytest.raises(RuntimeError, match=MIXED):
                op()


def test_what_cuda_allows_across_devices_is_allowed():
    with fake_cuda():
        gpu = torch.arange(4.0, device="cuda")
        assert isinstance(gpu * torch.tensor(2.0), FakeCudaTensor)  # a 0-dim CPU tensor is a scalar
        assert gpu[torch.tensor([0, 2])].tolist() == [0.0, 2.0]  # CPU indices
        assert gpu[torch.tensor([True, False, True, False])].tolist() == [0.0, 2.0]
        gpu[torch.tensor([1])] = 5.0
        cpu = torch.zeros(4)
        cpu.copy_(gpu)  # copies cross devices
        assert not isinstance(cpu, FakeCudaTensor) and cpu.tolist() == [0.0, 5.0, 2.0, 3.0]
        assert gpu.cpu().device.type == "cpu" and gpu.to("cuda") is gpu
        assert torch.zeros_like(cpu, device="cuda").device.type == "cuda"


def test_generators_belong_to_a_device():
    with fake_cuda():
        gpu_generator, cpu_generator = torch.Generator("cuda").manual_seed(0), torch.Generator().manual_seed(0)
        assert gpu_generator.device.type == "cuda"
        torch.rand(3, device="cuda", generator=gpu_generator)
        torch.multinomial(torch.ones(2, 3, device="cuda"), 1, generator=gpu_generator)
        with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator but found 'cpu'"):
            torch.rand(3, device="cuda", generator=cpu_generator)
        with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator but found 'cpu'"):
            torch.ones(3, device="cuda").uniform_(generator=cpu_generator)
        with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'cuda'"):
            torch.multinomial(torch.ones(2, 3), 1, generator=gpu_generator)
        # CUDA's global generator is its own: drawing on the GPU leaves the CPU's alone
        state = torch.get_rng_state()
        torch.rand(3, device="cuda")
        assert torch.equal(torch.get_rng_state(), state)


def test_a_module_moves_trains_copies_saves_and_comes_back(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    is_available = torch.cuda.is_available
    with fake_cuda() as gpu:
        model.to(gpu.device)
        assert all(isinstance(p, FakeCudaTensor) and isinstance(p, torch.nn.Parameter) for p in model.parameters())
        before = [p.detach().cpu() for p in model.parameters()]
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        model(torch.ones(2, 3, device="cuda")).sum().backward()
        assert all(p.grad.device == gpu.device for p in model.parameters())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        assert all(not torch.equal(p.detach().cpu(), b) for p, b in zip(model.parameters(), before, strict=True))
        with pytest.raises(RuntimeError, match=MIXED):
            model(torch.ones(2, 3))

        twin = copy.deepcopy(model)
        assert all(p.device == gpu.device and isinstance(p, torch.nn.Parameter) for p in twin.parameters())
        torch.save(model.state_dict(), tmp_path / "state.pt")  # saved as CPU tensors, loaded onto the device
        twin.load_state_dict(torch.load(tmp_path / "state.pt", map_location="cpu"))
        assert torch.equal(twin[0].weight.cpu(), model[0].weight.cpu())
        twin[0].weight.data = torch.zeros(4, 3, device="cuda")  # what nn.Module.to does to a parameter in place
        assert twin[0].weight.abs().sum().item() == 0

        model.to(torch.float64)
        assert model[0].weight.dtype == torch.float64 and model[0].weight.device == gpu.device
        model.cpu()
        assert all(type(p) is torch.nn.Parameter for p in model.parameters())
        assert gpu.ops > 0
    # all as it was outside; a fake tensor works there too
    assert torch.cuda.is_available is is_available and torch.Generator is torch._C.Generator
    assert torch.equal(to_fake(torch.ones(2)) * 2, to_fake(torch.full((2,), 2.0)))


# --------------------------------------------------------------------------------------------------------------
# The commands
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def few_prompts(prompts_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 6 prompts: sample and eval run them in a batch of 4 and one of 2."""
    path = tmp_path_factory.mktemp("device_few") / "prompts.jsonl"
    path.write_text("".join(prompts_file.read_text().splitlines(keepends=True)[:6]))
    return path


# the variants of the loss, the KL, the critic and batching, and both sampling engines
@pytest.mark.parametrize(
    "overrides",
    [
        {"ppo.critic": "shared", "batch.micro_size": 2, "kl.add_to": "loss", "kl.control": "adaptive",
         "ppo.loss_type": "sapo", "ppo.importance_sampling_level": "sequence_token", "ppo.top_entropy_quantile": 0.5,
         "reward.missing_eos_penalty": 0.5, "ppo.critic_warmup_steps": 1},
        {"ppo.critic": "separate", "model.lora": LORA, "batch.micro_tokens": 40, "kl.estimator": "k3",
         "ppo.whiten_rewards": True, "ppo.score_position": "eos", "ppo.off_policy_mask_threshold": 1e-4,
         "sampling.engine": "hf", "sampling.top_k": 5, "sampling.top_p": 0.9},
        {"ppo.num_minibatches": 1, "model.gradient_checkpointing": True, "kl.reference_ema": 0.5,
         "ppo.loss_type": "cispo", "ppo.importance_sampling_level": "sequence", "run.eval_every": 1,
         "model.bf16": False},
    ],
    ids=["shared-micro", "separate-lora-hf", "fused"],
)  # fmt: skip
def test_ppo(tiny_llama_dir, prompts_file, tmp_path, fake_gpu, overrides):
    out = tmp_path / "run"
    ppo.run(ppo_config(tiny_llama_dir, prompts_file, out, **overrides))
    rows = train_rows(out)
    assert len(rows) == 2 and finite(rows[-1], ["policy/loss", "value/loss", "kl/mean"])
    assert fake_gpu.ops > 1000


def test_ppo_with_reward_models(tiny_llama_dir, tiny_reward_model_dir, tiny_reward_model_other_tokenizer_dir, prompts_file,
                                tmp_path, fake_gpu):  # fmt: skip
    rewards = [
        {"source": str(tiny_reward_model_dir), "weight": 1.0},
        {"source": str(tiny_reward_model_other_tokenizer_dir), "weight": 0.5},
        {"source": ppo_reward("length_chars"), "weight": 0.0},
    ]
    out = tmp_path / "run"
    ppo.run(ppo_config(tiny_llama_dir, prompts_file, out, **{"reward.source": rewards, "ppo.critic": "separate"}))
    assert all(finite(row, ["policy/loss", "value/loss", "reward/mean"]) for row in train_rows(out))


def test_grpo(tiny_llama_dir, prompts_file, tmp_path, fake_gpu):
    out = tmp_path / "run"
    rewards = [{"source": grpo_reward("half_constant"), "name": "half"}, {"source": ppo_reward("length_chars")}]
    fields = {"reward.source": rewards, "reward.aggregation": "gdpo", "grpo.estimator": "rloo",
              "grpo.loss_type": "dr_grpo", "grpo.dynamic_sampling": True, "grpo.num_iterations": 2,
              "grpo.mask_truncated_completions": True, "grpo.overlong_buffer": 2, "kl.coef": 0.1,
              "batch.micro_size": 4, "model.bf16": False, "grpo.steps": 1, "run.save_every": 1}  # fmt: skip
    grpo.run(grpo_config(tiny_llama_dir, prompts_file, out, **fields))
    # and resumed from its checkpoint: the optimizer's state and the generators come back onto the device
    grpo.run(grpo_config(tiny_llama_dir, prompts_file, out, **fields | {"grpo.steps": 2, "run.resume": True}))
    assert [row["step"] for row in train_rows(out)] == [1, 2]
    assert all(finite(row, ["policy/loss", "kl/mean"]) for row in train_rows(out))


def test_grpo_with_the_static_decode_loop(tiny_llama_dir, prompts_file, tmp_path, fake_gpu, monkeypatch):
    """sampling.cuda_graphs on the device, in mixed precision: the static loop's buffers, counters and uniforms all
    on it (the capture itself needs a real GPU: its step runs as is; tests/rollout/test_decoder.py checks the
    capture's protocol)."""
    from rlhf.rollout.engine import StaticDecode

    captures = []
    monkeypatch.setattr(StaticDecode, "_captured", lambda self: captures.append(self) or self.step)
    fields = {"sampling.cuda_graphs": True, "sampling.top_p": 0.9, "grpo.steps": 1, "batch.micro_size": 4}
    grpo.run(grpo_config(tiny_llama_dir, prompts_file, tmp_path / "run", **fields))
    assert captures and all(finite(row, ["policy/loss"]) for row in train_rows(tmp_path / "run"))


def test_sft(tiny_llama_dir, tmp_path, fake_gpu):
    data = write_jsonl(tmp_path / "sft.jsonl", questions(24))
    values = {"model.name": str(tiny_llama_dir), "data.train": str(data), "output_dir": str(tmp_path / "run"),
              "batch.size": 8, "data.max_length": 64, "run.eval_every": 2, "run.save_every": 0,
              "run.progress": False, "model.lora": LORA, "sft.packing": True}  # fmt: skip
    sft.run(config_from_dict("sft", nested(values)))
    assert fake_gpu.ops > 0


def pair_values(model: Path, pairs: dict[str, Path], out: Path) -> dict:
    return {"model.name": str(model), "data.train": str(pairs["train"]), "data.eval": str(pairs["eval"]),
            "output_dir": str(out), "batch.size": 8, "run.eval_every": 1, "run.save_every": 0,
            "run.progress": False}  # fmt: skip


def test_reward_model(tiny_llama_dir, pairs, few_prompts, tmp_path, fake_gpu):
    # and its normalisation: the policy's samples scored by the trained reward model
    values = pair_values(tiny_llama_dir, pairs, tmp_path / "run") | {
        "rm.center_rewards_coefficient": 0.01, "normalize.policy": str(tiny_llama_dir),
        "normalize.prompts": str(few_prompts), "normalize.samples": 4, "normalize.max_new_tokens": 4,
    }  # fmt: skip
    reward_model.run(config_from_dict("rm", nested(values)))
    assert fake_gpu.ops > 0


def test_a_reward_model_ensemble(tiny_llama_dir, pairs, prompts_file, tmp_path, fake_gpu):
    """`rm.ensemble 2` trained on the device, then PPO optimising its members' worst case with a critic started
    from the first member: the members score on the device and their spread is logged."""
    values = pair_values(tiny_llama_dir, pairs, tmp_path / "rm") | {"rm.ensemble": 2}
    ensemble = reward_model.run(config_from_dict("rm", nested(values)))
    fields = {"reward.source": str(ensemble), "reward.ensemble.objective": "wco", "ppo.critic": "separate"}
    ppo.run(ppo_config(tiny_llama_dir, prompts_file, tmp_path / "run", **fields))
    rows = train_rows(tmp_path / "run")
    assert rows and all(finite(row, ["policy/loss", "value/loss", "reward/final/ensemble_std"]) for row in rows)


@pytest.mark.parametrize("loss", ["sigmoid", "simpo"])
def test_dpo(tiny_qwen2_dir, pairs, tmp_path, fake_gpu, loss):
    values = pair_values(tiny_qwen2_dir, pairs, tmp_path / "run") | {"dpo.loss": loss, "model.lora": LORA}
    values |= {"model.bf16": False} if loss == "simpo" else {}  # float32 on the GPU too (bfloat16 is its default)
    dpo.run(config_from_dict("dpo", nested(values)))
    assert fake_gpu.ops > 0


def test_sample(tiny_llama_dir, tiny_reward_model_dir, few_prompts, tmp_path, fake_gpu):
    out = tmp_path / "best.jsonl"
    judged = {"judge.source": str(tiny_reward_model_dir)}
    sample.run(sample_config(tiny_llama_dir, few_prompts, out, mode="best_of_n", **judged))
    assert len(out.read_text().splitlines()) == 6 and fake_gpu.ops > 0


@pytest.mark.parametrize("best_of", [False, True], ids=["reference-baseline", "best-of-n"])
def test_eval(tiny_llama_dir, tiny_gpt2_dir, tiny_reward_model_dir, tiny_reward_model_other_tokenizer_dir, few_prompts,
              fake_gpu, best_of):  # fmt: skip
    fields = {"reward.source": str(tiny_reward_model_other_tokenizer_dir), "judge.source": judge("length")}
    if best_of:
        fields |= {"best_of.n": 2, "best_of.source": str(tiny_reward_model_dir)}
    else:
        fields |= {"reference": str(tiny_llama_dir)}
    results = evaluate.run(eval_config(tiny_llama_dir, few_prompts, baseline=str(tiny_gpt2_dir), **fields))
    assert results["num_prompts"] == 6 and fake_gpu.ops > 0
    assert best_of or results["kl/mean"] == 0.0


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_episodes(chat_policy, tmp_path, fake_gpu, command):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "x", "word": i % len(WORDS)} for i in range(8)])
    out = tmp_path / "run"
    config = episode_config(command, chat_policy, prompts, out, **{f"{command}.steps": 1})
    (grpo if command == "grpo" else ppo).run(config)
    assert finite(train_rows(out)[0], ["policy/loss", "episode/turns_mean"])
