"""N ranks give the update one process gives: real ``torchrun``, gloo, 2 processes on this machine.

Each trainer runs twice on the same global batch — one process, then ``torchrun --nproc_per_node 2`` — through
tests/distributed/worker.py (``rlhf <command>`` plus ragged responses and a record of every step's synchronised
gradients). The ranks sample exactly the responses one process samples (per-row random streams), so the two runs
differ only in float rounding: which rows share a forward (padding widths and matrix shapes change the
kernels' summation order) and the order in which the ranks' gradients are added.

Tolerances, from that arithmetic:
- gradients: each element is a sum of per-token terms computed in fp32; regrouping the terms and the changed
  kernel blocking perturb each term by a few ulp of its own size. The first optimizer step (equal weights)
  allows 1e-4 of the tensor's largest element (≲ 10³ terms, each off by ≲ 10⁻⁷ relative), later steps 1e-3,
  because the weights have drifted apart by then (torchrun_runs.LATER_STEPS_RTOL says why);
- weights after the run: Adam divides by √v, so an element whose gradient is ≈ 0 can move by up to the learning
  rate on a rounding difference: |Δw| ≤ steps · lr is the honest bound for those, and the gradient check above is
  what pins the arithmetic down;
- logged metrics: rel 1e-4 (means of the same sums, reduced in another order).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torchrun_runs import assert_same_gradients, assert_same_metrics, assert_same_weights, run, torchrun

from rlhf.models.tiny import toy_corpus

pytestmark = [pytest.mark.slow, pytest.mark.longest]

REWARDS = Path(__file__).resolve().parents[1] / "trainers" / "ppo_rewards.py"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory):
    """``one_process(command, config)``: (metric rows, per-step gradients, run directory) of the config's one-process
    run, run once per module: a trainer's DDP and FSDP cases compare their ranks with the same one (7 runs fewer)."""
    done: dict[str, tuple[list[dict], list[dict], Path]] = {}

    def run_once(command: str, config: dict) -> tuple[list[dict], list[dict], Path]:
        key = json.dumps([command, config], sort_keys=True)
        if key not in done:
            out = tmp_path_factory.mktemp(f"one_{command}")
            done[key] = (*run(command, config, out), out / "run")
        return done[key]

    return run_once


def rl_config(command: str, policy: Path, prompts: Path, **overrides: object) -> dict:
    """3 steps, ragged responses, 2 passes × 2 minibatches (the second pass shuffled), held-out samples.
    Keys are dotted paths (``**{"batch.size": 8}``)."""
    return {
        "model.name": str(policy), "reward.source": f"{REWARDS}:length_chars", "data.train": str(prompts),
        f"{command}.steps": 3, "sampling.max_new_tokens": 8, "sampling.temperature": 1.0,
        "optim.learning_rate": 1e-3, f"{command}.num_minibatches": 2, "run.eval_every": 3, "run.save_every": 0,
        "run.progress": False,
    } | overrides  # fmt: skip


@pytest.mark.parametrize(
    ("critic", "parallelism"), [("shared", "ddp"), ("separate", "ddp"), ("shared", "fsdp"), ("separate", "fsdp")]
)
def test_ppo_two_ranks_equal_one_process(tiny_llama_dir, prompts, tmp_path, one_process, critic, parallelism):
    """DDP, and FSDP2 (policy, reference, value head or critic sharded; a rollout gathers the policy once). With a
    separate critic the two ranks also recompute their activations (model.gradient_checkpointing, policy and critic):
    the same gradients as one process that keeps them."""
    config = rl_config("ppo", tiny_llama_dir, prompts, **{"batch.size": 8, "ppo.epochs": 2, "ppo.critic": critic,
                                                    "kl.control": "adaptive"})  # fmt: skip
    one_rows, one_grads, one = one_process("ppo", config)
    two = config | {"run.parallelism": parallelism, "model.gradient_checkpointing": critic == "separate"}
    two_rows, two_grads = run("ppo", two, tmp_path / "two", torchrun())
    assert_same_gradients(one_grads, two_grads)
    assert_same_metrics(one_rows, two_rows)
    samples = sorted((one / "samples").iterdir())
    assert [p.read_text() for p in samples] == [
        (tmp_path / "two" / "run" / "samples" / p.name).read_text() for p in samples
    ]  # the same held-out answers, written once
    assert_same_weights(one / "final", tmp_path / "two" / "run" / "final", 3 * 1e-3)


