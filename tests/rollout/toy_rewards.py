"""Reward functions used by tests/rollout/test_rewards.py, loaded by file path and by module name."""

from __future__ import annotations

import math

NOT_CALLABLE = 3.0
CALLS: list[dict] = []
"""Keyword arguments of every call to :func:`recording_reward`, for tests to inspect."""


def length_reward(prompts, completions, **kwargs):
    """TRL-style: the completion's length in characters."""
    return [float(len(c)) for c in completions]


def recording_reward(prompts, completions, **columns):
    CALLS.append({"prompts": prompts, "completions": completions, **columns})
    return [1.0 for _ in completions]


def exact_match(completions, answer):
    """No **kwargs: must get only `completions` and the `answer` column."""
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer, strict=True)]


def only_completions(completions):
    return [0.5 for _ in completions]


def unscorable_when_empty(prompts, completions, **kwargs):
    return [None if not c else 1.0 for c in completions]


def fails_on_boom(prompts, completions, **kwargs):
    return [1 / 0 if "boom" in c else 1.0 for c in completions]


def nan_on_second(prompts, completions, **kwargs):
    return [math.nan if i == 1 else 0.0 for i, _ in enumerate(completions)]


def inf_reward(prompts, completions, **kwargs):
    return [math.inf for _ in completions]


def too_few(prompts, completions, **kwargs):
    return [1.0 for _ in completions[1:]]


def string_score(prompts, completions, **kwargs):
    return ["1.0" for _ in completions]


def no_completions(prompts, answer):
    return [0.0 for _ in prompts]


class Scorer:
    @staticmethod
    def by_prompt(prompts, completions, **kwargs):
        return [float(len(p)) for p in prompts]
