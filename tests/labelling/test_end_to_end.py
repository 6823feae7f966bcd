"""sample → label in the browser → rm, and an LLM judge's labels of the same pairs beside a person's."""

from __future__ import annotations

import json
import math

import pytest
from browser import screenshot
from label_servers import read_lines, start_process
from openai_stub import StubJudge, serve

from rlhf import cli
from rlhf.models.tiny import toy_corpus

pytestmark = pytest.mark.slow


def test_sample_label_in_the_browser_then_train_a_reward_model(
    browser, tiny_llama_dir, tiny_reward_model_dir, tmp_path, capsys
):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(line.split()[:4])}) + "\n" for line in toy_corpus(6, 3)))
    sampled = ["--model.name", str(tiny_llama_dir), "--prompts", str(prompts), "--num_samples", "4",
               "--sampling.max_new_tokens", "8", "--no-progress"]  # fmt: skip
    pairs = tmp_path / "pairs.jsonl"
    assert cli.main(["sample", *sampled, "--mode", "pairs", "--output", str(pairs)]) == 0
    n_pairs = len(read_lines(pairs))
    assert n_pairs >= 8

    # a person labels every pair in the browser: better answer by key, alternating sides
    human = tmp_path / "human.jsonl"
    process, url = start_process(pairs, human)
    try:
        page = browser.new_page()
        page.goto(url + "?labeller=ana")
        for i in range(n_pairs):
            page.wait_for_selector("#left .text")
            page.keyboard.press("1" if i % 2 == 0 else "2")
            page.wait_for_function(
                "n => document.getElementById('progress').textContent.includes(`you: ${n}`)", arg=i + 1
            )
        page.wait_for_selector("#done:not([hidden])")
        screenshot(page, "label-end-to-end-done")
    finally:
        process.terminate()
        process.wait(10)
    rows = [row for row in read_lines(human) if row["kind"] == "preference"]
    assert len(rows) == n_pairs

    # an LLM judge labels the same samples (same seed: the same completions, the same pair ids)
    stub = StubJudge(rule="longer")
    server, base = serve(stub)
    judged = tmp_path / "judge.jsonl"
    try:
        assert cli.main(["sample", *sampled, "--mode", "preferences", "--output", str(judged), "--judge.source",
                         f"openai:{base}#stub", "--judge.llm.backoff", "0"]) == 0  # fmt: skip
    finally:
        server.shutdown()
    judge_rows = read_lines(judged)
    assert len(judge_rows) == n_pairs and {row["source"] for row in judge_rows} == {"openai:stub"}
    assert {row["pair"] for row in judge_rows} == {row["pair"] for row in rows}
    capsys.readouterr()
    assert cli.main(["label", "--stats", str(human), str(judged), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["labellers"]["ana"]["preferences"] == n_pairs
    assert stats["agreement"]["pairs"] == n_pairs - sum(row["kind"] == "skip" for row in judge_rows)
    (cohen,) = stats["agreement"]["cohen_kappa"]
    assert cohen["labellers"] == ["ana", "openai:stub"]

    # the person's labels train a reward model as they are
    out = tmp_path / "rm"
    assert cli.main(["rm", "--model.name", str(tiny_reward_model_dir), "--data.train", str(human), "--output_dir", str(out),
                     "--batch.size", "4", "--rm.epochs", "1", "--run.save_every", "0", "--run.no-progress"]) == 0  # fmt: skip
    assert (out / "final" / "config.json").exists()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert losses and all(math.isfinite(loss) for loss in losses)
