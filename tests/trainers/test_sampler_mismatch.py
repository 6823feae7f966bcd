"""The sampler/trainer mismatch in ppo and grpo with rlhf's own engines: measured every step, the same whichever pass
supplies the trainer's side, and the importance-sampling correction's weights (`is_weights`).
vLLM's side of the same: tests/vllm_engine/test_vllm_training.py."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from test_grpo import make_config, prompts_file  # noqa: F401 (a fixture)

from rlhf.trainers.rl import grpo
from rlhf.trainers.rl.updates import is_weights
from runs import train_rows

MISMATCH = ["rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/logprob_diff_frac"]


def test_the_correction_weights_are_the_capped_ratios(tiny_llama_dir, prompts_file, tmp_path):  # noqa: F811
    config = make_config(tiny_llama_dir, prompts_file, tmp_path, **{"sampling.is_correction": "token", "sampling.is_cap": 2.0})  # fmt: skip
    old = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.1, 0.3]]))
    sampler = torch.log(torch.tensor([[0.5, 0.2, 0.3], [0.4, 0.1, 0.9]]))  # ratios 1, 2.5, 3 | 0.5, 1, 1/3
    mask = torch.tensor([[True, True, True], [True, True, False]])
    weights, stats = is_weights(config, old, sampler, mask)
    # token level, truncated at 2: 1, 2, 2 | 0.5, 1, and 1 at padding (its difference counts as 0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 2.0, 2.0], [0.5, 1.0, 1.0]]))
    assert stats["rollout/is_weight_mean"] == pytest.approx((1 + 2 + 2 + 0.5 + 1) / 5)
    assert stats["rollout/is_capped_frac"] == pytest.approx(2 / 5)
    sampling = dataclasses.replace(config.sampling, is_correction="sequence", is_mode="mask")
    weights, stats = is_weights(dataclasses.replace(config, sampling=sampling), old, sampler, mask)
    # sequence level: row 0's ratio 1·2.5·3 = 7.5 > 2 → masked; row 1's 0.5·1 = 0.5 (its padding does not count)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.5, 0.5]]))
    assert stats["rollout/is_capped_frac"] == pytest.approx(3 / 5)
    sampling = dataclasses.replace(config.sampling, is_correction="none")
    assert is_weights(dataclasses.replace(config, sampling=sampling), old, None, mask) == (None, {})


def test_the_correction_needs_the_engines_logprobs(tiny_llama_dir, prompts_file, tmp_path):  # noqa: F811
    config = make_config(tiny_llama_dir, prompts_file, tmp_path, **{"sampling.is_correction": "token"})
    with pytest.raises(RuntimeError, match="needs the engine's log-probs"):
        is_weights(config, torch.zeros(1, 2), None, torch.ones(1, 2, dtype=torch.bool))


def test_grpo_measures_the_mismatch_alike_on_policy_and_with_the_old_logprob_pass(
    tiny_llama_dir,
    prompts_file,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """On-policy the update's own forward gives the trainer's side; forced off, the no-grad pass does. Same numbers.
    Our engine draws from the trainer's distribution without PAD, so the gap is log(1 − p_pad) plus rounding."""
    overrides = {"grpo.num_minibatches": 1, "grpo.steps": 2, "kl.coef": 0.0, "sampling.is_correction": "token"}
    grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "on", **overrides))
    monkeypatch.setattr(grpo, "on_policy", lambda config, models: False)
    grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "off", **overrides))
    on, off = train_rows(tmp_path / "on"), train_rows(tmp_path / "off")
    for a, b in zip(on, off, strict=True):
        for key in [*MISMATCH, "rollout/is_weight_mean"]:
            # the same forward, once with gradients: float32 rounding of log-softmaxes (~1e-7 each)
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
        assert 0 < a["rollout/logprob_diff_mean"] <= a["rollout/logprob_diff_max"] < 0.05
        assert a["rollout/logprob_diff_frac"] == 0  # nothing near 0.5 nats
        assert 0.95 < a["rollout/is_weight_mean"] <= 1  # π_trainer ≤ π_sampler: the sampler leaves PAD's mass out
        assert a["rollout/is_capped_frac"] == 0


def test_ppo_logs_the_mismatch_every_step(tiny_llama_dir, prompts_file, tmp_path):  # noqa: F811
    from test_ppo import make_config as ppo_config

    from rlhf.trainers.rl import ppo

    ppo.run(ppo_config(tiny_llama_dir, prompts_file, tmp_path))
    for row in train_rows(tmp_path):
        assert all(math.isfinite(row[key]) for key in MISMATCH)
        assert row["rollout/logprob_diff_max"] < 0.05
        assert "rollout/is_weight_mean" not in row  # is_correction: none
