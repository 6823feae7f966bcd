"""Gradient checkpointing (`model.gradient_checkpointing`): every trained model — policy (full and LoRA), the
separate critic, the reward model — recomputes its layers in the backward pass and gets the gradients it gets
without. Two ranks (DDP, FSDP2) with checkpointing against one process without: tests/distributed/test_equivalence.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlhf.config import LoRAConfig
from rlhf.models.critic import load_critic
from rlhf.models.loading import apply_lora, checkpointed, load_causal_lm
from rlhf.models.policy import unwrap
from rlhf.models.reward import load_reward_model


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, vocab, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # a left-padded row
    return ids, mask


def first_layer(model: nn.Module) -> nn.Module:
    return next(m for m in unwrap(model).modules() if type(m).__name__.endswith("DecoderLayer"))


def gradients(model: nn.Module, loss_of) -> tuple[dict[str, torch.Tensor], int]:
    """The gradients of ``loss_of(model)`` and how many times the first decoder layer's MLP started (twice when its
    activations are recomputed in the backward pass; a pre-hook, because the replay stops once it has what the
    backward needs, before the MLP returns)."""
    calls = []
    hook = first_layer(model).mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    model.zero_grad(set_to_none=True)
    loss_of(model).backward()
    hook.remove()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}, len(calls)


def assert_checkpointing_keeps_the_gradients(load, loss_of) -> None:
    plain, runs_plain = gradients(load(), loss_of)
    recomputed, runs_recomputed = gradients(checkpointed(load()), loss_of)
    assert (runs_plain, runs_recomputed) == (1, 2)
    assert plain.keys() == recomputed.keys() and plain
    for name, grad in plain.items():
        # the backward pass replays exactly the forward's operations on the same inputs: the same floats
        torch.testing.assert_close(recomputed[name], grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_policy_gets_the_same_gradients(tiny_llama_dir, lora):
    def load() -> nn.Module:
        model = load_causal_lm(str(tiny_llama_dir))
        torch.manual_seed(0)  # the same initial adapters both times
        return apply_lora(model, LoRAConfig(r=4, alpha=8)) if lora else model

    ids, mask = batch(200)

    def loss_of(model: nn.Module) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask).logits.float().log_softmax(-1)[..., 5].mean()

    assert_checkpointing_keeps_the_gradients(load, loss_of)


def test_a_separate_critic_gets_the_same_gradients(tiny_reward_model_dir):
    ids, mask = batch(200)
    plain = load_critic(str(tiny_reward_model_dir), from_reward_model=True)
    recomputing = load_critic(str(tiny_reward_model_dir), from_reward_model=True, checkpointing=True)
    assert recomputing.trunk.is_gradient_checkpointing and not plain.trunk.is_gradient_checkpointing

    def loss_of(critic: nn.Module) -> torch.Tensor:
        return critic(ids, mask, 5).pow(2).mean()

    a, runs_a = gradients(plain, loss_of)
    b, runs_b = gradients(recomputing, loss_of)
    assert (runs_a, runs_b) == (1, 2) and a.keys() == b.keys()
    for name, grad in a.items():
        torch.testing.assert_close(b[name], grad, rtol=0, atol=0, msg=name)


def test_a_reward_model_gets_the_same_gradients(tiny_reward_model_dir):
    ids, mask = batch(200)

    def loss_of(model: nn.Module) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask).logits.pow(2).mean()

    assert_checkpointing_keeps_the_gradients(lambda: load_reward_model(str(tiny_reward_model_dir)).model, loss_of)


def test_no_grad_passes_are_not_recomputed(tiny_llama_dir):
    """Rollouts, reference and old-log-prob passes run without gradients: nothing to replay, so they run once."""
    model = checkpointed(load_causal_lm(str(tiny_llama_dir)))
    calls = []
    first_layer(model).mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7]]))
    assert len(calls) == 1
