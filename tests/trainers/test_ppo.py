"""`rlhf ppo` end to end on tiny random-init models (test layers b-e, docs/architecture.md).

Each run is a real `rlhf.trainers.rl.ppo.run(config)` on the session's tiny models with a few prompts, 1-4
iterations of 4-8 sequences: about a second each. Unit-level checks (the LoRA reference, the critic's
initialisation) use `rlhf.trainers.rl.ppo.build_models` directly. The learning test runs 50 iterations (≈4 s).

Reward functions come from ``ppo_rewards.py`` beside this file, named as users do: ``file.py:function``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from configs import nested
from ensembles import write_ensemble
from rlhf import cli
from rlhf.config import config_from_dict
from rlhf.models import sharding
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.policy import score_response_tokens
from rlhf.models.tiny import toy_corpus
from rlhf.rollout.rewards import RewardError, load_reward_set
from rlhf.runlog.distributed import SINGLE, Dist
from rlhf.trainers import update
from rlhf.trainers.rl import ppo, updates
from rlhf.trainers.rl.models import Models, write_final
from runs import (
    assert_rows_match,
    assert_same_checkpoint,
    comparable,
    counting,
    dies_after_checkpoint,
    finite,
    max_abs_diff,
    metric_rows,
    recording_micro_steps,
    train_rows,
)

REWARDS = Path(__file__).resolve().parent / "ppo_rewards.py"

# The PPO metric names (README, "Metrics"): every training line of metrics.jsonl carries all of them.
PPO_METRICS = [
    "step", "reward/mean", "reward/std", "kl/mean", "kl/coef", "policy/loss", "policy/entropy",
    "policy/clipfrac", "policy/approx_kl", "value/loss", "value/clipfrac", "value/explained_variance",
    "advantages/abs_mean", "grad/norm", "response/length_mean", "response/length_max", "response/eos_rate",
    "time/rollout_s", "time/train_s", "time/step_s", "throughput/tokens_per_s",
]  # fmt: skip


def reward(name: str) -> str:
    return f"{REWARDS}:{name}"


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 prompts of 3-4 words from the toy language (36 train, 4 held out for samples/)."""
    path = tmp_path_factory.mktemp("ppo_prompts") / "prompts.jsonl"
    lines = toy_corpus(40, seed=5)
    rows = [{"prompt": " ".join(line.split()[: 3 + i % 2])} for i, line in enumerate(lines)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


ENSEMBLE = "<a reward-model ensemble>"
"""In a test's fields: replaced by the directory of tests/ensembles.py's ensemble."""


def make_config(policy: Path, prompts: Path, out: Path, **overrides: object):
    """A small, fast PPO config: 2 iterations of 8 sequences, 2 epochs × 2 minibatches, no checkpoints.

    The reward is the response length, which differs between samples from the first iteration on (a reward
    that is 0 for every random response would give zero advantages and no update).
    """
    values = {
        "model.name": str(policy),
        "reward.source": reward("length_chars"),
        "data.train": str(prompts),
        "output_dir": str(out),
        "ppo.steps": 2,
        "batch.size": 8,
        "sampling.max_new_tokens": 8,
        "sampling.temperature": 1.0,
        "optim.learning_rate": 1e-3,
        "ppo.epochs": 2,
        "ppo.num_minibatches": 2,
        "run.eval_every": 0,
        "run.save_every": 0,
        "run.progress": False,
    }
    return config_from_dict("ppo", nested(values | overrides))


@pytest.fixture
def micro_steps(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Records the stats of every micro-batch forward/backward of the run, in order."""
    return recording_micro_steps(monkeypatch, ppo)


# --------------------------------------------------------------------------------------------------------------
# (d) smoke runs
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "critic"), [("llama", "shared"), ("llama", "separate"), ("gpt2", "shared"), ("qwen2", "separate")]
)
def test_smoke_two_steps(tiny_model_dir_factory, prompts_file, tmp_path, ragged, micro_steps, arch, critic):
    policy = tiny_model_dir_factory(arch)
    out = tmp_path / "run"
    final = ppo.run(make_config(policy, prompts_file, out, **{"ppo.critic": critic}))

    rows = train_rows(out)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert finite(row, PPO_METRICS), row
        assert row["policy/first_ratio_max_dev"] == 0.0  # checklist item 34, as the run reports it
        assert 0 < row["response/eos_rate"] < 1  # ragged responses: padding is part of the batch
    # 2 iterations × 2 epochs × 2 minibatches, one micro-batch each. Call 0 of each iteration is the first
    # minibatch of epoch 0: the same rows, forward and batch shape that produced the old log-probs.
    assert len(micro_steps) == 8
    for first in (micro_steps[0], micro_steps[4]):
        assert first["ratio_dev"] == 0.0 and first["policy/clipfrac"] == 0.0 and first["policy/approx_kl"] == 0.0
    assert any(call["ratio_dev"] > 0 for call in micro_steps)  # later minibatches do see an updated policy

    # the policy's parameters changed, and so did the value function (its zero-initialised head)
    assert max_abs_diff(load_file(final / "model.safetensors"), load_file(policy / "model.safetensors")) > 1e-4
    head_file = final / "value_head.safetensors" if critic == "shared" else final / "critic" / "value_head.safetensors"
    assert load_file(head_file)["linear.weight"].abs().max() > 0
    if critic == "separate":
        from transformers import AutoModel

        trunk = AutoModel.from_pretrained(final / "critic").state_dict()
        initial = AutoModel.from_pretrained(policy).state_dict()
        assert max_abs_diff(trunk, initial) > 1e-4
    else:
        assert not (final / "critic").exists()


def test_metrics_samples_and_final_directory(tiny_llama_dir, prompts_file, tmp_path):
    from transformers import AutoModelForCausalLM

    rewards = [
        {"source": reward("digit_count"), "weight": 2.0, "name": "digits"},
        {"source": reward("length_chars"), "weight": 0.5},
    ]
    out = tmp_path / "run"
    final = ppo.run(make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": rewards, "ppo.steps": 3, "run.eval_every": 2, "batch.size": 4, "ppo.num_minibatches": 1, "ppo.epochs": 1}))  # fmt: skip

    rows = train_rows(out)
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert set(PPO_METRICS) <= row.keys()
        assert {"reward/digits/mean", "reward/length_chars/mean"} <= row.keys()
        # every sample is scored, so the mean of the weighted sums is the weighted sum of the means
        expected = 2.0 * row["reward/digits/mean"] + 0.5 * row["reward/length_chars/mean"]
        assert row["reward/mean"] == pytest.approx(expected, rel=1e-5, abs=1e-6)

    # held-out samples before training (step 0: the starting point's own row), every eval_every iterations and at
    # the end
    names = ["step_000000.jsonl", "step_000002.jsonl", "step_000003.jsonl"]
    assert sorted(p.name for p in (out / "samples").iterdir()) == names
    first = metric_rows(out)[0]
    assert first["step"] == 0 and {"eval/reward/mean", "eval/reward/digits/mean", "time/eval_s"} <= first.keys()
    assert not any(key.startswith(("reward/", "policy/", "kl/")) for key in first)  # no training in it
    samples = [json.loads(line) for line in (out / "samples" / "step_000003.jsonl").read_text().splitlines()]
    assert len(samples) == 4  # 40 prompts // 10 held out
    assert all(set(s["rewards"]) == {"digits", "length_chars"} and s["step"] == 3 for s in samples)

    assert (out / "config.yaml").is_file()
    model = AutoModelForCausalLM.from_pretrained(final)  # a plain save_pretrained directory
    assert model.config.vocab_size == AutoModelForCausalLM.from_pretrained(tiny_llama_dir).config.vocab_size
    assert load_file(final / "value_head.safetensors")["linear.weight"].shape == (1, model.config.hidden_size)
    assert (final / "tokenizer_config.json").is_file()


@pytest.mark.parametrize(
    "overrides",
    [
        {"kl.add_to": "loss"},
        {"kl.control": "adaptive"},
        {"reward.missing_eos_penalty": 0.5, "reward.missing_eos_mode": "replace"},
        {"reward.missing_eos_penalty": 0.5, "reward.missing_eos_mode": "subtract"},
        {"ppo.whiten_rewards": True},
        {"ppo.score_position": "eos"},
        {"batch.micro_size": 2, "kl.estimator": "k3"},
        {"ppo.loss_type": "cispo"},
        {"ppo.loss_type": "sapo", "ppo.importance_sampling_level": "sequence_token"},
        {"ppo.importance_sampling_level": "sequence", "ppo.top_entropy_quantile": 0.2},
        {"batch.micro_size": 2, "ppo.top_entropy_quantile": 0.2, "ppo.off_policy_mask_threshold": 1e-4},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_variants_run(tiny_llama_dir, prompts_file, tmp_path, ragged, overrides):
    out = tmp_path / "run"
    # a constant score of 1, so what the trainer does to it is visible in reward/score_mean
    ppo.run(make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": reward("constant_one")}, **overrides))
    rows = train_rows(out)
    assert len(rows) == 2
    for row in rows:
        assert finite(row, ["policy/loss", "value/loss", "kl/mean", "kl/coef", "grad/norm", "policy/entropy"])
        assert row["policy/first_ratio_max_dev"] == 0.0
        eos = row["response/eos_rate"]
        if overrides.get("reward.missing_eos_mode") == "replace":  # score := −penalty without EOS
            assert row["reward/score_mean"] == pytest.approx(eos * 1.0 + (1 - eos) * -0.5)
        elif overrides.get("reward.missing_eos_mode") == "subtract":  # score −= penalty without EOS
            assert row["reward/score_mean"] == pytest.approx(1.0 - (1 - eos) * 0.5)
        else:
            assert row["reward/score_mean"] == 1.0
        if overrides.get("kl.add_to") == "loss":
            assert row["reward/non_score_mean"] == 0.0  # no KL in the rewards
        if "ppo.top_entropy_quantile" in overrides:  # from the fused first forward or the rollout's pass
            assert row["policy/entropy_masked_fraction"] == pytest.approx(0.8, abs=0.1)
    if "ppo.off_policy_mask_threshold" in overrides:  # 4 epochs: the later ones see a moved policy
        assert any(row["policy/off_policy_masked"] > 0 for row in rows)
    coefs = [row["kl/coef"] for row in rows]
    if "kl.control" in overrides:
        assert coefs[0] != 0.05 and coefs[1] != coefs[0] and all(c > 0 for c in coefs)
    else:
        assert coefs == [0.05, 0.05]


def test_kl_in_loss_uses_the_adapted_coefficient(tiny_llama_dir, prompts_file, tmp_path, monkeypatch):
    betas: list[float] = []
    original = updates.clipped_policy_loss

    def recording(*args, **kwargs):
        betas.append(kwargs["kl_coef"])
        return original(*args, **kwargs)

    monkeypatch.setattr(updates, "clipped_policy_loss", recording)
    out = tmp_path / "run"
    ppo.run(
        make_config(
            tiny_llama_dir, prompts_file, out, **{"kl.add_to": "loss", "kl.control": "adaptive", "kl.coef": 0.1}
        )
    )
    rows = train_rows(out)
    # 4 minibatches per iteration; iteration 2 trains with the β the controller set after iteration 1
    assert betas[:4] == [0.1] * 4
    assert betas[4:] == [rows[0]["kl/coef"]] * 4 and rows[0]["kl/coef"] != 0.1


# --------------------------------------------------------------------------------------------------------------
# LoRA: the reference is the base model with the adapter off, and there is no second copy of it
# --------------------------------------------------------------------------------------------------------------

LORA = {"r": 4, "alpha": 8.0, "dropout": 0.1}


def storage_bytes(modules: list[torch.nn.Module]) -> int:
    """Bytes of the distinct storages behind all parameters and buffers of ``modules`` (shared ones once)."""
    storages: dict[int, int] = {}
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(storages.values())


def build_models(policy: Path, reward_spec: str, **overrides: object) -> Models:
    config = make_config(policy, Path("unused.jsonl"), Path("unused"), **{"reward.source": reward_spec}, **overrides)
    rewards = load_reward_set(reward_spec, policy_tokenizer=load_tokenizer(str(policy)))
    return ppo.build_models(config, rewards, SINGLE)


def test_lora_reference_is_the_base_model_without_a_copy(tiny_llama_dir, monkeypatch):
    def no_copy(model):
        raise AssertionError("LoRA must not make a frozen copy of the policy")

    with monkeypatch.context() as patch:
        patch.setattr(sharding, "frozen_copy", no_copy)
        models = build_models(tiny_llama_dir, reward("constant_one"), **{"model.lora": LORA})
    base = load_causal_lm(str(tiny_llama_dir))
    assert models.reference.copy is None
    # Distinct storages of everything Models holds: one base model + small adapters + the value head.
    # (A full fine-tuning Models, below, holds two base models: the counter does see a copy.)
    base_bytes = storage_bytes([base])
    held = [m for m in (models.policy, models.reference.copy, models.value_module()) if m is not None]
    lora_bytes = sum(p.numel() * p.element_size() for n, p in models.policy.named_parameters() if "lora_" in n)
    assert 0 < lora_bytes < 0.1 * base_bytes
    assert storage_bytes(held) == base_bytes + lora_bytes + storage_bytes([models.value.head])
    full = build_models(tiny_llama_dir, reward("constant_one"))
    held = [m for m in (full.policy, full.reference.copy, full.value_module()) if m is not None]
    assert storage_bytes(held) >= 2 * base_bytes

    # Train-like perturbation of the adapters (lora_B starts at 0, which would make the check vacuous)
    with torch.no_grad():
        for name, param in models.policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    ids = torch.randint(6, base.config.vocab_size, (3, 10))
    mask = torch.ones_like(ids)
    expected = score_response_tokens(base, ids, mask, 4, 1.0).logprobs
    torch.testing.assert_close(models.reference.logprobs(ids, mask, 4, 1.0), expected, rtol=0, atol=1e-6)
    policy_logprobs, _, _ = models.trainable.forward(ids, mask, 4, 1.0)
    assert (policy_logprobs - expected).abs().max() > 1e-3  # the adapter is on outside reference.logprobs


def test_a_bfloat16_reference_halves_the_copy_and_gives_float32_logprobs_near_the_float32_ones(tiny_llama_dir):
    full = build_models(tiny_llama_dir, reward("constant_one"))
    half = build_models(tiny_llama_dir, reward("constant_one"), **{"model.reference_dtype": "bfloat16"})
    assert {p.dtype for p in half.reference.copy.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in half.policy.parameters()} == {torch.float32}
    assert storage_bytes([half.reference.copy]) * 2 == storage_bytes([full.reference.copy])
    ids = torch.randint(6, full.policy.config.vocab_size, (3, 10))
    mask = torch.ones_like(ids)
    exact, approx = full.reference.logprobs(ids, mask, 4, 1.0), half.reference.logprobs(ids, mask, 4, 1.0)
    assert approx.dtype == torch.float32
    # bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 0.2 %) at each of the ~10 sequential ops between
    # the embedding and the log-softmax, on logits of magnitude <= 5: at most 10 x 0.002 x 5 = 0.1 nats
    torch.testing.assert_close(approx, exact, rtol=0, atol=0.1)


def test_reference_dtype_is_refused_with_lora(tiny_llama_dir):
    with pytest.raises(Exception, match="reference_dtype: with lora the reference is the policy's own base weights"):
        make_config(
            tiny_llama_dir, Path("p.jsonl"), Path("out"), **{"model.lora": LORA, "model.reference_dtype": "bfloat16"}
        )


def test_lora_run_saves_merged_model(tiny_llama_dir, prompts_file, tmp_path, micro_steps):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    final = ppo.run(make_config(tiny_llama_dir, prompts_file, out, **{"model.lora": LORA, "optim.learning_rate": 1e-2}))
    assert micro_steps[0]["ratio_dev"] == 0.0 and micro_steps[0]["policy/clipfrac"] == 0.0
    assert all(finite(row, PPO_METRICS) for row in train_rows(out))
    assert not list(final.glob("adapter*"))  # merged: no adapter files needed to load it
    merged = AutoModelForCausalLM.from_pretrained(final).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).state_dict()
    assert merged.keys() == initial.keys()
    changed = {k for k in merged if not torch.equal(merged[k], initial[k])}
    # peft's default LoRA targets for llama: the query and value projections; nothing else moves
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed
    assert (final / "value_head.safetensors").is_file()


# --------------------------------------------------------------------------------------------------------------
# Reward models and the separate critic
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_reward_model_with_a_different_tokenizer(
    tiny_llama_dir, tiny_reward_model_other_tokenizer_dir, prompts_file, tmp_path, critic
):
    out = tmp_path / "run"
    config = make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": str(tiny_reward_model_other_tokenizer_dir), "ppo.critic": critic})  # fmt: skip
    ppo.run(config)
    rows = train_rows(out)
    assert len(rows) == 2 and all(finite(row, PPO_METRICS) for row in rows)
    assert rows[0]["reward/std"] > 0  # the reward model really scored the (decoded, re-encoded) responses


def test_reward_model_sharing_the_tokenizer_scores_the_sampled_ids(
    tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path, monkeypatch
):
    """The policy's own query ⊕ response ids reach the reward model (no decode / re-encode), and its scores
    are the rewards."""
    from rlhf.rollout.rewards.model import RewardModelReward

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = RewardModelReward.score_ids

    def recording(self, ids, mask):
        scores = original(self, ids, mask)
        seen.append((ids.clone(), scores))
        return scores

    monkeypatch.setattr(RewardModelReward, "score_ids", recording)
    out = tmp_path / "run"
    ppo.run(make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": str(tiny_reward_model_dir)}))
    rows = train_rows(out)
    training = [scores for ids, scores in seen if len(ids) == 8]  # the rest: the 4 held-out prompts
    assert len(training) == len(rows) == 2
    for row, scores in zip(rows, training, strict=True):
        assert finite(row, PPO_METRICS)
        assert row["reward/mean"] == pytest.approx(scores.mean().item(), abs=1e-5)
        assert row["reward/std"] > 0


def test_separate_critic_starts_from_the_reward_model_only_when_it_reads_the_policys_tokens(
    tiny_llama_dir, tiny_reward_model_dir, tiny_reward_model_other_tokenizer_dir
):
    from transformers import AutoModelForSequenceClassification

    same = build_models(tiny_llama_dir, str(tiny_reward_model_dir), **{"ppo.critic": "separate"})
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_dir)
    torch.testing.assert_close(same.value.critic.head.linear.weight, rm.score.weight, rtol=0, atol=0)
    # another tokenizer: its token ids mean other tokens (and run past its vocabulary), so the critic
    # starts from the policy with a zero head
    other = build_models(tiny_llama_dir, str(tiny_reward_model_other_tokenizer_dir), **{"ppo.critic": "separate"})
    assert other.value.critic.trunk.config.vocab_size == same.policy.config.vocab_size
    assert other.value.critic.head.linear.weight.abs().max() == 0


def test_auto_critic_is_separate_only_when_a_reward_model_can_start_it(
    tiny_llama_dir, tiny_reward_model_dir, tiny_reward_model_other_tokenizer_dir, capsys
):
    from transformers import AutoModelForSequenceClassification

    assert make_config(tiny_llama_dir, Path("p.jsonl"), Path("out")).ppo.critic == "auto"  # the default
    with_rm = build_models(tiny_llama_dir, str(tiny_reward_model_dir))
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_dir)
    assert with_rm.value.head is None
    torch.testing.assert_close(with_rm.value.critic.head.linear.weight, rm.score.weight, rtol=0, atol=0)
    assert (
        f"ppo: critic auto → separate (started from the reward model {tiny_reward_model_dir}" in capsys.readouterr().err
    )
    # a reward model with another tokenizer cannot start a critic, nor can a reward function: the shared head
    for source in (str(tiny_reward_model_other_tokenizer_dir), reward("length_chars")):
        models = build_models(tiny_llama_dir, source)
        assert models.value.critic is None and models.value.head is not None
        assert "ppo: critic auto → shared" in capsys.readouterr().err
    assert ppo.critic_layout("shared", True) == "shared" and ppo.critic_layout("separate", False) == "separate"


# --------------------------------------------------------------------------------------------------------------
# (b) equivalences: resume, micro-batching
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"model.lora": LORA, "ppo.critic": "separate"},
        {"kl.reference_ema": 0.5},
        {"reward.source": ENSEMBLE, "reward.ensemble.objective": "uwo", "ppo.critic": "separate"},
    ],
    ids=["full-shared", "lora-separate", "moving-reference", "ensemble-reward"],
)
def test_resume_reproduces_the_uninterrupted_run(
    tiny_llama_dir, tokenizer_dir, prompts_file, tmp_path, ragged, monkeypatch, variant
):
    # adaptive β, linear decay, shuffled epochs, held-out samples (and a moving reference): all state the
    # checkpoint must hold. A reward-model ensemble: its members score, the critic starts from the first
    if variant.get("reward.source") == ENSEMBLE:
        variant = variant | {"reward.source": str(write_ensemble(tmp_path / "rm", tokenizer_dir))}
    fields = {
        "ppo.steps": 4,
        "run.save_every": 2,
        "run.eval_every": 2,
        "kl.control": "adaptive",
        "kl.coef": 0.2,
        **variant,
    }
    whole = ppo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "whole", **fields))
    with dies_after_checkpoint(monkeypatch, 2):
        ppo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "resumed", **fields))
    with counting(monkeypatch, ppo, "ppo_update") as updates:
        resumed = ppo.run(
            make_config(tiny_llama_dir, prompts_file, tmp_path / "resumed", **{"run.resume": True}, **fields)
        )
    assert len(updates) == 2  # it did continue at iteration 3 (a fresh run would reproduce 1-2 as well)

    expected, got = comparable(metric_rows(tmp_path / "whole")), comparable(metric_rows(tmp_path / "resumed"))
    # one row per step; the eval steps carry the held-out rewards in the same row
    assert [row["step"] for row in got] == [row["step"] for row in expected] == [0, 1, 2, 3, 4]
    assert ["eval/reward/mean" in row for row in got] == [True, False, True, False, True]  # step 0: the start
    # the resumed run repeats the uninterrupted run's float32 operations in the same order, so it gives the
    # same bits; the bounds (a few ulp of values ≤ 8: 8·2⁻²³ ≈ 1e-6) is not a measured noise level
    assert_rows_match(expected, got, rel=1e-6, abs=1e-6)
    names = ["model.safetensors", "value_head.safetensors"]
    if variant.get("ppo.critic") == "separate":
        names = ["model.safetensors", "critic/model.safetensors", "critic/value_head.safetensors"]
    for name in names:
        assert max_abs_diff(load_file(resumed / name), load_file(whole / name)) <= 1e-6, name
    for step in ("step_000000.jsonl", "step_000002.jsonl", "step_000004.jsonl"):
        assert (tmp_path / "resumed" / "samples" / step).read_text() == (
            tmp_path / "whole" / "samples" / step
        ).read_text()
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "resumed")  # a continuation from either is the same


def run_recording_gradients(config, clipped_gradients: list[torch.Tensor]) -> tuple[Path, list]:
    """Run; also return the gradient of every trainable parameter at each optimizer step (before clipping),
    as the ``clipped_gradients`` fixture records them."""
    clipped_gradients.clear()
    final = ppo.run(config)
    return final, list(clipped_gradients)


@pytest.mark.parametrize(
    "split",
    [{"batch.micro_size": 1}, {"batch.micro_tokens": 40}, {"batch.micro_size": 1, "ppo.top_entropy_quantile": 0.5}],
    ids=["rows", "tokens", "rows-entropy-mask"],
)
def test_micro_batching_gives_the_same_update(
    tiny_llama_dir, prompts_file, tmp_path, ragged, monkeypatch, split, clipped_gradients, adam_steps
):
    # one optimizer step on one minibatch of 8 ragged responses: in one pass, or in 8 micro-batches of 1, or in
    # micro-batches of at most 40 tokens (longest rows first), each cut to its own longest row. With the entropy
    # mask, the whole minibatch's entropies come from the fused first forward, the micro-batches' from the
    # rollout's pass: the same tokens are chosen.
    variant = {key: value for key, value in split.items() if key.startswith("ppo.")}
    split = {key: value for key, value in split.items() if key.startswith("batch.")}
    fields = {"ppo.steps": 1, "ppo.epochs": 1, "ppo.num_minibatches": 1} | variant
    whole, whole_grads = run_recording_gradients(
        make_config(tiny_llama_dir, prompts_file, tmp_path / "whole", **fields), clipped_gradients
    )
    plans = []
    planner = update.plan_micro_batches
    monkeypatch.setattr(update, "plan_micro_batches", lambda *a: plans.append(planner(*a)) or plans[-1])
    micro, micro_grads = run_recording_gradients(
        make_config(tiny_llama_dir, prompts_file, tmp_path / "micro", **split, **fields), clipped_gradients
    )
    # the rollout's pass and the update ran several micro-batches, of unequal widths
    described = [[(m.rows.tolist(), m.first_column, m.response_length) for m in plan] for plan in plans]
    assert len(plans) == 2 and described[0] == described[1] and len(plans[0]) > 1
    assert len({m.response_length - m.first_column for m in plans[0]}) > 1
    assert train_rows(tmp_path / "micro")[0]["policy/first_ratio_max_dev"] == 0.0
    # the accumulated gradient is the whole minibatch's (docs/architecture.md, conventions): float32 sums over 8 rows of ≤ 8
    # tokens in another grouping and at other padded widths (|g| ≤ 0.2): well inside rtol 1e-4 / atol 1e-6
    assert len(micro_grads) == len(whole_grads) > 0
    for g_micro, g_whole in zip(micro_grads, whole_grads, strict=True):
        torch.testing.assert_close(g_micro, g_whole, rtol=1e-4, atol=1e-6)
    # ... and each run's weights are exactly what one clipped AdamW step makes of its own gradient (the
    # trainable parameters: the policy's, then the zero-initialised value head's)
    initial = load_file(tiny_llama_dir / "model.safetensors")
    assert max_abs_diff(load_file(whole / "model.safetensors"), initial) > 5e-4  # the step moved the weights
    names = [name for name, _ in AutoModelForCausalLM.from_pretrained(tiny_llama_dir).named_parameters()]
    hidden = initial["model.embed_tokens.weight"].shape[1]
    initial |= {"value.linear.weight": torch.zeros(1, hidden), "value.linear.bias": torch.zeros(1)}
    names += ["value.linear.weight", "value.linear.bias"]
    for out, grads in ((whole, whole_grads), (micro, micro_grads)):
        predicted, tolerance = adam_steps(initial, [dict(zip(names, grads, strict=True))], [1e-3], 1.0)
        final = load_file(out / "model.safetensors")
        final |= {f"value.{k}": v for k, v in load_file(out / "value_head.safetensors").items()}
        for name in names:
            assert ((final[name] - predicted[name]).abs() <= tolerance[name]).all(), (out.parent.name, name)
    a, b = train_rows(tmp_path / "whole")[0], train_rows(tmp_path / "micro")[0]
    # the logged values sum 8 responses × ≤ 8 tokens in another grouping (per micro-batch, then added): float32 sums of
    # ≤ 64 terms, apart by ≲ 64·2⁻²⁴ of the terms' magnitudes; rel 1e-5 holds where the result is not
    # much smaller than them (losses, norms, entropy, KL), abs 1e-7 where it is near 0
    for key in ("policy/loss", "value/loss", "policy/entropy", "grad/norm", "kl/mean"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_fused_first_update_skips_the_old_logprob_pass_and_gives_the_same_model(
    tiny_llama_dir, prompts_file, tmp_path, ragged, monkeypatch, critic
):
    """One minibatch in one micro-batch: the first update's forward supplies the old log-probs and values
    (detached), so the no-grad pass is skipped. Forcing the pass back on gives the same weights and metrics — also when
    the fused run recomputes its activations in the backward pass (model.gradient_checkpointing: the graph kept from
    the rollout's phase is replayed in the update's backward)."""
    calls = {"no_grad_scores": 0}
    old_scores = Models.old_scores

    def counting_old_scores(self, *args, **kwargs):
        calls["no_grad_scores"] += 1
        return old_scores(self, *args, **kwargs)

    monkeypatch.setattr(Models, "old_scores", counting_old_scores)
    fields = {"ppo.steps": 3, "ppo.epochs": 2, "ppo.num_minibatches": 1, "ppo.critic": critic}
    checkpointing = {"model.gradient_checkpointing": True}
    fused = ppo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "fused", **fields, **checkpointing))
    assert calls["no_grad_scores"] == 0
    monkeypatch.setattr(ppo, "fuses_first_update", lambda config: False)
    unfused = ppo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "unfused", **fields))
    assert calls["no_grad_scores"] == 3  # one no-grad pass per step when the shortcut is off
    files = ["model.safetensors", "value_head.safetensors" if critic == "shared" else "critic/model.safetensors"]
    for name in files:
        assert max_abs_diff(load_file(fused / name), load_file(unfused / name)) == 0, name
    for a, b in zip(train_rows(tmp_path / "fused"), train_rows(tmp_path / "unfused"), strict=True):
        assert a["policy/first_ratio_max_dev"] == b["policy/first_ratio_max_dev"] == 0.0
        for key in ("policy/loss", "value/loss", "kl/mean", "grad/norm", "advantages/abs_mean"):
            assert a[key] == b[key], key


def test_first_update_is_fused_only_for_one_minibatch_in_one_micro_batch(tiny_llama_dir, prompts_file, tmp_path):
    config = make_config(tiny_llama_dir, prompts_file, tmp_path, **{"ppo.num_minibatches": 1})
    assert ppo.fuses_first_update(config)
    assert not ppo.fuses_first_update(
        dataclasses.replace(config, ppo=dataclasses.replace(config.ppo, num_minibatches=2))
    )  # the 2nd sees a new policy
    assert not ppo.fuses_first_update(
        dataclasses.replace(config, batch=dataclasses.replace(config.batch, micro_size=4))
    )  # advantages need all rows


# --------------------------------------------------------------------------------------------------------------
# Failing rewards, the command line
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("always_raises", r"reward 'always_raises', sample 0 \(completion .*\): raised ValueError: boom"),
        ("nan_on_second", r"reward 'nan_on_second', sample 1 \(completion .*\): score is nan"),
    ],
)
def test_failing_reward_stops_before_any_update(tiny_llama_dir, prompts_file, tmp_path, monkeypatch, function, message):
    steps: list[int] = []
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: steps.append(1))
    out = tmp_path / "run"
    with pytest.raises(RewardError, match=message):
        ppo.run(
            make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": reward(function), "run.save_every": 1})
        )
    assert steps == []
    assert not (out / "final").exists() and not (out / "checkpoints").exists()


def test_cli_runs_ppo_from_a_yaml_file(tiny_llama_dir, prompts_file, tmp_path):
    out = tmp_path / "run"
    config = {
        "model.name": str(tiny_llama_dir), "reward.source": reward("digit_count"), "data.train": str(prompts_file),
        "output_dir": str(out), "ppo.steps": 3, "batch.size": 4, "sampling.max_new_tokens": 6, "ppo.epochs": 1,
    }  # fmt: skip
    path = tmp_path / "ppo.yaml"
    path.write_text(yaml.safe_dump(nested(config)))
    assert cli.main(["ppo", "--config", str(path), "--ppo.steps", "1", "--run.no-progress"]) == 0
    assert [row["step"] for row in train_rows(out)] == [1]  # the flag won over the file
    assert (out / "final" / "model.safetensors").is_file()
    assert yaml.safe_load((out / "config.yaml").read_text())["ppo"]["steps"] == 1


# --------------------------------------------------------------------------------------------------------------
# (e) learning
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_reward_rises_on_a_toy_task(tiny_llama_dir, prompts_file, tmp_path):
    """A random-init 2-layer llama learns to write digits (reward = digits / 8 of an 8-token response).

    Observed (torch 2.13 CPU, these 50 iterations ≈ 4 s, seeds 0-7): the mean reward of the first 5
    iterations is 0.016-0.031, of the last 5 0.67-0.96, kl/mean ends at 25-33 nats; the margin asserted
    below (0.3) is half the weakest seed's.
    """
    out = tmp_path / "run"
    config = make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": reward("digit_count"), "ppo.steps": 50, "batch.size": 16, "ppo.epochs": 4, "ppo.num_minibatches": 1, "optim.learning_rate": 2e-3, "optim.scheduler": "constant", "kl.coef": 0.01})  # fmt: skip
    ppo.run(config)
    rows = train_rows(out)
    rewards = [row["reward/mean"] for row in rows]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, (first, last, rewards)
    assert all(math.isfinite(row["kl/mean"]) for row in rows)
    assert rows[-1]["kl/mean"] > 0  # the policy did move away from the reference


PPO_VARIANTS = {
    "cispo": {"ppo.loss_type": "cispo"},
    "sapo": {"ppo.loss_type": "sapo"},
    "gspo_token": {
        "ppo.importance_sampling_level": "sequence_token",
        "ppo.clip_range": 3e-4,
        "ppo.clip_range_high": 4e-4,
    },
    "vespo": {"ppo.loss_type": "vespo"},
    "delta": {"ppo.delta": 1.5},
}
"""The objectives and GSPO under PPO (GSPO with the paper's clip ranges: docs/grpo_variants.md)."""


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(PPO_VARIANTS))
def test_every_objective_raises_the_reward(tiny_llama_dir, prompts_file, tmp_path, variant):
    """The toy task of the test above under CISPO, SAPO, GSPO-token, VESPO and δ = 1.5. Observed over seeds 0-3 and
    both kernel families (docs/grpo_variants.md): first 5 iterations 0.020-0.041, last 5 CISPO 0.61-0.98, SAPO
    0.28-0.98, GSPO-token 0.79-0.95, VESPO 0.62-0.98, δ 0.51-0.96; the margin asserted (0.12) is half the weakest
    rise (SAPO's)."""
    out = tmp_path / "run"
    fields = {"reward.source": reward("digit_count"), "ppo.steps": 50, "batch.size": 16, "ppo.epochs": 4,
              "ppo.num_minibatches": 1, "optim.learning_rate": 2e-3, "optim.scheduler": "constant", "kl.coef": 0.01}  # fmt: skip
    ppo.run(make_config(tiny_llama_dir, prompts_file, out, **fields | PPO_VARIANTS[variant]))
    rewards = [row["reward/mean"] for row in train_rows(out)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.12, (first, last, rewards)


def test_final_is_written_by_rank_0_alone(tiny_llama_dir, tmp_path):
    """Under DDP every rank holds the whole policy and value function; only rank 0 writes final/ (another writer
    would race it for the directory)."""
    models = build_models(tiny_llama_dir, reward("constant_one"))
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    write_final(models, tokenizer, tmp_path / "final", Dist(rank=1, world_size=2, parallelism="ddp"))
    assert not (tmp_path / "final").exists()
    write_final(models, tokenizer, tmp_path / "final", SINGLE)
    assert {"model.safetensors", "value_head.safetensors", "tokenizer.json"} <= {
        p.name for p in (tmp_path / "final").iterdir()
    }
