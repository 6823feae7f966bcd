"""The moving reference (``kl.reference_ema``): after each update the reference moves (1 − d) of the way towards
the policy, in ppo and grpo; it is refused where there is no copy of the policy to move. (That a resumed run
restores it: tests/trainers/test_ppo.py and, at other world sizes, tests/distributed/test_launch.py.)"""

from __future__ import annotations

import itertools

import pytest
import test_grpo
import test_ppo
import torch
from safetensors.torch import load_file

from rlhf.config import ConfigError
from rlhf.trainers.rl import grpo, ppo

DECAY = 0.75


prompts_file = test_ppo.prompts_file  # the same 40 toy prompts (36 train, 4 held out), one file per module


def snapshots(monkeypatch: pytest.MonkeyPatch, trainer, name: str) -> list[dict[str, dict[str, torch.Tensor]]]:
    """Records, as each step's update returns, copies of the policy's and the reference's parameters (the
    reference then still holds what the step's rollout was scored against: it follows after the update), on the
    CPU beside the saved weights they are compared with (the run may be on a GPU)."""
    taken: list[dict[str, dict[str, torch.Tensor]]] = []
    update = getattr(trainer, name)

    def recording(config, models, *args, **kwargs):
        result = update(config, models, *args, **kwargs)
        taken.append({
            "policy": {k: v.detach().to("cpu", copy=True) for k, v in models.policy.named_parameters()},
            "reference": {k: v.detach().to("cpu", copy=True) for k, v in models.reference.copy.named_parameters()},
        })  # fmt: skip
        return result

    monkeypatch.setattr(trainer, name, recording)
    return taken


TRAINERS = {
    "ppo": (ppo, "ppo_update", test_ppo.make_config, {"ppo.steps": 3}),
    "grpo": (grpo, "grpo_update", test_grpo.make_config, {"grpo.steps": 3, "kl.coef": 0.1}),
}


@pytest.mark.parametrize("command", sorted(TRAINERS))
def test_the_reference_follows_the_policy_after_each_update(
    tiny_llama_dir, prompts_file, tmp_path, monkeypatch, command
):
    trainer, update, make_config, fields = TRAINERS[command]
    taken = snapshots(monkeypatch, trainer, update)
    trainer.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "run", **fields, **{"kl.reference_ema": DECAY}))
    assert len(taken) == 3
    start = load_file(tiny_llama_dir / "model.safetensors")
    # step 1's rollout was scored against the SFT model itself
    assert all(torch.equal(value, start[key]) for key, value in taken[0]["reference"].items())
    for before, after in itertools.pairwise(taken):
        for key, ref in after["reference"].items():
            old, policy = before["reference"][key].double(), before["policy"][key].double()
            expected = DECAY * old + (1 - DECAY) * policy
            # float32 lerp of weights of size ≲ 4: a few ulp (4·2⁻²³ ≈ 5e-7) from the exact average
            torch.testing.assert_close(ref.double(), expected, rtol=0, atol=2e-6)
        moved = max((after["reference"][k] - before["reference"][k]).abs().max() for k in after["reference"])
        assert moved > 1e-5  # the policy trained, so the reference did move


def test_a_frozen_reference_stays_the_sft_model(tiny_llama_dir, prompts_file, tmp_path, monkeypatch):
    taken = snapshots(monkeypatch, ppo, "ppo_update")
    ppo.run(test_ppo.make_config(tiny_llama_dir, prompts_file, tmp_path / "run", **{"ppo.steps": 3}))
    start = load_file(tiny_llama_dir / "model.safetensors")
    for snapshot in taken:
        assert all(torch.equal(value, start[key]) for key, value in snapshot["reference"].items())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kl.coef": 0.0}, "kl.coef is 0, so there is no reference"),
        ({"model.lora": test_ppo.LORA}, "with model.lora the reference is the policy's own base weights"),
    ],
)
def test_a_moving_reference_needs_a_copy_to_move(tiny_llama_dir, prompts_file, tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        test_ppo.make_config(tiny_llama_dir, prompts_file, tmp_path, **fields, **{"kl.reference_ema": 0.9})


@pytest.mark.parametrize("decay", [0.0, 1.0, 1.5])
def test_the_decay_is_a_fraction(tiny_llama_dir, prompts_file, tmp_path, decay):
    with pytest.raises(ConfigError, match="reference_ema"):
        test_ppo.make_config(tiny_llama_dir, prompts_file, tmp_path, **{"kl.reference_ema": decay})
