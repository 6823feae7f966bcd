"""Environments and tools the multi-turn tests load by path (``episode_envs.py:CodeWord``), written as users
write them: a class made once per episode with ``reset(row)`` and ``step(message)``."""

from __future__ import annotations

WORDS = ["cat", "dog", "bird", "fish", "cow", "tree", "book", "ball"]


class CodeWord:
    """Turn 1: whatever the model says, the reply reveals the row's code word. Turn 2: reward 1 when the model's
    answer starts with it (a policy that ignores the reply guesses right 1 time in 8 at best). An episode that
    never gets to answer scores 0 (``get_reward``)."""

    def reset(self, row):
        self.word, self.turn, self.score = WORDS[row["word"]], 0, 0.0
        return [{"role": "user", "content": "listen"}]

    def step(self, message):
        self.turn += 1
        if self.turn == 1:
            return [{"role": "user", "content": f"the word is {self.word}"}], None, False
        words = message["content"].split()
        self.score = float(bool(words) and words[0] == self.word)
        return [], None, True

    def get_reward(self):
        return self.score


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
