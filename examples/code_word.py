"""A word game for multi-turn RL (`rollout.environment: examples/code_word.py:CodeWord`): the model must read the
environment's reply to score. The policy's first turn gets the row's code word back; its second turn scores 1 when
it starts with that word, 0 otherwise. A policy that ignores the reply is right 1 time in 8 at best.

    python examples/make_tiny_assets.py
    rlhf sft --config examples/sft_code_word.yaml    # the format: short turns that stop (answers are random words)
    rlhf grpo --config examples/grpo_code_word.yaml  # learns to copy the word: reward 0.12 → 0.89-0.97
"""

from __future__ import annotations

WORDS = ["cat", "dog", "bird", "fish", "cow", "tree", "book", "ball"]


class CodeWord:
    """One instance per episode. ``reset`` gets the data row (here its ``word`` column, an index into WORDS);
    ``step`` gets each assistant message and returns (reply messages, reward or None, done)."""

    def reset(self, row: dict) -> list[dict]:
        self.word, self.turn, self.score = WORDS[row["word"]], 0, 0.0
        return [{"role": "user", "content": "listen"}]

    def step(self, message: dict) -> tuple[list[dict], float | None, bool]:
        self.turn += 1
        if self.turn == 1:
            return [{"role": "user", "content": f"the word is {self.word}"}], None, False
        words = message["content"].split()
        self.score = float(bool(words) and words[0] == self.word)
        return [], None, True

    def get_reward(self) -> float:
        """The episode's reward at its end; also 0 for an episode cut off before its answer."""
        return self.score
