"""Reward functions for tests/distributed/test_launch.py, loaded as ``path/dist_rewards.py:function``."""

from __future__ import annotations

import os


def length_or_die(completions, trainer_state=None, **kwargs):
    """Length in units of 10 characters; with ``DIE_AT_STEP=N`` in the environment the process exits at once
    (``os._exit``: no clean-up, like a kill) when scoring the batch of step N + 1 — after step N's checkpoint."""
    die = os.environ.get("DIE_AT_STEP")
    if die and trainer_state is not None and trainer_state.global_step == int(die):
        os._exit(1)
    return [len(c) / 10 for c in completions]


def fails_on_rank_one(completions, **kwargs):
    """Scores like ``length_or_die`` on every rank but rank 1, which raises on its first batch."""
    if os.environ.get("RANK") == "1":
        raise ValueError("this sample cannot be scored (rank 1)")
    return [len(c) / 10 for c in completions]