def test_ppo_fsdp_with_a_reward_model_equals_one_process(tiny_llama_dir, tiny_reward_model_dir, prompts, tmp_path):
    """FSDP2 with a reward model as the reward: it is loaded sharded and gathered for scoring (each rank scores
    its own rows), and the separate critic starts from it, also loaded sharded."""
    reward = str(tiny_reward_model_dir)
    config = rl_config(
        "ppo", tiny_llama_dir, prompts, **{"batch.size": 8, "ppo.critic": "separate", "reward.source": reward}
    )
    one_rows, one_grads = run("ppo", config, tmp_path / "one")
    two_rows, two_grads = run("ppo", config | {"run.parallelism": "fsdp"}, tmp_path / "two", torchrun())
    assert_same_gradients(one_grads, two_grads)
    assert_same_metrics(one_rows, two_rows)
    assert_same_weights(tmp_path / "one" / "run" / "final", tmp_path / "two" / "run" / "final", 3 * 1e-3)


GRPO_VARIANTS = {
    "full": {},
    "lora": {"model.lora": {"r": 4, "alpha": 8, "dropout": 0.0}},
    "variants": {"grpo.loss_type": "cispo", "grpo.importance_sampling_level": "sequence_token",
                 "grpo.top_entropy_quantile": 0.5, "grpo.off_policy_mask_threshold": 0.001},
}  # fmt: skip


@pytest.mark.parametrize("variant", list(GRPO_VARIANTS))
def test_grpo_two_ranks_equal_one_process(tiny_llama_dir, prompts, tmp_path, one_process, variant):
    """Also with LoRA (only the adapters train and synchronise; the reference is the adapter switched off), and with
    the variants whose masks span the batch: the entropy mask is chosen over every rank's rows, the off-policy mask
    (acting in the second iteration) per sequence, so neither depends on the number of ranks."""
    config = rl_config("grpo", tiny_llama_dir, prompts, **{
        "batch.size": 4, "grpo.group_size": 4, "grpo.num_iterations": 2, "kl.coef": 0.05, "batch.micro_size": 2,
    } | GRPO_VARIANTS[variant])  # fmt: skip
    one_rows, one_grads, one = one_process("grpo", config)
    two_rows, two_grads = run("grpo", config, tmp_path / "two", torchrun())
    if variant == "variants":  # both masks acted
        train = [row for row in one_rows if "policy/loss" in row]
        assert all(row["policy/entropy_masked_fraction"] > 0.4 for row in train)
        assert any(row["policy/off_policy_masked"] > 0 for row in train), train
    assert_same_gradients(one_grads, two_grads)
    assert_same_metrics(one_rows, two_rows)
    assert_same_weights(one / "final", tmp_path / "two" / "run" / "final", 3 * 1e-3)


