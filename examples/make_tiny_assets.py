"""Build the offline assets the example configs use: a tiny Llama policy, a tiny reward model and prompts.

    python examples/make_tiny_assets.py            # writes examples/assets/
    rlhf ppo --config examples/ppo_tiny.yaml       # PPO against examples/rewards.py:digits
    rlhf sft --config examples/sft_tiny.yaml       # SFT on examples/assets/sft.jsonl
    rlhf rm --config examples/rm_tiny.yaml         # a reward model on examples/assets/preferences.jsonl
    rlhf sft --config examples/sft_code_word.yaml  # then grpo_code_word.yaml: multi-turn (examples/code_word.py)

Everything is random-initialised and trained locally (no downloads); replace `policy:` / `reward:` in the
YAML files with your own model directories or hub ids for real work.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from rlhf.models.tiny import save_tiny, tiny_causal_lm, tiny_reward_model, toy_corpus, train_tokenizer


def main(root: Path) -> None:
    tokenizer = train_tokenizer(toy_corpus(2000, seed=0))
    save_tiny(tiny_causal_lm("llama", tokenizer, seed=0), tokenizer, root / "policy")
    save_tiny(tiny_reward_model("llama", tokenizer, seed=1), tokenizer, root / "reward_model")
    lines = toy_corpus(400, seed=1)
    with (root / "prompts.jsonl").open("w") as f:
        for line in lines[:360]:
            f.write(json.dumps({"prompt": " ".join(line.split()[:3])}) + "\n")
    with (root / "eval_prompts.jsonl").open("w") as f:
        for line in lines[360:]:
            f.write(json.dumps({"prompt": " ".join(line.split()[:3])}) + "\n")
    # SFT demonstrations and preference pairs on a toy task: answer "what is a + b?" with the sum
    rng = random.Random(0)
    questions = [(a, b) for a in range(10) for b in range(10)]
    with (root / "sft.jsonl").open("w") as f:
        for a, b in questions:
            f.write(json.dumps({"prompt": f"what is {a} + {b}?", "response": f" {a + b}"}) + "\n")
    for name, pairs in (("preferences.jsonl", questions * 10), ("eval_preferences.jsonl", questions)):
        with (root / name).open("w") as f:
            for a, b in pairs:
                wrong = rng.choice([n for n in range(19) if n != a + b])
                row = {"prompt": f"what is {a} + {b}?", "chosen": f" {a + b}", "rejected": f" {wrong}"}
                f.write(json.dumps(row) + "\n")
    code_word(root, rng)
    print(
        f"wrote {root}/: policy/, reward_model/, prompts.jsonl, eval_prompts.jsonl, sft.jsonl, preferences.jsonl, "
        "code_word_sft.jsonl, code_word_prompts.jsonl"
    )


def code_word(root: Path, rng: random.Random) -> None:
    """The word game of examples/code_word.py: conversations in its format whose answers are random words (SFT
    teaches the format, not the game), and rows naming each episode's word."""
    from code_word import WORDS

    with (root / "code_word_sft.jsonl").open("w") as f:
        for _ in range(256):
            turns = ["listen", "ok", f"the word is {rng.choice(WORDS)}", rng.choice(WORDS)]
            messages = [{"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(turns)]
            f.write(json.dumps({"messages": messages}) + "\n")
    with (root / "code_word_prompts.jsonl").open("w") as f:
        for i in range(64):
            f.write(json.dumps({"prompt": "play", "word": i % len(WORDS)}) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "assets")
