"""Environments the multi-turn tests load by path (``episode_envs.py:CodeWord``), written as users write them: a class
made once per episode with ``reset(row)`` and ``step(message)``. ``CodeWord`` (turn 1: the reply reveals the row's
code word; turn 2: reward 1 when the answer starts with it; 0 for an episode cut off before it) is the README's
example, examples/code_word.py."""

from __future__ import annotations

import sys
from pathlib import Path

from rlhf.rollout.user_code import load_callable

# The README's word game itself, loaded the way a run loads an environment, so the tests train the example users
# run (and a change to it shows here).
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "code_word.py"
CodeWord = load_callable(f"{EXAMPLE}:CodeWord", "environment", RuntimeError)
WORDS = sys.modules[CodeWord.__module__].WORDS


class Chatty(CodeWord):
    """CodeWord's turns, scored by how much the model said (characters / 10): rewards that differ within a group,
    for tests that need a gradient."""

    def reset(self, row):
        self.said = 0
        return super().reset(row)

    def step(self, message):
        self.said += len(message["content"])
        return super().step(message)

    def get_reward(self):
        return self.said / 10


class Broken(CodeWord):
    """Its step fails on the first turn, as a user's environment with a bug would."""

    def step(self, message):
        raise KeyError("score")
