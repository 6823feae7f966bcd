"""Run inside the vLLM virtualenv by test_vllm_training.py: writes a tiny Llama policy (head_dim 64: vLLM's CPU
attention refuses the default tiny model's 16) and 40 short prompts into the directory given."""

import json
import sys
from pathlib import Path

from rlhf.models.tiny import save_tiny, tiny_causal_lm, toy_corpus, train_tokenizer


def main(out: Path) -> None:
    tokenizer = train_tokenizer(toy_corpus(500), vocab_size=256)
    save_tiny(tiny_causal_lm("llama", tokenizer, hidden_size=128, num_heads=2, seed=0), tokenizer, out / "policy")
    rows = [{"prompt": " ".join(line.split()[: 3 + i % 2])} for i, line in enumerate(toy_corpus(40, seed=5))]
    (out / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
