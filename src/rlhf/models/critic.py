"""A separate value model for PPO (``critic: separate``): its own transformer trunk and a scalar head.

Initialised from the reward model when the reward is a model sharing the policy's tokenizer (N+ ``ppo.py`` L478-489, TRL
``PolicyAndValueWrapper``), so the value function starts from a network that already rates responses — with the reward
model's stored normalisation folded into the head; otherwise from the policy's weights with a zero head."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlhf.models.loading import DTYPES, align_pad_token, checkpointed, load_tokenizer, pretrained
from rlhf.models.policy import ValueHead, disable_dropout
from rlhf.models.precision import compute_in_bf16
from rlhf.models.reward import reward_normalization


def shares_vocabulary(policy_tokenizer: Any, tokenizer: Any) -> bool:
    """Whether the policy's token ids mean the same tokens to ``tokenizer`` (a reward model's): it is the policy's,
    or has the same vocabulary. Such a reward model scores the policy's ids as they are, and can start the critic."""
    return policy_tokenizer is not None and (
        policy_tokenizer is tokenizer or policy_tokenizer.get_vocab() == tokenizer.get_vocab()
    )


def critic_layout(critic: str, reward_model_shares_vocabulary: bool) -> str:
    """``ppo.critic`` resolved — what the trainer builds and the memory plan counts: ``auto`` is a separate critic
    when a reward model that reads the policy's tokens (:func:`shares_vocabulary`) can start it (it already knows
    what the score rewards: docs/ppo_study.md), else the shared head. ``separate`` without such a reward model
    starts from the policy."""
    return critic if critic != "auto" else ("separate" if reward_model_shares_vocabulary else "shared")


class Critic(nn.Module):
    """A transformer trunk and a scalar head read at every response state (see the module docstring)."""

    def __init__(self, trunk: nn.Module, head: ValueHead):
        super().__init__()
        self.trunk, self.head = trunk, head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
        """(B, L) → values (B, T) at the states before each of the last T tokens (checklist item 9)."""
        from rlhf.data.collate import position_ids_from_mask

        T = response_length
        hidden = self.trunk(
            input_ids=input_ids.masked_fill(attention_mask == 0, 0),
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state
        return self.head(hidden[:, -(T + 1) : -1]).float()


def load_critic(
    name_or_path: str,
    from_reward_model: bool,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    checkpointing: bool = False,
    bf16_on: torch.device | None = None,
) -> Critic:
    """A :class:`Critic` from a reward-model directory (head copied) or from a causal-LM directory (zero head).
    ``device="meta"``: the architecture only (:func:`pretrained`). ``checkpointing``: its trunk recomputes its
    activations in the backward pass (`rlhf.models.loading.checkpointed`). ``bf16_on``: the run's device, where
    the trunk computes in bfloat16 (mixed precision; the head reads float32 hidden states in float32)."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    if from_reward_model:
        rm = pretrained(AutoModelForSequenceClassification, name_or_path, device, dtype=DTYPES[dtype])
        trunk = rm.base_model
        head = ValueHead(rm.config.hidden_size)
        score = getattr(rm, "score", None)
        if isinstance(score, nn.Linear) and score.out_features == 1:
            # fold the stored normalisation in, so the critic starts on the scale of the rewards it predicts
            gain, bias = reward_normalization(rm.config)
            with torch.no_grad():
                head.linear.weight.copy_(gain * score.weight.float())
                raw_bias = score.bias.float() if score.bias is not None else torch.zeros(1)
                head.linear.bias.copy_(gain * raw_bias + bias)
    else:
        trunk = pretrained(AutoModel, name_or_path, device, dtype=DTYPES[dtype])
        head = ValueHead(trunk.config.hidden_size)
    # the critic never sees a pad id (they are replaced by 0), but final/critic must load with its tokenizer
    align_pad_token(trunk, load_tokenizer(name_or_path))
    critic = Critic(trunk, head).to(device)
    disable_dropout(critic)
    if checkpointing:
        checkpointed(trunk)
    if bf16_on is not None:
        compute_in_bf16(trunk, bf16_on)
    return critic
