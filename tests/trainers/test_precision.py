"""Mixed precision (``model.bf16``) and pure bfloat16 (``model.dtype: bfloat16``) in every command, on the CPU.

CPU autocast computes in bfloat16 as CUDA's does, so these runs go through the same code a GPU run takes: the
forward hooks, the rollout's autocast region, the lean decoder's bfloat16 products, bfloat16 frozen models and
float32 log-probs. What mixed precision must keep (float32 master weights and AdamW state, gradients in float32)
and what pure bfloat16 loses (updates under a weight's spacing) are checked directly.
"""

# ruff: noqa: F811 - the fixtures imported from the trainers' tests are parameters of the tests here
from __future__ import annotations

import math
from pathlib import Path

import pytest
import test_dpo
import test_grpo
import test_ppo
import test_reward_model
import test_sft
import torch
from safetensors.torch import load_file
from test_dpo import data as dpo_data  # noqa: F401 (a fixture)
from test_ppo import make_config, prompts_file  # noqa: F401 (prompts_file: a fixture)
from test_sft import data_dir  # noqa: F401 (a fixture)
from transformers import AutoModelForCausalLM

from configs import nested
from rlhf import evaluate, sample
from rlhf.config import config_from_dict
from rlhf.doctor.rules import History
from rlhf.doctor.watch import diagnose
from rlhf.models.precision import compute_dtype, compute_in_bf16
from rlhf.models.sharding import load_policy
from rlhf.rollout.decoder import build_decoder
from rlhf.runlog.distributed import SINGLE
from rlhf.trainers import dpo, reward_model, sft, update
from rlhf.trainers.rl import grpo, ppo
from runs import finite, metric_rows, train_rows

MIXED = {"model.bf16": True}
PURE = {"model.dtype": "bfloat16", "model.bf16": False}
PRECISIONS = {"mixed": MIXED, "pure": PURE}


def _weights_dtypes(directory: Path) -> set[torch.dtype]:
    return {t.dtype for t in load_file(directory / "model.safetensors").values() if t.is_floating_point()}


# --------------------------------------------------------------------------------------------------------------
# The mechanism
# --------------------------------------------------------------------------------------------------------------


