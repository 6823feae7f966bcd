"""Example rule-based reward functions, in the convention TRL's reward functions use.

Each is called as ``fn(prompts=list[str], completions=list[str], **columns) -> list[float | None]``;
return ``None`` for a sample you cannot score. Point a config at one with ``reward: examples/rewards.py:NAME``.
"""

from __future__ import annotations


def digits(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """Fraction of the completion's characters that are digits: a signal a tiny random model can learn fast."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def brevity(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """1 for an empty answer, falling linearly to 0 at 60 characters."""
    return [max(0.0, 1.0 - len(c) / 60) for c in completions]
