"""`rlhf.planning` and `rlhf plan`: the plan's parts against hand counts on the tiny models, the cheapest fix,
and the trainers' refusal before any weight loads (and going on with ``run.ignore_memory_plan``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from configs import nested
from rlhf import cli, planning
from rlhf.config import ConfigError, config_from_dict
from rlhf.config.loading import with_flags
from rlhf.core.memory import GiB
from rlhf.models import sharding

BELOW_EVERY_PLAN_GIB = 0.0002
"""A budget that every run here is over, on any device: 0.2 MiB, below the float32 weights alone of the smallest
model these runs hold (the tiny llama as a reward model, 157k parameters × 4 B = 0.60 MiB). 0.01 GiB (10.2 MiB)
was over the plans on CPU only, where they count the process's RSS and 128 MiB of CPU workspace; on a GPU they count
neither, and these runs' peaks are 3-8 MiB."""

REFUSED = r"over the budget of 0\.00 GiB \(0\.0002 GiB per rank\)"


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan_prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"count to {i}:"}) + "\n" for i in range(8)))
    return path


def ppo_values(policy: Path, reward: Path, prompts: Path, out: Path) -> dict:
    return {
        "model.name": str(policy), "reward.source": str(reward), "data.train": str(prompts),
        "output_dir": str(out), "ppo.steps": 1, "batch.size": 4, "sampling.max_new_tokens": 6,
        "run.eval_every": 0, "run.save_every": 0, "run.progress": False,
    }  # fmt: skip


