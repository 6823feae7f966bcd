"""`rlhf grpo` end to end on tiny random-init models (test layers b-e, docs/architecture.md).

Each run is a real `rlhf.trainers.rl.grpo.run(config)` on the session's tiny llama with a few prompts: 1-4
iterations of 2 prompts × G = 4 samples, about a second each. The learning test runs 40 iterations.

Reward functions are the ppo tests' (``ppo_rewards.py``) and a few defined here, named as users do:
``file.py:function``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from configs import nested
from ensembles import MEMBERS, write_ensemble
from rlhf import cli
from rlhf.config import ConfigError, config_from_dict
from rlhf.models import sharding
from rlhf.models.loading import load_causal_lm
from rlhf.models.tiny import toy_corpus
from rlhf.runlog.distributed import SINGLE
from rlhf.trainers.rl import grpo
from rlhf.trainers.rl.models import Models
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

PPO_REWARDS = Path(__file__).resolve().parent / "ppo_rewards.py"

METRICS = [
    "step", "reward/mean", "reward/std", "reward/zero_std_groups", "policy/loss", "policy/entropy",
    "policy/clipfrac", "policy/approx_kl", "clip_ratio/low", "clip_ratio/high", "clip_ratio/region",
    "advantages/abs_mean", "grad/norm", "response/length_mean", "response/eos_rate", "time/rollout_s",
    "time/train_s", "time/step_s", "throughput/tokens_per_s", "policy/first_ratio_max_dev",
]  # fmt: skip


def reward(name: str) -> str:
    return f"{PPO_REWARDS}:{name}"


def local(name: str) -> str:
    return f"{Path(__file__).resolve()}:{name}"


# reward functions loaded from this file ------------------------------------------------------------------------


def half_constant(completions, constant, **kwargs):
    """0 for prompts flagged ``constant`` (a zero-signal group), the length in units of 10 chars otherwise."""
    return [0.0 if k else len(c) / 10 for c, k in zip(completions, constant, strict=True)]


def token_count_proxy(completions, **kwargs):
    """Words in the completion: differs between samples, on another scale than length_chars."""
    return [float(len(c.split())) for c in completions]


# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 prompts of 3-4 words (36 train, 4 held out); every other one flagged ``constant``."""
    path = tmp_path_factory.mktemp("grpo_prompts") / "prompts.jsonl"
    lines = toy_corpus(40, seed=5)
    rows = [{"prompt": " ".join(line.split()[: 3 + i % 2]), "constant": i % 2 == 0} for i, line in enumerate(lines)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def make_config(policy: Path, prompts: Path, out: Path, **overrides: object):
    """2 iterations of 2 prompts × 4 samples, 8 new tokens, 2 minibatches, no checkpoints."""
    values = {
        "model.name": str(policy),
        "reward.source": reward("length_chars"),
        "data.train": str(prompts),
        "output_dir": str(out),
        "grpo.steps": 2,
        "batch.size": 2,
        "grpo.group_size": 4,
        "sampling.max_new_tokens": 8,
        "optim.learning_rate": 1e-3,
        "grpo.num_minibatches": 2,
        "run.eval_every": 0,
        "run.save_every": 0,
        "run.progress": False,
    }
    return config_from_dict("grpo", nested(values | overrides))


@pytest.fixture
def micro_steps(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Records the stats of every micro-batch forward/backward of the run, in order."""
    return recording_micro_steps(monkeypatch, grpo)


# ---------------------------------------------------------------------------------------------------------------
# (d) smoke runs: every estimator × the aggregation modes, both reward aggregations
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_estimators_and_aggregations_run(tiny_llama_dir, prompts_file, tmp_path, micro_steps, estimator,
                                         aggregation):  # fmt: skip
    out = tmp_path / "run"
    final = grpo.run(make_config(tiny_llama_dir, prompts_file, out, **{"grpo.estimator": estimator, "grpo.loss_aggregation": aggregation, "grpo.steps": 1}))  # fmt: skip
    rows = train_rows(out)
    assert len(rows) == 1 and finite(rows[0], METRICS), rows
    assert rows[0]["policy/first_ratio_max_dev"] == 0.0
    assert rows[0]["advantages/abs_mean"] > 0
    assert "kl/mean" not in rows[0]  # kl_coef 0: no reference, no KL
    assert len(micro_steps) == 2 and micro_steps[0]["ratio_dev"] == 0.0
    initial = load_file(tiny_llama_dir / "model.safetensors")
    assert max_abs_diff(load_file(final / "model.safetensors"), initial) > 1e-4


def test_gdpo_logs_every_reward(tiny_llama_dir, prompts_file, tmp_path):
    rewards = [
        {"source": reward("length_chars"), "weight": 1.0, "name": "chars"},
        {"source": local("token_count_proxy"), "weight": 0.5, "name": "words"},
    ]
    out = tmp_path / "run"
    grpo.run(make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": rewards, "reward.aggregation": "gdpo", "grpo.estimator": "dr_grpo"}))  # fmt: skip
    for row in train_rows(out):
        assert {"reward/chars/mean", "reward/words/mean"} <= row.keys()
        assert row["reward/chars/mean"] > 0 and row["reward/words/mean"] > 0
        # reward/mean is the user's objective, the weighted sum of the raw rewards: every sample is scored by
        # both, so its mean is the weighted sum of the two means (float32 sums of 8 values ~ 1-10: rel 1e-5)
        expected = row["reward/chars/mean"] + 0.5 * row["reward/words/mean"]
        assert row["reward/mean"] == pytest.approx(expected, rel=1e-5)
        # GDPO's combined value, normalised over the batch, has its own name: mean 0 (before any penalty)
        assert abs(row["reward/normalized_mean"]) < 1e-5
        assert finite(row, METRICS)


def test_constant_reward_gives_zero_advantages_and_loss(tiny_llama_dir, prompts_file, tmp_path):
    out = tmp_path / "run"
    final = grpo.run(make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": reward("constant_one")}))
    for row in train_rows(out):
        assert row["reward/zero_std_groups"] == 1.0
        assert row["advantages/abs_mean"] == 0.0 and row["policy/loss"] == 0.0 and row["grad/norm"] == 0.0
    # zero gradients: AdamW with weight_decay 0 leaves the weights exactly as they were
    assert max_abs_diff(load_file(final / "model.safetensors"), load_file(tiny_llama_dir / "model.safetensors")) == 0


# ---------------------------------------------------------------------------------------------------------------
# The reference model: none at kl_coef 0
# ---------------------------------------------------------------------------------------------------------------


def storage_bytes(modules: list[torch.nn.Module]) -> int:
    storages: dict[int, int] = {}
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(storages.values())


def held_modules(models: Models) -> list[torch.nn.Module]:
    held = [models.policy, models.reference.copy if models.reference else None, models.value_module()]
    return [m for m in held if m is not None]


def test_kl_coef_zero_holds_one_model(tiny_llama_dir, monkeypatch):
    base = storage_bytes([load_causal_lm(str(tiny_llama_dir))])
    with monkeypatch.context() as patch:
        patch.setattr(sharding, "frozen_copy", lambda model: pytest.fail("kl_coef 0 must not copy the policy"))
        none = Models(make_config(tiny_llama_dir, Path("x"), Path("y")), SINGLE)
    assert none.reference is None
    assert storage_bytes(held_modules(none)) == base
    with_ref = Models(make_config(tiny_llama_dir, Path("x"), Path("y"), **{"kl.coef": 0.1}), SINGLE)
    assert with_ref.reference.copy is not None
    assert storage_bytes(held_modules(with_ref)) == 2 * base


@pytest.mark.parametrize(
    "overrides",
    [
        {"kl.coef": 0.1},
        {"kl.coef": 0.1, "grpo.use_bias_correction_kl": False},
        {"kl.coef": 0.1, "kl.add_to": "reward", "grpo.estimator": "reinforce_pp", "kl.estimator": "k1"},
        {"kl.coef": 0.1, "model.lora": {"r": 4, "alpha": 8.0}},
    ],
    ids=["loss-k3-bias-corrected", "loss-k3-plain", "reward-reinforce_pp", "lora"],
)
def test_kl_runs(tiny_llama_dir, prompts_file, tmp_path, overrides):
    out = tmp_path / "run"
    grpo.run(make_config(tiny_llama_dir, prompts_file, out, **overrides))
    rows = train_rows(out)
    for row in rows:
        assert finite(row, METRICS + ["kl/mean", "kl/estimator_mean"])
        assert ("kl/loss_mean" in row) == (overrides.get("kl.add_to", "loss") == "loss")
    assert rows[0]["kl/mean"] == 0.0  # step 1 samples from the initial policy: it is the reference
    assert rows[1]["kl/mean"] != 0.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"grpo.delta": 1.2}, "grpo.delta=1.2 must exceed 1 + clip_range_high = 1.2"),
        ({"grpo.delta": 4.0, "grpo.loss_type": "sapo"}, "loss_type 'sapo' has no such ratio"),
        (
            {"grpo.loss_type": "vespo", "grpo.importance_sampling_level": "sequence"},
            "importance_sampling_level to token",
        ),
        ({"grpo.loss_type": "vespo", "sampling.is_correction": "token"}, "folds the sampler's ratio into VESPO's"),
    ],
)
def test_delta_and_vespo_refuse_what_they_cannot_mean(tiny_llama_dir, prompts_file, tmp_path, fields, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_config(tiny_llama_dir, prompts_file, tmp_path / "run", **fields)


def test_luspo_and_vespo_choose_their_objective_and_aggregation(tiny_llama_dir, prompts_file, tmp_path):
    # LUSPO is the clip with each sequence's token-sum (its loss scaled by its length), averaged over sequences;
    # VESPO its own objective, token-mean (TRL's normalisation of both)
    luspo = make_config(tiny_llama_dir, prompts_file, tmp_path, **{"grpo.loss_type": "luspo"})
    vespo = make_config(tiny_llama_dir, prompts_file, tmp_path, **{"grpo.loss_type": "vespo"})
    assert (luspo.policy_objective, luspo.loss_aggregation) == ("clip", "seq-mean-token-sum")
    assert (vespo.policy_objective, vespo.loss_aggregation) == ("vespo", "token-mean")


# ---------------------------------------------------------------------------------------------------------------
# μ > 1, clip-higher, micro-batching, masking, DAPO options
# ---------------------------------------------------------------------------------------------------------------


def test_num_iterations_reuses_the_rollout(tiny_llama_dir, prompts_file, tmp_path, micro_steps):
    out = tmp_path / "run"
    grpo.run(make_config(tiny_llama_dir, prompts_file, out, **{"grpo.num_iterations": 2, "batch.micro_size": 2, "grpo.clip_range": 0.2, "grpo.clip_range_high": 0.28}))  # fmt: skip
    # per step: 2 iterations × 2 minibatches × 2 micro-batches
    assert len(micro_steps) == 16
    for first in (micro_steps[0], micro_steps[8]):
        assert first["ratio_dev"] == 0.0 and first["policy/clipfrac"] == 0.0
    assert any(call["ratio_dev"] > 0 for call in micro_steps[4:8])  # iteration 2 sees the updated policy
    assert all(row["policy/first_ratio_max_dev"] == 0.0 for row in train_rows(out))


def test_dynamic_sampling_fills_the_batch(tiny_llama_dir, prompts_file, tmp_path, monkeypatch):
    sizes: list[int] = []
    original = grpo.make_rollout

    def recording(config, models, sampled, *rest):
        sizes.append(len(sampled.generated.completions))
        assert not torch.isnan(sampled.rewards).any()
        signal = grpo.groups_with_signal(sampled.rewards.view(-1, config.grpo.group_size))
        assert signal.all(), sampled.rewards  # only groups whose rewards differ were kept
        return original(config, models, sampled, *rest)

    monkeypatch.setattr(grpo, "make_rollout", recording)
    out = tmp_path / "run"
    grpo.run(make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": local("half_constant"), "grpo.dynamic_sampling": True, "batch.size": 4, "grpo.steps": 2}))  # fmt: skip
    assert sizes == [16, 16]
    for row in train_rows(out):
        # half the prompts are constant: each round keeps ≈ half its groups, so it takes ≥ 2 rounds
        assert row["dynamic_sampling/rounds"] >= 2 and row["dynamic_sampling/dropped_groups"] >= 2
        assert row["dynamic_sampling/filled_groups"] == 0
        assert row["reward/zero_std_groups"] > 0


def test_overlong_penalty_and_truncation_mask(tiny_llama_dir, prompts_file, tmp_path):
    # buffer 4 of 8 tokens, factor 0.5: a response cut at 8 tokens gets −0.5, one that stopped within 4 tokens
    # gets 0, in between linear. A random-init model rarely stops, so most responses take the full −0.5.
    out = tmp_path / "run"
    grpo.run(make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": reward("constant_one"), "grpo.overlong_buffer": 4, "grpo.overlong_penalty_factor": 0.5, "grpo.mask_truncated_completions": True}))  # fmt: skip
    for row in train_rows(out):
        eos = row["response/eos_rate"]
        penalty = row["reward/overlong_penalty_mean"]
        assert -0.5 <= penalty <= -0.5 * (1 - eos) and penalty < -0.25
        assert row["reward/score_mean"] == pytest.approx(1.0 + penalty)  # the constant score 1, penalised
        assert row["reward/mean"] == 1.0  # the reward sources' own value
        # truncated responses are out of the loss (and the length cap is never reached by a stopped one)
        assert row["response/masked_fraction"] == pytest.approx(1 - eos)


@pytest.mark.parametrize(
    "split",
    [
        {"batch.micro_size": 2},
        {"batch.micro_tokens": 30},
        {"batch.micro_size": 2, "grpo.top_entropy_quantile": 0.5, "grpo.loss_type": "sapo"},
        {"batch.micro_tokens": 30, "grpo.importance_sampling_level": "sequence", "grpo.loss_type": "cispo"},
        {"batch.micro_size": 2, "grpo.loss_type": "vespo", "grpo.loss_aggregation": None},
        {
            "batch.micro_tokens": 30,
            "grpo.loss_type": "luspo",
            "grpo.importance_sampling_level": "sequence",
            "grpo.delta": 1.5,
            "grpo.loss_aggregation": None,
        },
    ],  # fmt: skip
    ids=["rows", "tokens", "rows-entropy-mask-sapo", "tokens-gspo-cispo", "rows-vespo", "tokens-luspo-gspo-delta"],
)
def test_micro_batching_gives_the_same_update(
    tiny_llama_dir, prompts_file, tmp_path, ragged, split, clipped_gradients, adam_steps
):
    # 8 ragged completions in one pass, or in micro-batches of 2 rows, or of at most 30 tokens (longest
    # first), each cut to its own longest row; with a reference, so the rollout's pass gives the old log-probs
    # (and the KL term, bias-corrected by default, is in every loss).
    # The entropy mask is chosen over the whole rollout, so it too is the same whatever the micro-batches.
    variant = {key: value for key, value in split.items() if key.startswith("grpo.")}
    split = {key: value for key, value in split.items() if key.startswith("batch.")}
    fields = {
        "grpo.steps": 1,
        "grpo.num_minibatches": 1,
        "grpo.loss_aggregation": "seq-mean-token-mean",
        "kl.coef": 0.05,
    } | variant
    whole = grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "whole", **fields))
    whole_grads = list(clipped_gradients)
    clipped_gradients.clear()
    micro = grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "micro", **split, **fields))
    micro_grads = list(clipped_gradients)
    a, b = train_rows(tmp_path / "whole")[0], train_rows(tmp_path / "micro")[0]
    # the logged values sum 8 completions × ≤ 8 tokens in another grouping (per micro-batch, then added): float32 sums of
    # ≤ 64 terms, apart by ≲ 64·2⁻²⁴ of the terms' magnitudes; rel 1e-5 holds where the result is not
    # much smaller than them (losses, norms, entropy, KL), abs 1e-7 where it is near 0
    for key in ("policy/loss", "grad/norm", "policy/entropy", "kl/mean"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    assert b["policy/first_ratio_max_dev"] == 0.0
    # the same gradient: float32 sums over 8 rows of ≤ 8 tokens in another grouping (|g| ≤ 1)
    assert len(micro_grads) == len(whole_grads) > 0
    for g_micro, g_whole in zip(micro_grads, whole_grads, strict=True):
        torch.testing.assert_close(g_micro, g_whole, rtol=1e-4, atol=1e-6)
    # ... and each run's weights are exactly one clipped AdamW step of its own gradient
    initial = load_file(tiny_llama_dir / "model.safetensors")
    names = [name for name, _ in AutoModelForCausalLM.from_pretrained(tiny_llama_dir).named_parameters()]
    for out, grads in ((whole, whole_grads), (micro, micro_grads)):
        predicted, tolerance = adam_steps(initial, [dict(zip(names, grads, strict=True))], [1e-3], 1.0)
        final = load_file(out / "model.safetensors")
        for name in names:
            assert ((final[name] - predicted[name]).abs() <= tolerance[name]).all(), (out.parent.name, name)


# ---------------------------------------------------------------------------------------------------------------
# Resume, the command line
# ---------------------------------------------------------------------------------------------------------------


def test_resume_reproduces_the_uninterrupted_run(tiny_llama_dir, prompts_file, tmp_path, monkeypatch):
    fields = {"grpo.steps": 4, "run.save_every": 2, "run.eval_every": 2, "kl.coef": 0.1, "grpo.num_iterations": 2,
              "grpo.dynamic_sampling": True, "reward.source": local("half_constant")}  # fmt: skip
    whole = grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "whole", **fields))
    with dies_after_checkpoint(monkeypatch, 2):
        grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "resumed", **fields))
    with counting(monkeypatch, grpo, "grpo_update") as updates:
        resumed = grpo.run(
            make_config(tiny_llama_dir, prompts_file, tmp_path / "resumed", **{"run.resume": True}, **fields)
        )
    assert len(updates) == 2  # it continued at iteration 3

    expected, got = comparable(metric_rows(tmp_path / "whole")), comparable(metric_rows(tmp_path / "resumed"))
    assert [row["step"] for row in got] == [row["step"] for row in expected] == [0, 1, 2, 3, 4]
    # the resumed run repeats the uninterrupted run's float32 operations in the same order, so it gives the
    # same bits; the bounds (a few ulp of values ≤ 8: 8·2⁻²³ ≈ 1e-6) is not a measured noise level
    assert_rows_match(expected, got, rel=1e-6, abs=1e-6)
    assert max_abs_diff(load_file(resumed / "model.safetensors"), load_file(whole / "model.safetensors")) <= 1e-6
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "resumed")  # a continuation from either is the same


def test_cli_runs_grpo_from_a_yaml_file(tiny_llama_dir, prompts_file, tmp_path):
    out = tmp_path / "run"
    config = {
        "model.name": str(tiny_llama_dir), "reward.source": "rlhf.rollout.verifiers:length_penalty",
        "data.train": str(prompts_file), "output_dir": str(out), "grpo.steps": 3, "batch.size": 2, "grpo.group_size": 2,
        "sampling.max_new_tokens": 6,
    }  # fmt: skip
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(nested(config)))
    assert cli.main(["grpo", "--config", str(path), "--grpo.steps", "1", "--run.no-progress"]) == 0
    assert [row["step"] for row in train_rows(out)] == [1]
    assert train_rows(out)[0]["reward/mean"] < 0  # the built-in length penalty, resolved by module name
    assert (out / "final" / "model.safetensors").is_file()


# ---------------------------------------------------------------------------------------------------------------
# (e) learning
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_reward_rises_on_a_toy_task(tiny_llama_dir, prompts_file, tmp_path):
    """A random-init 2-layer llama learns to write digits (reward = digits / 8 of an 8-token response).

    Observed (torch CPU, 60 iterations of 4 prompts × G = 8 ≈ 2.5 s, seeds 0-7): the mean reward of the first
    5 iterations is 0.020-0.030, of the last 5 0.91-0.97 (after 40 iterations: 0.29-0.47). The margin asserted
    (0.45) is half the weakest seed's rise.
    """
    out = tmp_path / "run"
    config = make_config(tiny_llama_dir, prompts_file, out, **{"reward.source": reward("digit_count"), "grpo.steps": 60, "batch.size": 4, "grpo.group_size": 8, "grpo.num_minibatches": 1, "optim.learning_rate": 2e-3, "optim.scheduler": "constant", "sampling.temperature": 1.0})  # fmt: skip
    grpo.run(config)
    rewards = [row["reward/mean"] for row in train_rows(out)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.45, (first, last, rewards)


VARIANTS = {
    "grpo": {"grpo.loss_type": "grpo"},
    "dr_grpo": {"grpo.loss_type": "dr_grpo"},
    "bnpo": {"grpo.loss_type": "bnpo"},
    "cispo": {"grpo.loss_type": "cispo"},
    "sapo": {"grpo.loss_type": "sapo"},
    "gspo": {"grpo.loss_type": "grpo", "grpo.importance_sampling_level": "sequence"},
    "gspo_token": {"grpo.importance_sampling_level": "sequence_token"},
    "top_entropy": {"grpo.top_entropy_quantile": 0.2, "grpo.steps": 80},  # a fifth of the tokens: slower
    "off_policy_mask": {"grpo.off_policy_mask_threshold": 0.02, "grpo.num_iterations": 2},
    "luspo": {"grpo.loss_type": "luspo", "grpo.importance_sampling_level": "sequence"},  # the paper's: GSPO's ratio
    "vespo": {"grpo.loss_type": "vespo"},
    "delta": {"grpo.delta": 1.5, "grpo.num_iterations": 2},  # a second pass, so that ratios move past δ
    "kl_bias_corrected": {"kl.coef": 0.04},  # TRL's default use_bias_correction_kl, with the β of TRL's old default
}
"""The GRPO family's switches, each on its own (the default, dapo, is the test above); the two GSPO runs and the
off-policy mask see moved ratios through the learning rate's drift between minibatches / iterations."""


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_raises_the_reward(tiny_llama_dir, prompts_file, tmp_path, variant):
    """The toy task of the test above (digits / 8), 40 iterations of 4 prompts × G = 8 in 2 minibatches, for every
    loss type, GSPO, entropy masking, the off-policy mask, δ and the bias-corrected KL term. Observed over seeds
    0-3 and both kernel families (docs/grpo_variants.md): the first 5 iterations' mean reward 0.020-0.039, the
    last 5's 0.965-0.999 (with the KL term at β = 0.04: 0.92-0.96), the weakest rise 0.90; entropy masking trains
    on a fifth of the tokens and needs 80 iterations for the same (at 40: 0.16-0.54). The margin asserted (0.45)
    is about half the weakest rise."""
    out = tmp_path / "run"
    fields = {"reward.source": reward("digit_count"), "grpo.steps": 40, "batch.size": 4, "grpo.group_size": 8,
              "grpo.num_minibatches": 2, "optim.learning_rate": 2e-3, "optim.scheduler": "constant",
              "sampling.temperature": 1.0}  # fmt: skip
    grpo.run(make_config(tiny_llama_dir, prompts_file, out, **fields | VARIANTS[variant]))
    rows = train_rows(out)
    rewards = [row["reward/mean"] for row in rows]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.45, (first, last, rewards)
    if variant == "top_entropy":  # 80 % of the loss tokens left out, fewer once a sure policy's entropies tie
        masked = [row["policy/entropy_masked_fraction"] for row in rows]
        assert masked[0] == pytest.approx(0.8, abs=0.02) and max(masked) <= 0.81, masked  # ≤ 256 tokens: ±1/256
    if variant == "off_policy_mask":
        assert max(row["policy/off_policy_masked"] for row in rows) > 0  # the second pass saw drifted sequences


@pytest.mark.parametrize("staleness", [0, 1])
def test_on_policy_update_skips_the_old_logprob_pass_and_gives_the_same_model(
    tiny_llama_dir: Path, prompts_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staleness: int
):
    """One minibatch, one iteration, no reference: the old log-probs come from the training forward (detached)
    instead of a no-grad pass. Forcing the pass back on must give the same weights and metrics. Asynchronous too
    (sampling.max_staleness 1): the proximal policy is the weights at the update's start, that forward's own, and
    the importance weights against the sampling worker's log-probs are the same from either."""
    calls = {"no_grad_scores": 0}
    old_scores = Models.old_scores

    def counting_old_scores(self, *args, **kwargs):
        calls["no_grad_scores"] += 1
        return old_scores(self, *args, **kwargs)

    monkeypatch.setattr(Models, "old_scores", counting_old_scores)
    overrides = {"grpo.num_minibatches": 1, "grpo.steps": 3, "kl.coef": 0.0}
    if staleness:
        overrides |= {"sampling.max_staleness": staleness, "sampling.is_correction": "token"}
    skipped = grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "skip", **overrides))
    assert calls["no_grad_scores"] == 0
    monkeypatch.setattr(grpo, "on_policy", lambda config, models: False)
    with_pass = grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "pass", **overrides))
    assert calls["no_grad_scores"] == 3  # one no-grad pass per step when the shortcut is off
    assert max_abs_diff(load_file(skipped / "model.safetensors"), load_file(with_pass / "model.safetensors")) == 0
    for a, b in zip(train_rows(tmp_path / "skip"), train_rows(tmp_path / "pass"), strict=True):
        assert a["policy/first_ratio_max_dev"] == b["policy/first_ratio_max_dev"] == 0.0
        assert a["policy/loss"] == pytest.approx(b["policy/loss"], abs=1e-7)
        assert a.get("rollout/is_weight_mean") == b.get("rollout/is_weight_mean")


