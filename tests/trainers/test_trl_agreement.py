"""rlhf's GRPO step against TRL's: a TRL 1.16 ``GRPOConfig``, translated field by field into an rlhf config by
`config_from_dict`, gives through the trainer's own `rlhf.trainers.rl.grpo.micro_step` the loss and gradient of TRL's
``GRPOTrainer._compute_loss`` on the same random ragged float64 batch (docs/grpo_variants.md, "How they were
checked").

Both sides see the same per-token log-probs: the "model" is a (B, T) float64 leaf tensor θ whose entries are the
log-probs (each row's id in the first query column says which row a micro-batch holds), so the comparison is of
the losses alone. TRL runs its one micro-batch on one process (``num_items_in_batch`` = the batch's tokens); rlhf
runs the same minibatch in one or two micro-batches and sums them, as its update does.

What is translated, not equal by name: TRL's ``epsilon_high`` under ``cispo`` is the cap itself (rlhf: 1 +
``clip_range_high``); TRL builds SAPO's temperatures in float32, so the check gives rlhf the float32 value of
1.05 (with the float64 one the losses differ in the 8th digit: `test_sapo_float32_temperature_is_the_only_gap`).
Under ``importance_sampling_level: sequence`` TRL counts clipped sequences where rlhf counts their tokens, so
``clip_ratio/*`` are compared at the token level only. Where TRL is not installed the module is skipped.
"""

from __future__ import annotations

import itertools
import math
import types
from collections import defaultdict

import pytest
import torch

from configs import nested
from rlhf.config import config_from_dict
from rlhf.core.losses import top_entropy_mask
from rlhf.trainers import update
from rlhf.trainers.rl import grpo

trl = pytest.importorskip("trl")

F64 = torch.float64
B, T = 6, 5  # 6 completions (a group of 3 twice) of at most 5 tokens, one row empty
TOLERANCE = 1e-10  # float64 sums of ≤ 30 terms of size ≲ 10 in another order: ≲ 30·10·2⁻⁵³ ≈ 3e-13; 1e-10 is loose
METRIC_REL = 1e-6  # TRL's logged means divide by a float32 token count: its metrics carry float32's 6e-8 relative


def trl_args(**fields):
    """TRL's GRPOConfig with its own defaults except ``fields`` (a CPU run that writes nowhere)."""
    return trl.GRPOConfig(output_dir="unused", report_to="none", use_cpu=True, max_completion_length=T, **fields)


def rlhf_config(args, **extra):
    """The rlhf grpo config a TRL user writes for ``args``: each field under its rlhf name."""
    cispo = args.loss_type == "cispo"
    high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    fields = {
        "model.name": "theta", "reward.source": "unused.py:reward", "data.train": "unused.jsonl", "output_dir": "unused",
        "batch.size": 2, "grpo.group_size": 3, "sampling.max_new_tokens": args.max_completion_length,
        "kl.coef": args.beta, "grpo.loss_type": args.loss_type, "grpo.clip_range": args.epsilon,
        "grpo.clip_range_high": high - 1 if cispo else high, "grpo.delta": args.delta,
        "grpo.importance_sampling_level": args.importance_sampling_level,
        "grpo.use_bias_correction_kl": args.use_bias_correction_kl,
        "grpo.top_entropy_quantile": args.top_entropy_quantile,
        "grpo.off_policy_mask_threshold": args.off_policy_mask_threshold,
        "grpo.sapo_temperature_pos": args.sapo_temperature_pos, "grpo.sapo_temperature_neg": args.sapo_temperature_neg,
        "grpo.vespo_k_pos": args.vespo_k_pos, "grpo.vespo_lambda_pos": args.vespo_lambda_pos,
        "grpo.vespo_k_neg": args.vespo_k_neg, "grpo.vespo_lambda_neg": args.vespo_lambda_neg,
    }  # fmt: skip
    return config_from_dict("grpo", nested(fields | extra))


