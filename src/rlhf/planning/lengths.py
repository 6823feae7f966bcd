"""The longest row a run trains on: each trainer passes the length it tokenized (`prompt_positions`,
`sequence_positions`); `rlhf plan` reads the data the same way (`data_positions`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlhf.config import PolicyGradientConfig, RMConfig, SFTConfig, TrainingConfig


def prompt_positions(prompts: Sequence[Any], response_tokens: int) -> int:
    """ppo/grpo: the longest prompt (as the trainer cut it) plus the longest response (``response_tokens``: the
    config's ``sampling.max_new_tokens``, or a multi-turn episode's ``rollout.max_episode_tokens``)."""
    return max((len(p.input_ids) for p in prompts), default=1) + response_tokens


def sequence_positions(sequences: Sequence[Any]) -> int:
    """sft: the longest example (``input_ids``); dpo: the longest prompt + response of a pair."""
    if sequences and hasattr(sequences[0], "input_ids"):
        return max(len(s.input_ids) for s in sequences)
    return max((len(p.prompt_ids) + max(len(p.chosen_ids), len(p.rejected_ids)) for p in sequences), default=1)


def most_answers(groups: Sequence[Any]) -> int:
    """rm, dpo: the most distinct answers of one prompt's group (`rlhf.data.groups.group_preferences`), which a pass
    forwards together."""
    return max((len(group.answers) for group in groups), default=2)


def data_shape(config: TrainingConfig) -> tuple[int, int]:
    """What `rlhf plan` reads from ``config``'s data, each file tokenized once as its trainer does: the longest row
    (`data_positions`) and, for rm and dpo, the most answers of one training prompt (`most_answers`; 2 for the
    other trainers). rm tokenizes as the model reads pairs, an encoder or a decoder, from its architecture built on
    the ``meta`` device."""
    from rlhf.data import load_preferences, load_prompts, load_sft
    from rlhf.data.groups import group_preferences
    from rlhf.models.loading import load_tokenizer
    from rlhf.models.reward import load_reward_model, tokenize_pairs

    data = config.data
    files = [data.train, *([data.eval] if data.eval else [])]
    if isinstance(config, RMConfig):
        with torch.device("meta"):
            shell = load_reward_model(config.model.name, config.model.dtype, "meta", data.chat_template_kwargs)
        read = [tokenize_pairs(file, shell, data.max_length) for file in files]
        return sequence_positions([p for pairs in read for p in pairs]), most_answers(group_preferences(read[0]))
    tokenizer = load_tokenizer(config.model.name, data.chat_template_kwargs)
    if isinstance(config, PolicyGradientConfig):  # every prompt the run may sample, held-out ones included
        limit = config.sampling.max_prompt_length
        prompts = [p for file in files for p in load_prompts(file, tokenizer, limit)]
        return prompt_positions(prompts, config.response_tokens), 2
    if isinstance(config, SFTConfig):
        return sequence_positions([row for file in files for row in load_sft(file, tokenizer, data.max_length)]), 2
    read = [load_preferences(file, tokenizer, data.max_length) for file in files]
    return sequence_positions([p for pairs in read for p in pairs]), most_answers(group_preferences(read[0]))


def data_positions(config: TrainingConfig) -> int:
    """The longest row of ``config``'s data, tokenized as its trainer does (`data_shape`)."""
    return data_shape(config)[0]
