"""Rule-based reward functions for tests/trainers/test_ppo.py, loaded as ``path/ppo_rewards.py:function``."""

from __future__ import annotations

import math

DIGIT_TOKENS = 8
"""The learning test samples this many tokens; digits are single tokens in the tiny tokenizer."""


def digit_count(completions, **kwargs):
    """Digits in the completion / 8: the fraction of an 8-token response that is digits (a random-init model
    starts near 0.02; a policy that only writes digits scores 1)."""
    return [sum(ch.isdigit() for ch in c) / DIGIT_TOKENS for c in completions]


def length_chars(completions, **kwargs):
    """Length of the completion in units of 10 characters."""
    return [len(c) / 10 for c in completions]


def constant_one(completions, **kwargs):
    """1 for every completion, so a shaped score shows exactly what the trainer added to it."""
    return [1.0 for _ in completions]


def always_raises(completions, **kwargs):
    raise ValueError("boom")


def nan_on_second(completions, **kwargs):
    return [math.nan if i == 1 else 0.0 for i in range(len(completions))]


def concise_gold(completions, **kwargs):
    """A truth with an optimum: one point per word up to 4 words, minus two per word beyond 6. A reward that pays
    for length (length_chars) agrees with it at first and then runs past it: over-optimisation."""
    return [min(len(c.split()), 4) - 2 * max(0, len(c.split()) - 6) for c in completions]