def test_a_hooked_model_computes_in_bf16_and_keeps_float32_weights_and_gradients(tiny_llama_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    ids = torch.tensor([[5, 9, 13, 17, 21]])
    reference = model(input_ids=ids).logits
    compute_in_bf16(model, torch.device("cpu"))
    assert compute_dtype(model) == torch.bfloat16
    logits = model(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16  # the head's product ran in bfloat16
    assert not torch.is_autocast_enabled("cpu")  # the region ended with the forward
    # bfloat16 keeps 8 bits of mantissa: each product's inputs are rounded by ≤ 2⁻⁹ relative, so logits of this
    # tiny model (|l| ≲ 3, two layers) land within a few hundredths of float32's
    torch.testing.assert_close(logits.float(), reference, rtol=0, atol=0.05)
    logits.float().logsumexp(-1).sum().backward()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == {torch.float32}


def test_a_forward_that_raises_leaves_no_autocast_region_open(tiny_llama_dir):
    model = compute_in_bf16(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), torch.device("cpu"))
    with pytest.raises(Exception):  # noqa: B017 - any error of the model's own
        model(input_ids=torch.tensor([[10**6]]))  # an id past the vocabulary
    assert not torch.is_autocast_enabled("cpu")


@torch.no_grad()
def test_the_lean_decoder_in_mixed_precision_gives_the_models_autocast_logits(tiny_llama_dir):
    """The decoder packs bfloat16 weights and keeps the residual stream in float32, as the model under autocast
    does: its logits agree with the hooked model's forward to bfloat16's rounding of the logits (|l| ≲ 3:
    spacing ≤ 2⁻⁶ ≈ 0.016), not to float32's."""
    model = compute_in_bf16(AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval(), torch.device("cpu"))
    ids = torch.tensor([[0, 0, 7, 8, 9], [3, 4, 5, 6, 7]])
    mask = (torch.arange(5) >= torch.tensor([[2], [0]])).long()
    decoder = build_decoder(model, 5 + 3, rows=2)
    assert decoder.weights.dtype == torch.bfloat16
    from rlhf.data.collate import position_ids_from_mask

    positions = position_ids_from_mask(mask)
    expected = model(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(decoder.prefill(ids, mask).float(), expected[:, -1].float(), rtol=0, atol=0.05)


@pytest.mark.parametrize(
    ("dtype", "lr", "expected"),
    [
        # a bfloat16 weight of 0.02 sits between neighbours 2⁻¹³ ≈ 1.2e-4 apart: Adam's first step of size lr
        # (m̂/√v̂ = ±1) moves it by 1e-6, which rounds back to 0.02 — and by 1e-3, which it cannot round away
        (torch.bfloat16, 1e-6, 0.0),
        (torch.bfloat16, 1e-3, 1.0),
        # float32's spacing at 0.02 is 1.9e-9: a step of 1e-6 is kept
        (torch.float32, 1e-6, 1.0),
    ],
)
def test_changed_share_counts_the_weights_a_step_moved(dtype, lr, expected):
    weight = torch.nn.Parameter(torch.full((64, 8), 0.02, dtype=dtype))
    weight.grad = torch.ones_like(weight)
    weight.grad[:, :4] = 0  # no gradient: AdamW leaves them alone in any precision, so they are not counted
    optimizer = torch.optim.AdamW([weight], lr=lr, weight_decay=0.0)
    with update.changed_share([weight], SINGLE) as changed:
        optimizer.step()
    assert changed[0] == expected


def test_no_gradient_at_all_is_not_a_share():
    weight = torch.nn.Parameter(torch.ones(4))
    with update.changed_share([weight], SINGLE) as changed:
        pass
    assert math.isnan(changed[0])


def test_the_reference_copy_is_bf16_under_mixed_precision_unless_set(tiny_llama_dir):
    section = make_config(tiny_llama_dir, Path("p.jsonl"), Path("out"), **MIXED).model
    policy, copy = load_policy(section, SINGLE, reference=True)
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    assert compute_dtype(policy) == torch.bfloat16
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    explicit = make_config(
        tiny_llama_dir, Path("p.jsonl"), Path("out"), **MIXED, **{"model.reference_dtype": "float32"}
    )
    assert {p.dtype for p in load_policy(explicit.model, SINGLE, reference=True)[1].parameters()} == {torch.float32}


def test_bf16_is_off_on_the_cpu_by_default_and_refused_with_float16_weights(tiny_llama_dir):
    section = make_config(tiny_llama_dir, Path("p.jsonl"), Path("out")).model
    assert section.bf16 is None
    policy, copy = load_policy(section, SINGLE, reference=True)
    assert compute_dtype(policy) is None and {p.dtype for p in copy.parameters()} == {torch.float32}
    with pytest.raises(Exception, match="bf16: mixed precision with float16 weights"):
        make_config(tiny_llama_dir, Path("p.jsonl"), Path("out"), **{"model.bf16": True, "model.dtype": "float16"})


# --------------------------------------------------------------------------------------------------------------
# Every trainer, in both precisions
# --------------------------------------------------------------------------------------------------------------


def _check_rows(out: Path, keys: tuple[str, ...]) -> list[dict]:
    rows = [row for row in metric_rows(out) if keys[0] in row]  # the training rows (not step 0's evaluation)
    assert rows
    for row in rows:
        assert finite(row, keys), row
        assert 0.0 <= row["update/changed_frac"] <= 1.0
    return rows


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("variant", ["shared", "separate", "lora", "fused"])
def test_ppo_runs(tiny_llama_dir, prompts_file, tmp_path, precision, variant):
    fields = {
        "shared": {"ppo.critic": "shared"},
        "separate": {"ppo.critic": "separate", "batch.micro_size": 2},
        "lora": {"model.lora": {"r": 4, "alpha": 8, "dropout": 0.0}},
        "fused": {"ppo.num_minibatches": 1, "ppo.epochs": 1},
    }[variant]
    if variant == "lora" and precision == "pure":
        pytest.skip("LoRA's adapters train in float32 over a bfloat16 base: that is the mixed case")
    out = tmp_path / "run"
    final = ppo.run(make_config(tiny_llama_dir, prompts_file, out, **PRECISIONS[precision], **fields))
    rows = _check_rows(out, ("reward/mean", "kl/mean", "policy/loss", "value/loss", "grad/norm"))
    assert rows[0]["policy/first_ratio_max_dev"] == 0.0  # the rollout's pass and the first update agree exactly
    # mixed: the master weights are what is saved; pure: the bfloat16 weights
    assert _weights_dtypes(final) == {torch.float32 if precision == "mixed" else torch.bfloat16}


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_grpo_runs(tiny_llama_dir, prompts_file, tmp_path, precision):
    out = tmp_path / "run"
    config = test_grpo.make_config(tiny_llama_dir, prompts_file, out, **PRECISIONS[precision], **{"kl.coef": 0.05})
    final = grpo.run(config)
    _check_rows(out, ("reward/mean", "kl/mean", "policy/loss", "grad/norm"))
    assert _weights_dtypes(final) == {torch.float32 if precision == "mixed" else torch.bfloat16}


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_sft_rm_and_dpo_run(tiny_llama_dir, tiny_reward_model_dir, data_dir, dpo_data, tmp_path, precision):
    fields = PRECISIONS[precision]
    # packing: its check that packed examples stay apart allows bfloat16's rounding, not float32's, when mixed
    packing = {"sft.packing": True}
    sft.run(test_sft.make_config(tiny_llama_dir, data_dir / "small.jsonl", tmp_path / "sft", **fields, **packing))
    _check_rows(tmp_path / "sft", ("train/loss", "grad/norm"))
    dpo.run(test_dpo.make_config(tiny_llama_dir, dpo_data, tmp_path / "dpo", **fields))
    _check_rows(tmp_path / "dpo", ("train/loss", "grad/norm"))
    reward_model.run(test_reward_model.make_config(tiny_reward_model_dir, dpo_data, tmp_path / "rm", **fields))
    _check_rows(tmp_path / "rm", ("train/loss", "grad/norm"))


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_a_reward_model_ensemble_trains_and_scores_in_bf16(
    tiny_llama_dir, tiny_reward_model_dir, prompts_file, dpo_data, tmp_path, precision
):
    """`rlhf rm --rm.ensemble 2` in each precision, then GRPO optimising its members' UWO in the same precision:
    every member's run and the GRPO run log finite numbers, the members' spread among them."""
    fields = PRECISIONS[precision]
    config = test_reward_model.make_config(
        tiny_reward_model_dir, dpo_data, tmp_path / "rm", **fields, **{"rm.ensemble": 2}
    )
    ensemble = reward_model.run(config)
    saved = {torch.float32 if precision == "mixed" else torch.bfloat16}
    for m in range(2):
        _check_rows(tmp_path / "rm" / "members" / f"member_{m}", ("train/loss", "grad/norm"))
        assert _weights_dtypes(ensemble / f"member_{m}") == saved
    grpo_fields = {"reward.source": str(ensemble), "reward.ensemble.objective": "uwo", "kl.coef": 0.05}
    grpo.run(test_grpo.make_config(tiny_llama_dir, prompts_file, tmp_path / "run", **fields, **grpo_fields))
    spread = "reward/final/ensemble_std"  # the source is named by its directory, rm/final
    rows = _check_rows(tmp_path / "run", ("reward/mean", "policy/loss", "grad/norm", spread))
    assert all(row[spread] >= 0 for row in rows)


def test_sample_and_eval_hold_the_policy_and_judges_in_bf16(
    tiny_llama_dir, tiny_reward_model_dir, prompts_file, tmp_path
):
    values = {"model.name": str(tiny_llama_dir), "prompts": str(prompts_file), "output": str(tmp_path / "c.jsonl"),
              "num_samples": 2, "batch_size": 4, "sampling.max_new_tokens": 6, "progress": False,
              "judge.source": str(tiny_reward_model_dir), "mode": "preferences"}  # fmt: skip
    sample.run(config_from_dict("sample", nested(values | MIXED)))
    assert (tmp_path / "c.jsonl").read_text().strip()
    values = {"model.name": str(tiny_llama_dir), "eval_data": str(prompts_file), "batch_size": 4,
              "reward.source": str(tiny_reward_model_dir), "sampling.max_new_tokens": 6, "progress": False,
              "reference": str(tiny_llama_dir)}  # fmt: skip
    results = evaluate.run(config_from_dict("eval", nested(values | MIXED)))
    assert math.isfinite(results["reward/mean"])
    # the policy answers in bfloat16 and the reference is the same model in bfloat16: the KL of its own answers
    # is 0 up to the order in which rows are batched (a few bfloat16 roundings per token, summed over ≤ 6)
    assert abs(results["kl/mean"]) < 0.05


# --------------------------------------------------------------------------------------------------------------
# Pure bfloat16 at a small learning rate: the updates vanish, and the doctor says so
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_pure_bf16_at_lr_1e_6_does_not_move_and_the_doctor_names_it(tiny_llama_dir, prompts_file, tmp_path, precision):
    out = tmp_path / "run"
    fields = {"optim.learning_rate": 1e-6, "grpo.steps": 4, "optim.scheduler": "constant", "kl.coef": 0.05}
    grpo.run(test_grpo.make_config(tiny_llama_dir, prompts_file, out, **PRECISIONS[precision], **fields))
    shares = [row["update/changed_frac"] for row in train_rows(out)]
    names = {finding.rule.name for finding in diagnose(History(metric_rows(out)))}
    if precision == "pure":
        # the tiny model's weights are ~0.02-1 (spacing ≥ 1.2e-4) and the steps ~1e-6: almost none moves. A
        # weight moves only where its step crosses half a spacing: the few smallest weights (≲ 2.6e-4)
        assert max(shares) < 0.1, shares
        assert "updates_vanishing" in names
    else:  # float32 master weights keep every step
        assert min(shares) > 0.9, shares
        assert "updates_vanishing" not in names


# --------------------------------------------------------------------------------------------------------------
# Learning: mixed precision learns what float32 learns
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ppo_in_mixed_precision_learns_the_toy_task(tiny_llama_dir, prompts_file, tmp_path):
    """The toy task of tests/trainers/test_ppo.py's learning test in bf16 mixed. Measured over seeds 0-2 × both
    kernel families (docs/precision.md): rises 0.72-0.93 in mixed precision, 0.63-0.93 in float32; the margin
    asserted (0.3) is the float32 test's own."""
    out = tmp_path / "run"
    fields = {"reward.source": test_ppo.reward("digit_count"), "ppo.steps": 50, "batch.size": 16, "ppo.epochs": 4,
              "ppo.num_minibatches": 1, "optim.learning_rate": 2e-3, "optim.scheduler": "constant", "kl.coef": 0.01}  # fmt: skip
    ppo.run(make_config(tiny_llama_dir, prompts_file, out, **fields, **MIXED))
    rewards = [row["reward/mean"] for row in train_rows(out)]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.3, rewards


@pytest.mark.slow
def test_grpo_in_mixed_precision_learns_the_toy_task(tiny_llama_dir, prompts_file, tmp_path):
    """tests/trainers/test_grpo.py's learning test in bf16 mixed. Measured over seeds 0-2 × both kernel families
    (docs/precision.md): rises 0.914-0.937 mixed, 0.912-0.927 float32; the margin asserted (0.45) is the float32
    test's own."""
    out = tmp_path / "run"
    fields = {"reward.source": test_grpo.reward("digit_count"), "grpo.steps": 60, "batch.size": 4,
              "grpo.group_size": 8, "grpo.num_minibatches": 1, "optim.learning_rate": 2e-3,
              "optim.scheduler": "constant", "sampling.temperature": 1.0}  # fmt: skip
    grpo.run(test_grpo.make_config(tiny_llama_dir, prompts_file, out, **fields, **MIXED))
    rewards = [row["reward/mean"] for row in train_rows(out)]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.45, rewards