def test_old_logprob_pass_stays_when_the_policy_moves_within_a_step(tiny_llama_dir: Path, prompts_file: Path,
                                                                     tmp_path: Path):  # fmt: skip
    config = make_config(tiny_llama_dir, prompts_file, tmp_path, **{"grpo.num_minibatches": 2, "kl.coef": 0.0})
    models = Models(config, SINGLE)
    assert not grpo.on_policy(config, models)  # a second minibatch sees an updated policy
    assert not grpo.on_policy(
        dataclasses.replace(config, grpo=dataclasses.replace(config.grpo, num_minibatches=1, num_iterations=2)), models
    )
    assert grpo.on_policy(dataclasses.replace(config, grpo=dataclasses.replace(config.grpo, num_minibatches=1)), models)


def test_grpo_trains_on_a_reward_model_ensemble_and_logs_its_disagreement(
    tokenizer_dir, tiny_llama_dir, prompts_file, tmp_path
):
    """`reward.source` an ensemble directory: one reward (here uwo of 3 members), its members' spread and means
    logged on every step (tests/rollout/test_ensemble.py checks the numbers)."""
    ensemble_dir = write_ensemble(tmp_path / "rm", tokenizer_dir)
    fields = {"reward.source": str(ensemble_dir), "reward.ensemble.objective": "uwo"}
    grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "run", **fields))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if "reward/mean" in row]
    assert len(trained) == 2
    for row in trained:
        assert row["reward/rm/ensemble_std"] > 0 and {f"reward/rm/member_{m}" for m in range(MEMBERS)} <= set(row)
