"""Reward functions written to TRL's documentation, loaded by tests as ``path/trl_style_rewards.py:function``.

The ``example_*`` functions are the examples of TRL's GRPO guide, "Using a custom reward function"
(docs/source/grpo_trainer.md, TRL 1.16), as written there; the others use the rest of TRL's convention
(``trainer_state``, ``log_metric`` / ``log_extra``, ``async def``, a signature without ``**kwargs``) the way
its docstrings describe (trl/trainer/grpo_trainer.py ``GRPOTrainer``, ``_calculate_rewards``).
"""

from __future__ import annotations

import asyncio
import re

# --- TRL's documented examples -------------------------------------------------------------------------------


def example_1_token_length(completion_ids, **kwargs):
    """Example 1: reward longer completions (in tokens)."""
    return [float(len(ids)) for ids in completion_ids]


def example_2_format(completions, **kwargs):
    """Example 2: the R1 format reward, for the conversational format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def example_3_boxed(completions, ground_truth, **kwargs):
    """Example 3: the completion's ``\\boxed{}`` against the ``ground_truth`` column (standard format)."""
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth, strict=True)]


async def example_5_async(prompts, completions, **kwargs):
    """Example 5: an asynchronous reward function."""
    await asyncio.sleep(0.01)
    return [1.0 if completion else 0.0 for completion in completions]


def example_6_logging(completions, ground_truth, log_extra=None, log_metric=None, **kwargs):
    """Example 6: logging extra columns and metrics (standard format)."""
    extracted = [re.search(r"\\boxed\{(.*?)\}", c) for c in completions]
    extracted = [m.group(1) if m else None for m in extracted]
    rewards = [1.0 if e == gt else 0.0 for e, gt in zip(extracted, ground_truth, strict=True)]
    if log_extra:
        log_extra("golden_answer", list(ground_truth))
        log_extra("extracted_answer", [e or "[none]" for e in extracted])
    if log_metric:
        log_metric("accuracy", sum(rewards) / len(rewards))
    return rewards


# --- the rest of the convention, for either dataset format -------------------------------------------------------


def text(completion) -> str:
    """A completion's text in either format: a string, or ``[{"role": "assistant", "content": text}]``."""
    return completion if isinstance(completion, str) else completion[0]["content"]


def chat_length(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **kwargs):
    """Characters / 10 of a *conversational* completion; logs what it was given. Fails on strings, as TRL's
    conversational reward functions do (``completion[0]["content"]``)."""
    assert all(isinstance(p, list) and p[-1]["role"] == "user" for p in prompts), prompts
    log_metric("global_step", trainer_state.global_step)
    log_metric("max_steps", trainer_state.max_steps)
    log_metric("epoch", trainer_state.epoch)
    log_extra("role", [c[0]["role"] for c in completions])
    log_extra("num_ids", [len(ids) for ids in completion_ids])
    return [len(c[0]["content"]) / 10 for c in completions]


def curriculum(completions, trainer_state, **kwargs):
    """Length in characters, weighted up as training progresses (TRL's "dynamic reward" use of the state)."""
    progress = trainer_state.global_step / trainer_state.max_steps if trainer_state.max_steps else 0.0
    return [len(text(c)) * (1.0 + progress) for c in completions]


def columns_and_prompts(prompts, completions, level, **kwargs):
    """Reads a dataset column and the prompt: ``level`` + the prompt's length in characters (its last message's
    content for a conversational prompt) / 100; None where the row has no level."""
    contents = [p if isinstance(p, str) else p[-1]["content"] for p in prompts]
    return [None if lv is None else lv + len(t) / 100 for lv, t in zip(level, contents, strict=True)]


def declared_only(completions, completion_ids):
    """No ``**kwargs``: gets exactly these two."""
    return [len(text(c)) - len(ids) for c, ids in zip(completions, completion_ids, strict=True)]


async def async_token_share(completion_ids, log_metric, **kwargs):
    """Asynchronous: the share of distinct tokens in the completion; logs the batch mean."""
    await asyncio.sleep(0)
    shares = [len(set(ids)) / len(ids) if ids else 0.0 for ids in completion_ids]
    log_metric("distinct_share", sum(shares) / len(shares))
    return shares


def none_at_first_step(completions, trainer_state, **kwargs):
    """None for every sample while the first batch is scored (``global_step`` 0), then the length in tokens."""
    if trainer_state.global_step == 0:
        return [None] * len(completions)
    return [len(text(c)) / 10 for c in completions]


def never_scores(completions, **kwargs):
    """None for every sample: a reward that does not fit the data."""
    return [None] * len(completions)