EPISODES = Path(__file__).resolve().parents[1] / "episode_envs.py"


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_multi_turn_two_ranks_equal_one_process(chat_policy, word_prompts, tmp_path, command):
    """Multi-turn episodes: each rank plays its rows' episodes (its own environment instances, per-row and per-turn
    sampling streams), so 2 ranks play exactly the episodes 1 process plays and the updates agree as above."""
    config = rl_config(command, chat_policy, word_prompts, **{
        "reward.source": "environment", "rollout.environment": f"{EPISODES}:Chatty", "rollout.max_turns": 2,
        "rollout.max_episode_tokens": 40, "sampling.max_new_tokens": 6, "batch.micro_size": 2,
    } | ({"batch.size": 4, "grpo.group_size": 4} if command == "grpo" else {"batch.size": 8}))  # fmt: skip
    one_rows, one_grads = run(command, config, tmp_path / "one")
    two_rows, two_grads = run(command, config, tmp_path / "two", torchrun())
    assert all(row["episode/turns_mean"] > 1 for row in one_rows if "episode/turns_mean" in row)  # replies came
    assert_same_gradients(one_grads, two_grads)
    assert_same_metrics(one_rows, two_rows)
    assert_same_weights(tmp_path / "one" / "run" / "final", tmp_path / "two" / "run" / "final", 3 * 1e-3)


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """11 examples: with batches of 4 an epoch ends on a batch of 3, which 2 ranks split 2 + 1."""
    lines = toy_corpus(22, seed=7)
    rows = [{"prompt": a, "response": " " + b} for a, b in zip(lines[::2], lines[1::2], strict=True)]
    path = tmp_path_factory.mktemp("dist_sft") / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def rm_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(train: 13 pairs, eval: 5 pairs): the last batch of an epoch and the eval set split unevenly."""
    lines = toy_corpus(54, seed=8)
    rows = [{"prompt": a, "chosen": " " + b, "rejected": " " + c}
            for a, b, c in zip(lines[::3], lines[1::3], lines[2::3], strict=True)]  # fmt: skip
    root = tmp_path_factory.mktemp("dist_rm")
    for name, part in (("train", rows[:13]), ("eval", rows[13:])):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in part))
    return root / "train.jsonl", root / "eval.jsonl"


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_sft_two_ranks_equal_one_process(tiny_llama_dir, sft_data, tmp_path, one_process, parallelism):
    config = {"model.name": str(tiny_llama_dir), "data.train": str(sft_data), "data.eval": str(sft_data), "sft.epochs": 2,
              "batch.size": 4, "batch.micro_size": 1, "optim.learning_rate": 1e-3, "data.max_length": 64, "run.eval_every": 2,
              "run.save_every": 0, "run.progress": False}  # fmt: skip
    one_rows, one_grads, one = one_process("sft", config)
    two_rows, two_grads = run("sft", config | {"run.parallelism": parallelism}, tmp_path / "two", torchrun())
    assert len(one_grads) == 6  # 2 epochs of ceil(11 / 4) steps
    assert_same_gradients(one_grads, two_grads)
    assert_same_metrics(one_rows, two_rows)
    assert_same_weights(one / "final", tmp_path / "two" / "run" / "final", 6 * 1e-3)


# dpo's reference pass runs before the optimizer is built: a sharded root left gathered by it would give the
# optimizer the gathered copies (step 2 diverged in the embeddings before models.sharding.gathered wrapped it)
@pytest.mark.parametrize(("command", "parallelism"), [("rm", "ddp"), ("rm", "fsdp"), ("dpo", "ddp"), ("dpo", "fsdp")])
def test_preference_trainers_two_ranks_equal_one_process(
    tiny_llama_dir, rm_data, tmp_path, one_process, command, parallelism
):
    train, held_out = rm_data
    # micro_size counts answers: 1 splits every prompt's answers over passes (ddp: the gradient through the scores
    # taken first); fsdp needs a prompt's answers in one pass (the data's most: 4, two prompts repeat)
    micro = 4 if parallelism == "fsdp" else 1
    config = {"model.name": str(tiny_llama_dir), "data.train": str(train), "data.eval": str(held_out), f"{command}.epochs": 1,
              "batch.size": 5, "batch.micro_size": micro, "optim.learning_rate": 1e-3, "run.eval_every": 2, "run.save_every": 0,
              "run.progress": False}  # fmt: skip
    one_rows, one_grads, one = one_process(command, config)
    two_rows, two_grads = run(command, config | {"run.parallelism": parallelism}, tmp_path / "two", torchrun())
    assert len(one_grads) == 3  # ceil(11 / 5) steps: the 13 pairs' 11 prompts
    assert_same_gradients(one_grads, two_grads)
    assert_same_metrics(one_rows, two_rows)
    assert_same_weights(one / "final", tmp_path / "two" / "run" / "final", 3 * 1e-3)


def test_a_reward_model_ensemble_under_fsdp_equals_one_process(tiny_llama_dir, rm_data, tmp_path):
    """`rm.ensemble 2` under torchrun: the members train one after another in one launch, each sharded over the
    ranks, and rank 0 writes the ensemble; the same members as one process trains."""
    train, held_out = rm_data
    config = {"model.name": str(tiny_llama_dir), "data.train": str(train), "data.eval": str(held_out), "rm.ensemble": 2,
              "batch.size": 5, "batch.micro_size": 4, "optim.learning_rate": 1e-3, "run.save_every": 0, "run.progress": False}  # fmt: skip
    one_rows, one_grads = run("rm", config, tmp_path / "one", members=2)
    two_rows, two_grads = run("rm", config | {"run.parallelism": "fsdp"}, tmp_path / "two", torchrun(), members=2)
    assert len(one_grads) == 2 * 3  # two members of ceil(13 / 5) steps
    assert_same_gradients(one_grads, two_grads)
    assert_same_metrics(one_rows, two_rows)
    one, two = tmp_path / "one" / "run" / "final", tmp_path / "two" / "run" / "final"
    assert json.loads((one / "ensemble.json").read_text())["members"] == ["member_0", "member_1"]
    for member in ("member_0", "member_1"):
        assert_same_weights(one / member, two / member, 3 * 1e-3)


@pytest.mark.parametrize("variant", ["full", "lora"])
def test_grpo_fsdp_equals_one_process(tiny_llama_dir, prompts, tmp_path, one_process, variant):
    """FSDP2: the policy and the reference sharded over 2 ranks, weights gathered once per rollout; with LoRA the
    adapters are added before sharding (rank 0's initial adapters on every rank) and only they train, and the ranks
    recompute their activations in the backward pass (model.gradient_checkpointing)."""
    # the config (and so the one-process run) of test_grpo_two_ranks_equal_one_process's case
    config = rl_config("grpo", tiny_llama_dir, prompts, **{
        "batch.size": 4, "grpo.group_size": 4, "grpo.num_iterations": 2, "kl.coef": 0.05, "batch.micro_size": 2,
    } | GRPO_VARIANTS[variant])  # fmt: skip
    one_rows, one_grads, one = one_process("grpo", config)
    two = config | {"run.parallelism": "fsdp", "model.gradient_checkpointing": variant == "lora"}
    two_rows, two_grads = run("grpo", two, tmp_path / "two", torchrun())
    assert_same_gradients(one_grads, two_grads)
    assert_same_metrics(one_rows, two_rows)
    assert_same_weights(one / "final", tmp_path / "two" / "run" / "final", 3 * 1e-3)
