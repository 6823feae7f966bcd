"""The critic warm-up (``ppo.critic_warmup_steps``): the first N steps fit the value function only — the policy's
parameters do not move, the value function's do — then the policy trains; each row says which (policy/frozen)."""

from __future__ import annotations

import pytest
import test_ppo
import torch
from safetensors.torch import load_file

from rlhf.trainers.rl import ppo
from runs import max_abs_diff, train_rows

prompts_file = test_ppo.prompts_file  # the same 40 toy prompts (36 train, 4 held out), one file per module


def snapshots(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, dict[str, torch.Tensor]]]:
    """Records, after every step's update, copies of the policy's and the value function's parameters, on the CPU
    beside the saved weights they are compared with (the run may be on a GPU)."""
    taken: list[dict[str, dict[str, torch.Tensor]]] = []
    update = ppo.ppo_update

    def recording(config, models, *args, **kwargs):
        result = update(config, models, *args, **kwargs)
        taken.append({
            "policy": {k: v.detach().to("cpu", copy=True) for k, v in models.policy.named_parameters()},
            "value": {k: v.detach().to("cpu", copy=True) for k, v in models.value_module().named_parameters()},
        })  # fmt: skip
        return result

    monkeypatch.setattr(ppo, "ppo_update", recording)
    return taken


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_the_policy_is_held_while_the_critic_warms_up(
    tiny_llama_dir, prompts_file, tmp_path, monkeypatch, capsys, critic
):
    taken = snapshots(monkeypatch)
    fields = {"ppo.steps": 4, "ppo.critic_warmup_steps": 2, "ppo.critic": critic}
    final = ppo.run(test_ppo.make_config(tiny_llama_dir, prompts_file, tmp_path / "run", **fields))
    start = load_file(tiny_llama_dir / "model.safetensors")
    # steps 1-2: bit-identical policy (its gradients are dropped, so AdamW never touches it), a moving critic
    for snapshot in taken[:2]:
        assert max_abs_diff(snapshot["policy"], {k: start[k] for k in snapshot["policy"]}) == 0.0
    assert max_abs_diff(taken[1]["value"], taken[0]["value"]) > 0
    # steps 3-4: the policy trains
    assert max_abs_diff(taken[2]["policy"], taken[1]["policy"]) > 1e-4
    assert max_abs_diff(load_file(final / "model.safetensors"), start) > 1e-4

    rows = train_rows(tmp_path / "run")
    assert [row["policy/frozen"] for row in rows] == [1.0, 1.0, 0.0, 0.0]
    for row in rows[:2]:  # a held policy has no loss, clip fraction or approx-KL to report
        assert not {"policy/loss", "policy/clipfrac", "policy/approx_kl"} & row.keys()
        assert row["value/loss"] > 0 and row["policy/first_ratio_max_dev"] == 0.0
    for row in rows[2:]:
        assert {"policy/loss", "policy/clipfrac", "policy/approx_kl"} <= row.keys()
    err = capsys.readouterr().err
    assert "steps 1-2 fit the value function only" in err and "step 3: the critic warm-up is over" in err


def test_no_warmup_by_default_reports_a_training_policy(tiny_llama_dir, prompts_file, tmp_path):
    ppo.run(test_ppo.make_config(tiny_llama_dir, prompts_file, tmp_path / "run"))
    assert [row["policy/frozen"] for row in train_rows(tmp_path / "run")] == [0.0, 0.0]