def random_batch(seed: int) -> dict[str, torch.Tensor]:
    """Log-probs of the current (θ), old and reference policies, ragged lengths (one row empty), advantages (B,), and
    entropies representable in float32 (TRL takes its entropy quantile in float32: no tie can then be rounded)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[int(torch.randint(0, B, (1,), generator=g))] = 0
    mask = torch.arange(T) < lengths[:, None]
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3
    theta = old + 0.3 * torch.randn(B, T, generator=g, dtype=F64)  # ratios e^±0.3: some past the clip
    ref = theta + 0.3 * torch.randn(B, T, generator=g, dtype=F64)
    entropy = torch.rand(B, T, generator=g).to(F64) * 2
    return {"theta": theta, "old": old, "ref": ref, "mask": mask, "adv": torch.randn(B, generator=g, dtype=F64),
            "entropy": entropy}  # fmt: skip


def trl_loss(args, batch, on_policy: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """TRL's ``GRPOTrainer._compute_loss`` on ``batch``: (loss, ∂loss/∂θ, its logged metrics). The trainer is built
    without ``__init__``: only what ``_compute_loss`` reads is set, as ``GRPOTrainer.__init__`` sets it."""
    theta = batch["theta"].clone().requires_grad_()
    trainer = trl.GRPOTrainer.__new__(trl.GRPOTrainer)
    identity = lambda x, *a, **k: x  # noqa: E731 — one process: reduce, gather and pad leave a tensor as it is
    trainer.accelerator = types.SimpleNamespace(num_processes=1, reduce=identity, gather=identity,
                                                gather_for_metrics=identity, pad_across_processes=identity)  # fmt: skip
    trainer.args, trainer.model = args, types.SimpleNamespace(training=True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (theta, batch["entropy"], None)
    trainer._metrics = {"train": defaultdict(list)}
    for name in ("beta", "loss_type", "importance_sampling_level", "top_entropy_quantile", "off_policy_mask_threshold"):
        setattr(trainer, name, getattr(args, name))
    trainer.epsilon_low = args.epsilon
    trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    trainer.max_completion_length, trainer.current_gradient_accumulation_steps = T, 1
    trainer.use_vllm = trainer.aux_loss_enabled = trainer._entropy_bonus_enabled = False
    mask = batch["mask"].long()
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
              "advantages": batch["adv"], "num_items_in_batch": mask.sum().to(F64), "ref_per_token_logps": batch["ref"]}  # fmt: skip
    if not on_policy:
        inputs["old_per_token_logps"] = batch["old"]
    loss = trainer._compute_loss(None, inputs)
    loss.backward()
    return loss.detach(), theta.grad, {key: values[0] for key, values in trainer._metrics["train"].items()}


def rlhf_loss(config, batch, on_policy: bool, micro_batches: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The same through `grpo.micro_step`, the minibatch in ``micro_batches`` parts: (loss, ∂loss/∂θ, logged stats)."""
    theta = batch["theta"].clone().requires_grad_()
    mask = batch["mask"]

    def forward(ids, attention_mask, t, temperature, entropy=True, entropy_grad=False):
        rows = ids[:, 0]  # the row's id, in its query column
        return theta[rows, :t], None, batch["entropy"][rows, :t]

    models = types.SimpleNamespace(trainable=types.SimpleNamespace(forward=forward))
    quantile = config.grpo.top_entropy_quantile
    rollout = grpo.GRPORollout(
        query_responses=torch.cat([torch.arange(B)[:, None], torch.zeros(B, T, dtype=torch.long)], dim=1),
        attention_mask=torch.cat([torch.ones(B, 1, dtype=torch.long), mask.long()], dim=1),
        logprobs=None if on_policy else batch["old"],
        ref_logprobs=batch["ref"] if config.kl.coef > 0 else None,
        advantages=torch.where(mask, batch["adv"][:, None], 0.0),  # broadcast, 0 outside the mask (make_rollout's)
        sampler_logprobs=None,
        entropy_keep=top_entropy_mask(batch["entropy"], mask, quantile) if quantile < 1 else None,
        mask=mask,
    )
    minibatch, total, stats = torch.arange(B), torch.zeros((), dtype=F64), defaultdict(float)
    for rows in minibatch.chunk(micro_batches):
        micro = update.MicroBatch(rows=rows, first_column=0, response_length=T)
        loss, micro_stats = grpo.micro_step(config, models, rollout, micro, minibatch)
        loss.backward()
        total += loss.detach()
        for key, value in micro_stats.items():
            stats[key] += value  # each micro-batch's share of the minibatch's means
    return total, theta.grad, stats


LOSS_TYPES = ["dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo"]
KL = [{"beta": 0.0}, {"beta": 0.04}, {"beta": 0.04, "use_bias_correction_kl": False}]  # TRL's default flag: True
CASES = [
    (loss_type, level, kl)
    for loss_type, level, kl in itertools.product(LOSS_TYPES, ["token", "sequence"], KL)
    if not (loss_type == "vespo" and level == "sequence")  # TRL warns, rlhf refuses: VESPO has its own ratio
]


