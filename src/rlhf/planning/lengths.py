"""The longest row a run trains on: each trainer passes the length it tokenized (`prompt_positions`,
`sequence_positions`); `rlhf plan` reads the data the same way (`data_positions`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlhf.config import DPOConfig, PolicyGradientConfig, RMConfig, SFTConfig, TrainingConfig


def prompt_positions(prompts: Sequence[Any], response_tokens: int) -> int:
    """ppo/grpo: the longest prompt (as the trainer cut it) plus the longest response (``response_tokens``: the
    config's ``sampling.max_new_tokens``, or a multi-turn episode's ``rollout.max_episode_tokens``)."""
    return max((len(p.input_ids) for p in prompts), default=1) + response_tokens


def sequence_positions(sequences: Sequence[Any]) -> int:
    """sft: the longest example (``input_ids``); dpo: the longest prompt + response of a pair."""
    if sequences and hasattr(sequences[0], "input_ids"):
        return max(len(s.input_ids) for s in sequences)
    return max((len(p.prompt_ids) + max(len(p.chosen_ids), len(p.rejected_ids)) for p in sequences), default=1)


def most_answers(pairs: Sequence[Any]) -> int:
    """rm, dpo: the most distinct answers of one prompt, which a pass forwards together (`rlhf.data.groups`)."""
    from rlhf.data.groups import group_preferences

    return max((len(group.answers) for group in group_preferences(pairs)), default=2)


def data_answers(config: TrainingConfig) -> int:
    """rm, dpo: `most_answers` of the training data, tokenized as `data_positions` does; 2 for the other trainers."""
    from rlhf.data import load_preferences
    from rlhf.models.loading import load_tokenizer
    from rlhf.models.reward import load_reward_model, tokenize_pairs

    data = config.data
    if isinstance(config, DPOConfig):
        tokenizer = load_tokenizer(config.model.name, data.chat_template_kwargs)
        return most_answers(load_preferences(data.train, tokenizer, data.max_length))
    if not isinstance(config, RMConfig):
        return 2
    with torch.device("meta"):
        shell = load_reward_model(config.model.name, config.model.dtype, "meta", data.chat_template_kwargs)
    return most_answers(tokenize_pairs(data.train, shell, data.max_length))


def data_positions(config: TrainingConfig) -> int:
    """The longest row of ``config``'s data, tokenized as its trainer does (rm: as the model reads pairs, an
    encoder or a decoder, from its architecture built on the ``meta`` device)."""
    from rlhf.data import load_preferences, load_prompts, load_sft
    from rlhf.models.loading import load_tokenizer
    from rlhf.models.reward import load_reward_model, tokenize_pairs

    data = config.data
    files = [data.train, *([data.eval] if data.eval else [])]
    if isinstance(config, RMConfig):
        with torch.device("meta"):
            shell = load_reward_model(config.model.name, config.model.dtype, "meta", data.chat_template_kwargs)
        return sequence_positions([p for file in files for p in tokenize_pairs(file, shell, data.max_length)])
    tokenizer = load_tokenizer(config.model.name, data.chat_template_kwargs)
    if isinstance(config, PolicyGradientConfig):  # every prompt the run may sample, held-out ones included
        limit = config.sampling.max_prompt_length
        prompts = [p for file in files for p in load_prompts(file, tokenizer, limit)]
        return prompt_positions(prompts, config.response_tokens)
    load = load_sft if isinstance(config, SFTConfig) else load_preferences
    return sequence_positions([row for file in files for row in load(file, tokenizer, data.max_length)])
