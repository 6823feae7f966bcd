"""Fixtures of the multi-process tests: the prompts every RL run here trains on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.models.tiny import toy_corpus


@pytest.fixture(scope="session")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 prompts of 3-4 words from the toy language."""
    path = tmp_path_factory.mktemp("dist_prompts") / "prompts.jsonl"
    rows = [{"prompt": " ".join(line.split()[: 3 + i % 2])} for i, line in enumerate(toy_corpus(40, seed=5))]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def word_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 rows for the multi-turn runs, each naming its code word (``episode_envs.py``)."""
    path = tmp_path_factory.mktemp("dist_words") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": "x", "word": i % 8}) + "\n" for i in range(16)))
    return path
