"""Rule-based rewards for tests/compat, loaded as ``path/compat_rewards.py:function``."""

from __future__ import annotations


def length_chars(completions, **kwargs):
    """Length of the completion in units of 10 characters: differs between random samples, so updates happen."""
    return [len(c) / 10 for c in completions]