def test_model_sizes_count_what_the_model_holds(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sizes = planning.model_sizes(str(tiny_model_dir))
    assert sizes.params == sum(p.numel() for p in model.parameters())
    assert sizes.layers == model.config.num_hidden_layers and sizes.vocab == model.config.vocab_size
    assert sizes.gated == (model.config.model_type != "gpt2")


def test_lora_parameters_equal_peft_s(tiny_llama_dir):
    from rlhf.config import LoRAConfig
    from rlhf.models.loading import apply_lora, load_causal_lm

    lora = LoRAConfig(r=4)
    model = apply_lora(load_causal_lm(str(tiny_llama_dir), "float32", "cpu"), lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert planning.lora_params(str(tiny_llama_dir), lora) == trainable


def test_ppo_parts_by_hand(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path):
    config = config_from_dict("ppo", nested(ppo_values(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path)))
    policy = planning.model_sizes(str(tiny_llama_dir))
    reward = planning.model_sizes(str(tiny_reward_model_dir), reward=True)
    predicted = planning.plan(config, positions=20, runtime=1000)
    resident = predicted.resident
    assert resident["runtime"] == 1000
    assert resident["policy weights"] == resident["reference weights"] == policy.params * 4
    assert resident["reward model weights"] == reward.params * 4
    # critic auto with a reward model: separate, started from it; AdamW's two moments of policy + critic
    assert resident["critic weights"] == reward.params * 4
    assert resident["optimizer state"] == 2 * (policy.params + reward.params) * 4
    assert predicted.phases["rollout"]["KV cache"] == 2 * policy.layers * policy.kv_heads * policy.head_dim * 4 * 20 * 4
    assert predicted.phases["update"]["gradients"] == (policy.params + reward.params) * 4
    # CPU: every phase keeps what the earlier ones added
    assert predicted.total("update") == sum(resident.values()) + sum(sum(p.values()) for p in predicted.phases.values())
    gpu = planning.plan(config, positions=20, runtime=1000, retains=False)
    assert (
        resident["workspace (CPU libraries)"] == planning.WORKSPACE and "workspace (CPU libraries)" not in gpu.resident
    )
    assert gpu.total("update") == sum(gpu.resident.values()) + sum(gpu.phases["update"].values())

    # bf16 mixed precision (the default where the plan is for a GPU): float32 master weights and AdamW state, the
    # frozen reference and reward model in bfloat16, the KV cache in bfloat16, and autocast's bfloat16 copies of
    # the weights: of the trained ones for a no-grad forward, of every weight read in an update (saved for backward)
    assert (
        gpu.resident["policy weights"] == policy.params * 4
        and gpu.resident["optimizer state"] == resident["optimizer state"]
    )
    assert gpu.resident["reference weights"] == policy.params * 2
    assert gpu.resident["reward model weights"] == reward.params * 2
    assert gpu.phases["rollout"]["KV cache"] == predicted.phases["rollout"]["KV cache"] // 2
    assert gpu.phases["scoring"]["bfloat16 copies of the trained weights (autocast)"] == policy.params * 2
    assert gpu.phases["update"]["bfloat16 copies of the weights (autocast)"] == (policy.params + reward.params) * 2
    cpu_mixed = planning.plan(with_flags(config, ["--model.bf16=True"]), positions=20, runtime=1000)
    assert cpu_mixed.resident["reference weights"] == policy.params * 2
    gpu_float32 = planning.plan(with_flags(config, ["--model.bf16=False"]), positions=20, retains=False)
    assert gpu_float32.resident["reference weights"] == policy.params * 4
    assert "bfloat16 copies of the weights (autocast)" not in gpu_float32.phases["update"]
    # the lean decoder: a packed copy on CPU; on a GPU the policy's own weights, or a bfloat16 copy of float32 ones
    matmul = policy.matmul_params
    assert predicted.phases["rollout"]["packed weights (lean decoder)"] == matmul * 4
    assert gpu.phases["rollout"]["packed weights (lean decoder)"] == matmul * 2
    assert "packed weights (lean decoder)" not in gpu_float32.phases["rollout"]

    # FSDP over 2 ranks halves what is sharded and adds the gathered policy and a gathered layer
    fsdp = planning.plan(with_flags(config, ["--run.parallelism=fsdp"]), world_size=2, positions=20)
    assert fsdp.resident["policy weights"] == -(-policy.params * 4 // 2)
    assert fsdp.resident["optimizer state"] == -(-2 * (policy.params + reward.params) * 4 // 2)
    assert "gathered policy (fsdp)" in fsdp.phases["rollout"] and "full policy on rank 0 (fsdp)" in fsdp.phases["save"]
    # the gathers reuse one another's blocks: the largest counts, the other parts add up
    parts = [(name, size) for phase in ("rollout", "scoring", "update") for name, size in fsdp.phases[phase].items()]
    added = sum(size for name, size in parts if name not in planning.REUSED)
    gathered = max(size for name, size in parts if name in planning.REUSED)
    assert fsdp.total("update") == sum(fsdp.resident.values()) + added + gathered
    # the save runs after the last update, whose optimizer step gave the freed heap back: the resident and its own
    assert fsdp.total("save") == sum(fsdp.resident.values()) + fsdp.phases["save"]["full policy on rank 0 (fsdp)"]
    # DDP all-reduces through flat buckets: a second copy of the gradients
    ddp = planning.plan(config, world_size=2, positions=20)
    assert ddp.phases["update"]["gradient buckets (ddp)"] == ddp.phases["update"]["gradients"]
    # checkpointing lowers the update's activations only
    checkpointed = planning.plan(
        with_flags(config, ["--model.gradient_checkpointing=true"]), positions=20, runtime=1000
    )
    assert checkpointed.phases["update"]["activations"] < predicted.phases["update"]["activations"]
    assert checkpointed.resident == predicted.resident


def test_ppo_critic_as_the_trainer_builds_it_for_a_reward_model_with_another_tokenizer(
    tiny_llama_dir, tiny_reward_model_other_tokenizer_dir, prompts_file, tmp_path
):
    """A reward model whose tokenizer is not the policy's cannot start the critic (`rlhf.models.critic`): auto is
    the shared head, separate starts from the policy. The plan counted a critic started from the reward model."""
    values = ppo_values(tiny_llama_dir, tiny_reward_model_other_tokenizer_dir, prompts_file, tmp_path)
    policy = planning.model_sizes(str(tiny_llama_dir))
    auto = planning.plan(config_from_dict("ppo", nested(values)), positions=20, runtime=0)
    assert "critic weights" not in auto.resident and "critic activations" not in auto.phases["update"]
    assert auto.resident["optimizer state"] == 2 * (policy.params + policy.hidden + 1) * 4  # the shared value head
    assert "ppo.critic auto → shared (no reward model reads the policy's tokens)" in auto.notes
    separate = planning.plan(config_from_dict("ppo", nested(values | {"ppo.critic": "separate"})), positions=20)
    assert separate.resident["critic weights"] == policy.params * 4
    assert separate.resident["optimizer state"] == 2 * 2 * policy.params * 4


def test_the_sampling_worker_is_counted_at_k_above_0(
    tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path, monkeypatch
):
    """``sampling.max_staleness`` k > 0: the worker's own policy, reward model, sampling and scoring, and the trained
    weights handed to it, all in the CPU's memory; k = 0 plans as before (no worker)."""
    import torch

    from rlhf.runlog.distributed import Dist

    values = ppo_values(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path)
    asynchronous = {"sampling.max_staleness": 1, "sampling.is_correction": "token"}
    sync, k1 = (config_from_dict("ppo", nested(values | extra)) for extra in ({}, asynchronous))
    policy = planning.model_sizes(str(tiny_llama_dir))
    reward = planning.model_sizes(str(tiny_reward_model_dir), reward=True)
    # by hand, in float32 (4 B) on the CPU, with batch.size 4 (4 rows, one micro-batch) of 20 positions: the
    # worker's libraries and inputs (the trainer's runtime, 1000 B here, + the CPU workspace); its policy's and
    # reward model's weights; the KV cache, 2 × layers × kv_heads × head_dim values per row and position; the lean
    # decoder's packed copy of the policy's matrices; the reward model's forward, (4H + 2gd + 3I) values per row and
    # position; and k + 1 = 2 shared copies of the trained weights (all the policy's)
    kv = 2 * policy.layers * policy.kv_heads * policy.head_dim * 4 * 20 * 4
    forward = 4 * 20 * (4 * reward.hidden + 2 * reward.kv_heads * reward.head_dim + 3 * reward.intermediate) * 4
    weights = (policy.params + reward.params + policy.matmul_params) * 4
    worker = 1000 + planning.WORKSPACE + weights + kv + forward + 2 * policy.params * 4
    for retains in (True, False):
        before, after = (planning.plan(c, positions=20, runtime=1000, retains=retains) for c in (sync, k1))
        assert (
            before.worker == {} and sum(after.worker.values()) == worker
        )  # a GPU plan's worker too: float32, on the CPU
        assert after.resident == before.resident and after.phases == before.phases  # the trainer's own unchanged
        # on CPU every phase holds the worker too; beside a GPU its peak is the GPU's, the worker below the table
        assert [after.total(p) - before.total(p) for p in after.phases] == [worker if retains else 0] * 3
        assert "sampling worker: shared trained weights ×2" in planning.render(after)
        assert "sampling worker" not in planning.render(before)
    # with LoRA the trainer hands over the adapters only (float32), k + 1 = 3 copies of them at k = 2
    lora = with_flags(k1, ["--model.lora={r: 4}", "--sampling.max_staleness=2"])
    adapters = planning.lora_params(str(tiny_llama_dir), lora.model.lora)
    assert planning.plan(lora, positions=20).worker["sampling worker: shared trained weights ×3"] == 3 * adapters * 4
    # a vLLM server at k = 1 samples with memory of its own: the worker only pushes the weights to it (no KV cache,
    # no packed copy), and the trainer answers its held-out prompts with its own engine (the lean decoder's parts)
    server = {"sampling.engine": "vllm", "sampling.vllm.url": "http://127.0.0.1:1"}
    sync_server, k1_server = (
        planning.plan(config_from_dict("ppo", nested(values | server | extra)), positions=20, runtime=1000)
        for extra in ({}, asynchronous)
    )
    assert sum(k1_server.worker.values()) == worker - kv - policy.matmul_params * 4
    assert (
        sync_server.phases["rollout"] == {}
        and k1_server.phases["rollout"] == planning.plan(k1, positions=20).phases["rollout"] != {}
    )

    # beside a GPU a worker on the CPU is checked against the CPU's free memory (this process's RSS: 1000 B, above)
    gpu = Dist(device=torch.device("cuda"))
    config = with_flags(k1, ["--run.memory_budget_gib=100", "--sampling.worker_device=cpu"])
    monkeypatch.setattr(planning.device, "process_rss", lambda: 1000)
    monkeypatch.setattr(planning.device, "free_memory", lambda: (worker, "all of it"))
    assert planning.check(config, gpu, positions=20) is not None
    monkeypatch.setattr(planning.device, "free_memory", lambda: (worker // 2, "half of it"))
    with pytest.raises(ConfigError, match=r"sampling worker .* does NOT fit.*--sampling.max_staleness 0"):
        planning.check(config, gpu, positions=20)


def test_a_sampling_worker_on_a_gpu_is_counted_there(
    tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path, monkeypatch
):
    """``sampling.worker_device`` a GPU: the worker's models, sampling and scoring on it, in a one-process GPU run's
    dtypes; its libraries and inputs and the shared trained weights in the CPU's memory. On the trainer's GPU they
    are in every phase's total; on another GPU they are checked against that GPU; a CPU run is unchanged."""
    import torch

    from rlhf.runlog.distributed import Dist

    values = ppo_values(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path)
    asynchronous = {"sampling.max_staleness": 1, "sampling.is_correction": "token", "run.memory_budget_gib": 100}
    sync, k1 = (config_from_dict("ppo", nested(values | extra)) for extra in ({}, asynchronous))
    policy = planning.model_sizes(str(tiny_llama_dir))
    reward = planning.model_sizes(str(tiny_reward_model_dir), reward=True)
    # by hand, as test_the_sampling_worker_is_counted_at_k_above_0's, in mixed precision: the policy's float32
    # weights, the reward model's in bfloat16, and the KV cache, the lean decoder's bfloat16 copy of the policy's
    # matrices and the reward model's forward in bfloat16 (2 B)
    kv = 2 * policy.layers * policy.kv_heads * policy.head_dim * 4 * 20 * 2
    forward = 4 * 20 * (4 * reward.hidden + 2 * reward.kv_heads * reward.head_dim + 3 * reward.intermediate) * 2
    on_gpu = policy.params * 4 + reward.params * 2 + policy.matmul_params * 2 + kv + forward
    on_cpu = 1000 + planning.WORKSPACE + 2 * policy.params * 4

    monkeypatch.setattr(planning.device, "process_rss", lambda: 1000)
    monkeypatch.setattr(planning.device, "free_memory", lambda: (on_cpu, "all of it"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    trainer = torch.device("cuda", 0)
    assert planning.worker_place(k1, trainer) == ("trainer's GPU", trainer)  # auto: the only GPU, shared
    before = planning.plan(sync, positions=20, runtime=1000, retains=False)
    shared = planning.plan(k1, positions=20, runtime=1000, retains=False, worker_place="trainer's GPU")
    assert sum(shared.worker_gpu.values()) == on_gpu and sum(shared.worker.values()) == on_cpu
    assert [shared.total(p) - before.total(p) for p in before.phases] == [on_gpu] * 3
    assert "sampling worker: KV cache" in planning.render(shared).split("peak per phase")[0]  # a row of the table
    # the check: the GPU's budget between the two peaks refuses the run, naming the worker; the CPU's parts fit
    between = (before.peak + on_gpu // 2) / GiB
    assert planning.check(with_flags(sync, [f"--run.memory_budget_gib={between}"]), Dist(device=trainer), 20)
    with pytest.raises(ConfigError, match=r"sampling worker's 0\.\d+ GiB on this GPU .*--sampling.worker_device cpu"):
        planning.check(with_flags(k1, [f"--run.memory_budget_gib={between}"]), Dist(device=trainer), 20)
    assert planning.check(k1, Dist(device=trainer), 20) is not None
    monkeypatch.setattr(planning.device, "free_memory", lambda: (on_cpu - 1, "all but a byte"))
    with pytest.raises(ConfigError, match=r"takes .* GiB of the CPU's memory.*does NOT fit"):
        planning.check(k1, Dist(device=trainer), 20)

    # two GPUs: auto is the other one, checked against its own free memory; the trainer's peak as without a worker
    monkeypatch.setattr(planning.device, "free_memory", lambda: (on_cpu, "all of it"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    free = {1: on_gpu * 2}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free[torch.device(device).index], 2**40))
    second = torch.device("cuda", 1)
    assert planning.worker_place(k1, trainer) == ("another GPU", second)
    apart = planning.plan(k1, positions=20, runtime=1000, retains=False, worker_place="another GPU")
    assert apart.peak == before.peak and apart.apart == {"cpu": shared.worker, "gpu": shared.worker_gpu}
    assert "sampling worker, on another GPU (not in the peak)" in planning.render(apart)
    assert planning.check(k1, Dist(device=trainer), 20) is not None
    free[1] = on_gpu  # 90 % of it is usable
    with pytest.raises(ConfigError, match=r"of cuda:1; .* does NOT fit.*--sampling.worker_device.*max_staleness 0"):
        planning.check(k1, Dist(device=trainer), 20)
    text, fits = planning.report(k1, device=trainer)  # `rlhf plan` places the worker as the run would
    assert not fits and "does NOT fit" in text.split("what each change")[0] and "GiB of cuda:1" in text

    # a CPU run: the worker on the CPU in every phase's total, as before; cpu beside a GPU trainer: below the table
    cpu = torch.device("cpu")
    assert planning.worker_place(k1, cpu) == ("cpu", cpu)
    assert planning.worker_place(with_flags(k1, ["--sampling.worker_device=cpu"]), trainer)[0] == "cpu"
    on_cpu_run = planning.plan(k1, positions=20, runtime=1000)
    assert on_cpu_run.worker_gpu == {} and on_cpu_run.apart == {} and on_cpu_run.beside == on_cpu_run.worker


def test_cheapest_fix_is_the_first_that_fits(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path):
    values = ppo_values(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path) | {"batch.size": 16}
    config = config_from_dict("ppo", nested(values))
    full = planning.plan(config, positions=200)
    halved = planning.plan(with_flags(config, ["--batch.micro_size=8"]), positions=200)
    assert halved.peak < full.peak
    fix = planning.cheapest_fix(config, halved.peak, world_size=1, positions=200, runtime=0)
    assert fix is not None and fix.flags == ("--batch.micro_size=8",)
    assert planning.cheapest_fix(config, 1, world_size=1, positions=200, runtime=0) is None


def test_a_run_over_budget_is_refused_before_any_weight_loads(
    tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path, monkeypatch
):
    from rlhf.trainers.rl import ppo

    def no_loading(*args, **kwargs):
        raise AssertionError("a weight was loaded before the memory plan refused the run")

    monkeypatch.setattr(sharding, "load_causal_lm", no_loading)
    values = ppo_values(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path / "run")
    config = config_from_dict("ppo", nested(values | {"run.memory_budget_gib": BELOW_EVERY_PLAN_GIB}))
    with pytest.raises(ConfigError, match=rf"{REFUSED}.*(cheapest change|No change within reach)"):
        ppo.run(config)


def test_ignore_memory_plan_runs_anyway(tiny_llama_dir, prompts_file, tmp_path, capsys):
    from rlhf.trainers.rl import grpo

    values = {
        "model.name": str(tiny_llama_dir), "reward.source": f"{Path(__file__).parent / 'trainers' / 'ppo_rewards.py'}:length_chars",
        "data.train": str(prompts_file), "output_dir": str(tmp_path / "run"), "grpo.steps": 1, "batch.size": 2,
        "grpo.group_size": 2, "sampling.max_new_tokens": 4, "run.eval_every": 0, "run.save_every": 0,
        "run.progress": False, "run.memory_budget_gib": BELOW_EVERY_PLAN_GIB, "run.ignore_memory_plan": True,
    }  # fmt: skip
    final = grpo.run(config_from_dict("grpo", nested(values)))
    assert (final / "config.json").exists()
    err = capsys.readouterr().err
    assert "does NOT fit" in err and "going on anyway" in err and "peak per phase" in err


def test_rlhf_plan_command(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path, capsys):
    path = tmp_path / "ppo.yaml"
    path.write_text(yaml.safe_dump(nested(ppo_values(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path))))
    assert cli.main(["plan", "--config", str(path)]) == 0  # the trainer read from the ppo section
    out = capsys.readouterr().out
    for part in ("policy weights", "reference weights", "optimizer state", "KV cache", "activations", "fits"):
        assert part in out
    assert "--model.gradient_checkpointing=true" in out
    # a tiny budget: exit 3, the cheapest change named; torchrun's world size shards the plan
    assert cli.main(["plan", "--config", str(path), "--device_memory_gib", "0.001", "--world_size", "2"]) == 3
    assert "does NOT fit" in capsys.readouterr().out
    assert cli.main(["plan", "--help"]) == 0 and "--world_size" in capsys.readouterr().out
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump({"model": {"name": str(tiny_llama_dir)}}))
    assert cli.main(["plan", "--config", str(bare)]) == 2
    assert "--command" in capsys.readouterr().err


def test_sft_plan_reads_the_longest_example(tiny_llama_dir, tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": "count:", "response": " 1" * n}) + "\n" for n in (3, 9, 5)))
    config = config_from_dict("sft", {"model": {"name": str(tiny_llama_dir)}, "data": {"train": str(data)}, "output_dir": str(tmp_path / "o")})  # fmt: skip
    from rlhf.data import load_sft
    from rlhf.models.loading import load_tokenizer

    longest = max(len(e.input_ids) for e in load_sft(str(data), load_tokenizer(str(tiny_llama_dir)), 1024))
    assert planning.data_positions(config) == longest
    predicted = planning.plan(config, positions=longest)
    assert list(predicted.phases) == ["update"] and "logits" in predicted.phases["update"]
    assert predicted.peak < GiB


@pytest.mark.parametrize("command", ["sft", "dpo", "rm"])
def test_supervised_trainers_refuse_before_loading(command, tiny_llama_dir, tmp_path, monkeypatch):
    from rlhf.trainers import reward_model

    def no_loading(*args, **kwargs):
        raise AssertionError("a weight was loaded before the memory plan refused the run")

    shell = reward_model.load_reward_model

    def architecture_only(name, dtype="float32", device="cpu", *args):  # rm tokenizes its pairs with an empty model
        return shell(name, dtype, device, *args) if str(device) == "meta" else no_loading()

    monkeypatch.setattr(sharding, "load_causal_lm", no_loading)
    monkeypatch.setattr(reward_model, "load_reward_model", architecture_only)
    data = tmp_path / "data.jsonl"
    row = {"prompt": "count:", "response": " 1 2"} if command == "sft" else {"prompt": "count:", "chosen": " 1", "rejected": " 2"}  # fmt: skip
    data.write_text(json.dumps(row) + "\n")
    values = {"model": {"name": str(tiny_llama_dir)}, "data": {"train": str(data)}, "output_dir": str(tmp_path / "o"),
              "run": {"memory_budget_gib": BELOW_EVERY_PLAN_GIB, "progress": False}}  # fmt: skip
    trainer = {"sft": "rlhf.trainers.sft", "dpo": "rlhf.trainers.dpo", "rm": "rlhf.trainers.reward_model"}[command]
    with pytest.raises(ConfigError, match=REFUSED):
        __import__(trainer, fromlist=["run"]).run(config_from_dict(command, values))


def test_rm_plan_reads_pairs_as_the_model_does(tiny_llama_dir, tmp_path):
    from rlhf.models.reward import load_reward_model, tokenize_pairs

    data = tmp_path / "prefs.jsonl"
    rows = [{"prompt": "count:", "chosen": " 1" * n, "rejected": " 2"} for n in (2, 7)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = config_from_dict("rm", {"model": {"name": str(tiny_llama_dir)}, "data": {"train": str(data)}, "output_dir": str(tmp_path / "o")})  # fmt: skip
    pairs = tokenize_pairs(str(data), load_reward_model(str(tiny_llama_dir)), 1024)
    assert planning.data_positions(config) == max(len(p.prompt_ids) + len(p.chosen_ids) for p in pairs)


def test_rm_plan_counts_a_prompts_answers_once_and_suggests_micro_batches_of_answers(tiny_llama_dir, tmp_path):
    data = tmp_path / "ranked.jsonl"
    rows = [{"prompt": f"q{i}:", "completions": [f" {j}" * (j + 1) for j in range(5)], "ranking": [4, 3, 2, 1, 0]}
            for i in range(3)] + [{"prompt": "q:", "chosen": " a", "rejected": " b"}]  # fmt: skip
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    values = {"model": {"name": str(tiny_llama_dir)}, "data": {"train": str(data)}, "output_dir": str(tmp_path / "o")}
    config = config_from_dict("rm", values | {"batch": {"size": 3}})
    positions, answers = planning.data_shape(config)
    assert answers == 5  # the ranked prompts' five answers, not their ten pairs
    assert positions == planning.data_positions(config)
    # a pass holds 3 prompts × 5 answers = 15 rows; smaller passes halve it, whether or not they divide anything
    assert planning.micro_rows_now(config, world_size=1, answers=answers) == 15
    micro, _ = planning.single_changes(config, world_size=1, answers=answers)
    assert micro == ["--batch.micro_size=7", "--batch.micro_size=3", "--batch.micro_size=1"]
    capped = config_from_dict("rm", values | {"batch": {"size": 3, "micro_size": 4}})
    assert planning.micro_rows_now(capped, world_size=1, answers=answers) == 4


def test_candidates_cheapest_first(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path):
    values = ppo_values(tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path) | {"batch.size": 16}
    order = list(planning.candidates(config_from_dict("ppo", nested(values)), world_size=1))
    ckpt = "--model.gradient_checkpointing=true"
    # micro-batches down to a quarter (4x the passes), then checkpointing (alone, then with them), …
    assert order[:4] == [("--batch.micro_size=8",), ("--batch.micro_size=4",), (ckpt,), (ckpt, "--batch.micro_size=8")]
    # … and 8x / 16x the passes only after every other single change
    tiny_first = order.index(("--batch.micro_size=2",))
    lora = "--model.lora '{r: 8}'"  # as `rlhf ppo` takes it: the candidates are applied by its own parser
    assert tiny_first > order.index((lora,)) and order.index(("--batch.micro_size=1",)) == tiny_first + 1


def test_a_model_directory_rewritten_in_place_is_read_again(tmp_path):
    from rlhf.models.tiny import save_tiny, tiny_causal_lm, toy_corpus, train_tokenizer

    tokenizer = train_tokenizer(toy_corpus(200), 300)
    save_tiny(tiny_causal_lm("llama", tokenizer, num_layers=2), tokenizer, tmp_path / "m")
    assert planning.model_sizes(str(tmp_path / "m")).layers == 2
    save_tiny(tiny_causal_lm("llama", tokenizer, num_layers=3), tokenizer, tmp_path / "m")  # a demo run again
    assert planning.model_sizes(str(tmp_path / "m")).layers == 3


_FRAGMENTED_HEAP = """
import torch
from rlhf.runlog.distributed import SINGLE
from rlhf.trainers import update

def rss_mb():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024

layer = torch.nn.Linear(4, 4)
optimizer = torch.optim.AdamW(layer.parameters())
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
layer(torch.ones(1, 4)).sum().backward()
blocks = [torch.ones(25_000) for _ in range(2_000)]  # 100 kB each: below glibc's mmap threshold, on the heap
pinned = torch.ones(25_000)  # allocated last: the heap's top stays in use, so freeing alone returns nothing
del blocks
before = rss_mb()
update.optimizer_step(update.Trainable(layer, SINGLE), optimizer, scheduler, max_grad_norm=1.0)
print(before - rss_mb())
"""


def test_an_update_on_cpu_gives_the_freed_heap_back(tmp_path):
    """The plan's CPU model needs RSS to follow the live tensors after each update (`update.release_freed_heap`):
    200 MB freed below a live block leave RSS without the trim and leave it with."""
    import subprocess
    import sys

    from rlhf.trainers import update

    if update._malloc_trim() is None:
        pytest.skip("no glibc malloc_trim here")
    script = tmp_path / "heap.py"
    script.write_text(_FRAGMENTED_HEAP)
    released = float(subprocess.run([sys.executable, str(script)], check=True, capture_output=True, text=True).stdout)
    assert released > 150  # of the 200 MB freed (the allocator may keep a few arenas' worth)