@pytest.mark.parametrize(("loss_type", "level", "kl"), CASES, ids=lambda x: str(x))
def test_the_loss_and_gradient_are_trls(loss_type, level, kl):
    # One case per loss type × level × KL setting; the masks, δ, on/off-policy and the micro-batching vary with a
    # seed taken from the case, so that the 45 cases cover their combinations.
    index = CASES.index((loss_type, level, kl))
    fields = {"loss_type": loss_type, "importance_sampling_level": level, **kl}
    fields |= {"epsilon_high": 5.0} if loss_type == "cispo" else {"epsilon_high": 0.28} if index % 2 else {}
    if index % 3 == 1:
        fields["off_policy_mask_threshold"] = 0.05
    if index % 3 == 2:
        fields["top_entropy_quantile"] = 0.5
    if index % 4 == 3 and loss_type not in ("cispo", "sapo", "vespo"):
        fields["delta"] = 1.5  # above 1 + ε_high (1.2 or 1.28), as rlhf requires
    args = trl_args(**fields)
    extra = {"grpo.sapo_temperature_neg": float(torch.tensor(args.sapo_temperature_neg, dtype=torch.float32))}
    config = rlhf_config(args, **extra)
    batch = random_batch(index)
    on_policy = index % 5 == 0
    loss, grad, metrics = trl_loss(args, batch, on_policy)
    ours, our_grad, stats = rlhf_loss(config, batch, on_policy, micro_batches=1 + index % 2)
    torch.testing.assert_close(ours, loss, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(our_grad, grad, rtol=0, atol=TOLERANCE)
    if args.beta > 0:  # TRL's kl: the mean of the term in its loss (ρ·k3 with the correction)
        assert stats["kl/loss_mean"] == pytest.approx(metrics["kl"], rel=METRIC_REL)
    if level == "token" and loss_type not in ("cispo", "sapo", "vespo"):
        for key in ("low", "high", "region"):
            expected = metrics[f"clip_ratio/{key}_mean"]
            # abs: a share that is 0 on both sides (no token clipped), where a relative bound says nothing
            assert stats[f"clip_ratio/{key}"] == pytest.approx(expected, rel=METRIC_REL, abs=1e-12)
    if loss_type == "vespo":  # TRL's is a mean over the sequences, ours over the tokens: equal for equal lengths
        assert math.isfinite(stats["policy/vespo_phi_mean"]) and math.isfinite(metrics["vespo/phi_seq_mean"])


def test_the_bias_corrected_kl_is_what_sets_trls_default_apart():
    # TRL's default (use_bias_correction_kl=True) against rlhf with the correction off: the losses part (the KL term
    # is weighted by ρ), and on-policy, where ρ = 1, the values agree but the gradients do not (by β·k3/N a token).
    batch = random_batch(0)
    for on_policy in (False, True):
        args = trl_args(beta=0.04)
        loss, grad, _ = trl_loss(args, batch, on_policy)
        plain, plain_grad, _ = rlhf_loss(
            rlhf_config(args, **{"grpo.use_bias_correction_kl": False}), batch, on_policy, 1
        )
        assert (plain_grad - grad).abs().max() > 1e-4
        if on_policy:
            torch.testing.assert_close(plain, loss, rtol=0, atol=TOLERANCE)
            mask = batch["mask"]
            log_q = torch.where(mask, batch["ref"] - batch["theta"], 0.0)
            k3 = torch.expm1(log_q) - log_q
            torch.testing.assert_close(grad - plain_grad, 0.04 * k3 / mask.sum(), rtol=0, atol=TOLERANCE)
        else:
            assert abs(plain - loss) > 1e-4


def test_sapo_float32_temperature_is_the_only_gap():
    # rlhf's τ_neg = 1.05 in float64 against TRL's float32 1.0499999523: the losses differ, in the 8th digit at most
    args = trl_args(loss_type="sapo")
    batch = random_batch(1)
    loss, _, _ = trl_loss(args, batch, on_policy=False)
    ours, _, _ = rlhf_loss(rlhf_config(args), batch, on_policy=False, micro_batches=1)
    assert 0 < abs(ours - loss) < 1e-7 * max(1.0, abs(float(loss)))
