"""The LLM judge, pairwise and listwise (`rlhf label --mode ranking`), against a real vLLM server (its CPU build,
from the vLLM virtualenv as test_vllm_server.py starts it) over a tiny local model: the plumbing, end to end. The
tiny model answers nonsense, so what is checked is that vLLM accepts every request, each reply becomes a row (a
verdict or an order when it reads as one, else a skip with the reply as its reason), and a rerun asks nothing the
cache holds. Skipped (or failed) without that virtualenv as test_vllm_engine.py is."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_vllm_engine import vllm_python

from rlhf.config import load_config
from rlhf.data.files import read_records
from rlhf.data.labels import live_preferences
from rlhf.labelling import run
from rlhf.models.tiny import save_tiny, tiny_causal_lm, toy_corpus, train_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.longest]

STARTUP = 600.0
LENGTH = 2048
"""The model's and the server's context: a listwise prompt of 3 answers is ~600 tokens of the toy tokenizer."""


def tiny_judge(out: Path) -> Path:
    """A tiny Llama with the toy chat template (head_dim 64: vLLM's CPU attention refuses 16)."""
    tokenizer = train_tokenizer(toy_corpus(500), vocab_size=256, model_max_length=LENGTH)
    model = tiny_causal_lm("llama", tokenizer, hidden_size=128, num_heads=2, seed=0).eval()
    return save_tiny(model, tokenizer, out)


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory) -> Iterator[str]:
    """A vLLM server over the tiny judge on a free local port, for the module; its ``/v1`` base URL."""
    python = vllm_python()  # skipped (or failed) before anything is built
    root = tmp_path_factory.mktemp("vllm_judge")
    model = tiny_judge(root / "tiny")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
               "tiny-judge", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--max-model-len", str(LENGTH), "--enforce-eager", "--gpu-memory-utilization", "0.2"]  # fmt: skip
    log = root / "server.log"
    with log.open("ab") as sink:  # its own session: killing the group ends the engine processes it spawns too
        process = subprocess.Popen(command, stdout=sink, stderr=sink, start_new_session=True, env=dict(os.environ))
    try:
        deadline = time.monotonic() + STARTUP
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the vLLM server did not start; its log ends:\n{log.read_text(errors='replace')[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=60)


@pytest.fixture
def candidates(tmp_path: Path) -> Path:
    path = tmp_path / "candidates.jsonl"
    answers = [["the cat sees a dog", "a small dog runs", "the old tree"], ["three and four is seven", "seven", "ten"]]
    rows = [
        {"prompt": p, "completions": a}
        for p, a in zip(["what does the cat see ?", "what is 3 + 4 ?"], answers, strict=True)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def label(url: str, candidates: Path, out: Path, mode: str) -> dict:
    config = load_config("label", None, [
        "--pairs", str(candidates), "--out", str(out), "--mode", mode, "--judge.source", f"openai:{url}#tiny-judge",
        "--judge.llm.tries", "2", "--judge.llm.backoff", "0", "--judge.llm.timeout", "120",
        "--judge.llm.concurrency", "2",
    ])  # fmt: skip
    return run(config)


@pytest.mark.parametrize(("mode", "rows", "requests"), [("pairs", 6, 12), ("ranking", 2, 4)])
def test_the_judge_asks_a_real_vllm_server_and_a_rerun_asks_only_what_is_missing(
    judge_url, candidates, tmp_path, mode, rows, requests
):
    out = tmp_path / "labels.jsonl"
    first = label(judge_url, candidates, out, mode)
    # every request answered (a refused one would have stopped the run); a reply that read as no verdict or order
    # was asked a second time, so between `requests` and twice that many were sent
    assert requests <= first["asked"] <= 2 * requests, first
    records = read_records(out)
    labels = [r.data for r in records[1:]]
    assert records[0].data["kind"] == "session" and len(labels) == rows
    for row in labels:
        assert row["source"] == "openai:tiny-judge" and row["kind"] in ("preference", "ranking", "tie", "skip")
        replies = [o["reply"] for o in row["judge"]] if mode == "ranking" else None
        if row["kind"] == "skip":
            assert row["reason"].startswith("no verdict" if mode == "pairs" else "no order of the 3 answers"), row
        if replies is not None:
            assert len(replies) == 2 and all(isinstance(reply, str) for reply in replies)
    live_preferences(records)  # the rows are labels the reward model's reader takes
    out.unlink()
    again = label(judge_url, candidates, out, mode)  # a new labels file: every reply from the cache
    assert again["asked"] == 0 and [r.data for r in read_records(out)[1:]] == labels  # the same rows
