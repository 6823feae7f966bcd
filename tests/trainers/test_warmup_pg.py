"""The vanilla policy-gradient warm-up (``warmup_pg_steps``) of ppo and grpo: the first N steps train on the
unclipped loss −A·ρ of the same rollouts, step N+1 on the clipped surrogate; the switch is logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_grpo
import test_ppo
import torch

from rlhf.models.tiny import toy_corpus
from rlhf.report.pages import run_report
from rlhf.report.runs import Run, load_run
from rlhf.trainers.rl import grpo, ppo, updates
from runs import train_rows

TRAINERS = {
    # A high learning rate and several optimizer steps per rollout move the ratio out of [1 − ε, 1 + ε] within a
    # step, so the clipped and unclipped losses differ on the same batch (else the test could not tell them apart).
    "ppo": (ppo, test_ppo, {"ppo.steps": 3, "ppo.warmup_pg_steps": 2, "optim.learning_rate": 2e-2}),
    "grpo": (grpo, test_grpo, {"grpo.steps": 3, "grpo.warmup_pg_steps": 2, "grpo.num_iterations": 2,
                               "kl.coef": 0.0, "optim.learning_rate": 2e-2}),
}  # fmt: skip


def independent_losses(logp, old_logp, advantages, mask, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(−A·ρ, max(−A·ρ, −A·clip(ρ))) per token, 0 outside the mask, written here from the formulas."""
    logp, old_logp = logp.detach().masked_fill(~mask, 0), old_logp.masked_fill(~mask, 0)
    adv = advantages.masked_fill(~mask, 0)
    ratio = torch.exp(logp - old_logp)
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1 - low, 1 + high)
    return pg1.masked_fill(~mask, 0), torch.maximum(pg1, pg2).masked_fill(~mask, 0)


@pytest.mark.parametrize("command", list(TRAINERS))
def test_warm_up_steps_use_the_unclipped_loss_then_the_clipped_one(
    command, tiny_llama_dir, tmp_path, monkeypatch, capsys
):
    trainer, module, overrides = TRAINERS[command]
    prompts = tmp_path / "prompts.jsonl"
    lines = toy_corpus(40, seed=5)
    prompts.write_text("".join(json.dumps({"prompt": " ".join(line.split()[:4])}) + "\n" for line in lines))
    calls: list[tuple[bool, bool, bool, bool]] = []  # (clipped, equals −Aρ, equals the clipped loss, they differ)
    original = updates.clipped_policy_loss

    def recording(logp, old_logp, advantages, mask, **kwargs):
        per_token, stats = original(logp, old_logp, advantages, mask, **kwargs)
        objective = kwargs["objective"]
        unclipped, clipped = independent_losses(logp, old_logp, advantages, mask.bool(), objective.clip_low,
                                                objective.clip_high)  # fmt: skip
        # float32 arithmetic of the same few operations in the same order: a few ulps at most
        same = lambda a: torch.allclose(per_token.detach(), a, rtol=1e-6, atol=1e-7)  # noqa: E731
        differ = not torch.allclose(unclipped, clipped, rtol=1e-6, atol=1e-7)
        calls.append((kwargs["clipped"], same(unclipped), same(clipped), differ))
        return per_token, stats

    monkeypatch.setattr(updates, "clipped_policy_loss", recording)
    out = tmp_path / "run"
    trainer.run(module.make_config(tiny_llama_dir, prompts, out, **overrides))

    assert [row["policy/clipped"] for row in train_rows(out)] == [0.0, 0.0, 1.0]
    per_step = len(calls) // 3
    assert [flag for flag, *_ in calls] == [False] * 2 * per_step + [True] * per_step
    warm_up, after = calls[: 2 * per_step], calls[2 * per_step :]
    assert all(equals_pg for _, equals_pg, _, _ in warm_up)
    assert all(equals_clipped for _, _, equals_clipped, _ in after)
    # the two objectives really differed on some batches of each phase, so the checks above tell them apart
    assert any(differ for *_, differ in warm_up) and any(differ for *_, differ in after)
    page = run_report(load_run(out), max_samples=2)
    assert "vanilla PG to step 2, clipped from 3" in page
    err = capsys.readouterr().err
    assert "steps 1-2 use the vanilla policy-gradient loss" in err
    assert "step 3: the vanilla policy-gradient warm-up is over" in err


def test_the_report_finds_the_switch(tmp_path):
    rows = [{"step": s, "policy/clipped": float(s > 2), "reward/mean": float(s)} for s in range(1, 6)]
    run = Run(Path(tmp_path), "ppo", "ppo", "", {}, rows, {})
    assert run.clipped_from == 3
    plain = Run(Path(tmp_path), "ppo", "ppo", "", {}, [{"step": 1, "policy/clipped": 1.0}], {})
    assert plain.clipped_from is None
