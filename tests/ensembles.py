"""Reward-model ensembles for the tests: tiny members written as `rlhf rm` leaves an ensemble."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from rlhf.models.reward import set_reward_normalization
from rlhf.models.tiny import save_tiny, tiny_reward_model

MEMBERS = 3


def write_ensemble(root: Path, tokenizer_dir: Path, members: int = MEMBERS) -> Path:
    """An ensemble directory of ``members`` tiny reward models, each from its own seed and with its own stored
    normalisation (gain, bias), as `rlhf rm` leaves them: their scales differ."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    names = [f"member_{m}" for m in range(members)]
    for m, name in enumerate(names):
        model = tiny_reward_model("llama", tokenizer, seed=10 + m)
        set_reward_normalization(model.config, gain=1.0 + m, bias=0.5 * m)
        save_tiny(model, tokenizer, root / name)
    (root / "ensemble.json").write_text(json.dumps({"members": names}))
    return root
