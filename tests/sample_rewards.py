"""Deterministic judges for tests/test_sample_eval.py, loaded as ``path/sample_rewards.py:function``."""

from __future__ import annotations


def length(completions, **kwargs):
    """The completion's length in characters: random completions rarely tie on it. Chat prompts give TRL's
    conversational completions, ``[{"role": "assistant", "content": text}]``."""
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


def digits(completions, **kwargs):
    """How many digits the completion holds."""
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def constant(completions, **kwargs):
    """The same score for everything: every comparison is a tie."""
    return [1.0 for _ in completions]


def column_idx(completions, idx):
    """The prompt's ``idx`` column: proves extra prompt columns reach the judge, one value per completion."""
    return [float(i) for i in idx]


def unscored_after_first(completions, **kwargs):
    """Scores only each batch's first completion (None = could not be scored)."""
    return [float(len(c)) if i == 0 else None for i, c in enumerate(completions)]
