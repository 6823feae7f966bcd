"""The models a plan counts, read before any weight loads: sizes from each model's config.json (the model built on
the ``meta`` device), LoRA's trainable parameters, the reward models of ``reward.source``, and whether a reward model
reads the policy's tokens (its tokenizer only). Each is remembered while the model's config.json is unchanged: the
cheapest fix plans many variants of one run."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from rlhf.config import LoRAConfig
from rlhf.config.sections import RewardSection
from rlhf.core.memory import Transformer

R = TypeVar("R")


def _while_unchanged(function: Callable[..., R]) -> Callable[..., R]:
    """``function`` of model names, remembered while each local model's config.json is unchanged (a directory
    rewritten in place, a demo run again, is read again)."""
    remembered = functools.cache(lambda args, kwargs, versions: function(*args, **dict(kwargs)))

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> R:
        files = [Path(arg).expanduser() / "config.json" for arg in args if isinstance(arg, str)]
        versions = tuple(file.stat().st_mtime if file.is_file() else None for file in files)  # None: a hub id
        return remembered(args, tuple(kwargs.items()), versions)

    return call


@_while_unchanged
def model_sizes(name: str, reward: bool = False) -> Transformer:
    """A model's sizes from its config.json: the model built on the ``meta`` device (no memory, no weights) to
    count its parameters exactly, whatever the architecture."""
    model = _meta_model(name, reward)
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, heads = int(text.hidden_size), int(text.num_attention_heads)
    inner = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * hidden
    return Transformer(
        layers=int(text.num_hidden_layers),
        hidden=hidden,
        intermediate=int(inner),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        vocab=int(text.vocab_size),
        params=sum(p.numel() for p in model.parameters()),
        matmul_params=sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)),
        gated=any(name.endswith("gate_proj") for name, _ in model.named_modules()),
    )


@_while_unchanged
def model_config(name: str) -> Any:
    """``name``'s config.json (a hub id downloads this file only)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(name)


def _meta_model(name: str, reward: bool) -> nn.Module:
    """The model ``name``'s config.json describes, built on the ``meta`` device: shapes without memory."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = copy.deepcopy(model_config(name))
    if reward:
        config.num_labels = 1  # a reward model's one score
    auto = AutoModelForSequenceClassification if reward else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    model.tie_weights()  # as from_pretrained does (transformers 5.0's from_config leaves tied embeddings apart)
    return model


def lora_params(name: str, lora: LoRAConfig, reward: bool = False) -> int:
    """LoRA's trainable parameters: the adapters `rlhf.models.loading.apply_lora` puts on the model, built on the
    ``meta`` device (its targets are peft's per architecture unless ``target_modules`` names them)."""
    from rlhf.models.loading import apply_lora

    with torch.device("meta"):
        model = apply_lora(_meta_model(name, reward), lora, task_type="SEQ_CLS" if reward else "CAUSAL_LM")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def reward_models(reward: RewardSection) -> list[str]:
    """The reward models of ``reward.source`` (a directory or a hub id: not a function, URL or LLM judge), an
    ensemble's members each."""
    from rlhf.inputs import is_reward_model, reward_sources
    from rlhf.rollout.rewards.ensemble import is_ensemble, member_paths

    models = []
    for _, spec in reward_sources("reward.source", reward.source):
        if is_reward_model(spec):
            path = Path(spec).expanduser()
            models += [str(member) for member in member_paths(path)] if is_ensemble(path) else [spec]
    return models


@_while_unchanged
def reads_policy_tokens(policy: str, reward_model: str) -> bool:
    """Whether the reward model ``reward_model`` reads the policy's token ids (`rlhf.models.critic.shares_vocabulary`
    of the two tokenizers, loaded as the trainer loads them: no weights)."""
    from rlhf.models.critic import shares_vocabulary
    from rlhf.models.loading import load_tokenizer

    return policy == reward_model or shares_vocabulary(load_tokenizer(policy), load_tokenizer(reward_model))
