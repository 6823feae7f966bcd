"""Build the offline assets the example configs use: a tiny Llama policy, a tiny reward model and prompts.

    python examples/make_tiny_assets.py            # writes examples/assets/
    rlhf ppo --config examples/ppo_tiny.yaml       # trains against examples/rewards.py:short_and_counting

Everything is random-initialised and trained locally (no downloads); replace `policy:` / `reward:` in the
YAML files with your own model directories or hub ids for real work.
"""

from __future__ import annotations

import json
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
    print(f"wrote {root}/policy, {root}/reward_model, {root}/prompts.jsonl, {root}/eval_prompts.jsonl")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "assets")
