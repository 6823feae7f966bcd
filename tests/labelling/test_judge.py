"""The LLM judge against a local OpenAI-compatible stub on 127.0.0.1 that is slow, fails, answers garbage and
is biased to the first answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from label_servers import read_lines
from openai_stub import StubJudge, serve

from rlhf import cli
from rlhf.config import ConfigError, load_config
from rlhf.data import read_preferences
from rlhf.labelling import run
from rlhf.labelling.judge import cache_path_for, parse_verdict
from rlhf.labelling.listwise import ListwiseJudge, combine, parse_ranking
from rlhf.labelling.pairs import read_candidates

N = 6


@pytest.fixture
def pairs(tmp_path: Path) -> Path:
    """N pairs whose longer answer is b in even rows and a in odd ones."""
    rows = []
    for i in range(N):
        short, long = f"No {i}.", f"Yes: {i} is a fine number, and here is why."
        rows.append({"prompt": f"Is {i} fine?", "a": short if i % 2 == 0 else long, "b": long if i % 2 == 0 else short})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def judged(stub: StubJudge, pairs: Path, out: Path, *flags: str) -> list[dict]:
    server, url = serve(stub)
    try:
        config = load_config("label", None, [
            "--pairs", str(pairs), "--out", str(out), "--judge.source", f"openai:{url}#stub-model",
            "--judge.llm.backoff", "0", "--judge.llm.timeout", "2", *flags,
        ])  # fmt: skip
        run(config)
    finally:
        server.shutdown()
    return [row for row in read_lines(out) if row["kind"] != "session"]


def test_a_consistent_judge_labels_every_pair_asked_in_both_orders(pairs, tmp_path):
    stub = StubJudge(rule="longer")
    rows = judged(stub, pairs, tmp_path / "judge.jsonl")
    assert len(stub.requests) == 2 * N and {r["path"] for r in stub.requests} == {"/v1/chat/completions"}
    assert [row["kind"] for row in rows] == ["preference"] * N
    for row in rows:
        assert row["chosen"].startswith("Yes") and row["source"] == row["labeller"] == "openai:stub-model"
        assert row["judge"] == {"ab": row["judge"]["ab"], "ba": row["judge"]["ab"]}
    first = stub.requests[0]["body"]
    assert first["model"] == "stub-model" and first["temperature"] == 0.0 and first["messages"][0]["role"] == "system"
    assert len(read_preferences(tmp_path / "judge.jsonl")) == N  # what `rlhf rm` reads


def test_a_judge_that_always_prefers_the_first_answer_gives_ties(pairs, tmp_path):
    rows = judged(StubJudge(rule="first"), pairs, tmp_path / "judge.jsonl")
    assert [row["kind"] for row in rows] == ["tie"] * N
    assert all(set(row["judge"].values()) == {"a", "b"} for row in rows)  # A then A: a, then b


def test_one_order_only_when_asked(pairs, tmp_path):
    stub = StubJudge(rule="first")
    rows = judged(stub, pairs, tmp_path / "judge.jsonl", "--judge.llm.no_both_orders")
    assert len(stub.requests) == N and [row["chosen"] for row in rows] == [
        json.loads(line)["a"] for line in pairs.read_text().splitlines()
    ]


def test_failures_garbage_and_slow_replies_are_retried(pairs, tmp_path):
    stub = StubJudge(fail_first=2, garbage_first=2, slow_first=1, slow_seconds=4.0)
    rows = judged(stub, pairs, tmp_path / "judge.jsonl", "--judge.llm.timeout", "1", "--judge.llm.tries", "6",
                  "--judge.llm.concurrency", "1")  # fmt: skip
    assert [row["kind"] for row in rows] == ["preference"] * N
    # the 5 bad replies were each asked again (more, if a busy machine also let an ordinary reply time out)
    assert len(stub.requests) >= 2 * N + 5


def test_a_server_that_keeps_failing_stops_the_run_and_a_rerun_asks_only_what_is_missing(pairs, tmp_path):
    out = tmp_path / "judge.jsonl"
    stub = StubJudge(fail_first=10**6)
    server, url = serve(stub)
    try:
        with pytest.raises(
            Exception, match=r"LLM judge http://127\.0\.0\.1:\d+/v1/chat/completions failed after 2 tries"
        ):
            judged_with(url, pairs, out, "--judge.llm.tries", "2")
    finally:
        server.shutdown()
    # half the pairs judged by a good server, then the run is interrupted…
    good = StubJudge()
    server, url = serve(good)
    try:
        config = judge_config(url, pairs, out)
        from rlhf.labelling.judge import LLMJudge, cache_path_for
        from rlhf.labelling.pairs import read_pairs

        judge = LLMJudge(config.judge.source, config.judge.llm, cache_path_for(config.judge.llm, out))
        judge.judge(read_pairs(pairs).pairs[:3])
        judge.close()
        assert len(good.requests) == 6
        run(config)  # …and run again: the 3 cached pairs are not asked again
        assert len(good.requests) == 2 * N
        run(config)  # a third run finds every pair in the labels file
        assert len(good.requests) == 2 * N
    finally:
        server.shutdown()
    assert [row["kind"] for row in read_lines(out)].count("preference") == N


def judge_config(url: str, pairs: Path, out: Path, *flags: str):
    return load_config("label", None, ["--pairs", str(pairs), "--out", str(out), "--judge.source",
                                       f"openai:{url}#stub-model", "--judge.llm.backoff", "0", *flags])  # fmt: skip


def judged_with(url: str, pairs: Path, out: Path, *flags: str) -> None:
    run(judge_config(url, pairs, out, *flags))


def test_a_refusal_is_final_and_names_the_url(pairs, tmp_path):
    stub = StubJudge(status=401)
    with pytest.raises(Exception, match=r"refused the request: HTTP 401"):
        judged(stub, pairs, tmp_path / "judge.jsonl")
    bodies = [json.dumps(r["body"], sort_keys=True) for r in stub.requests]
    assert len(bodies) == len(set(bodies))  # a 401 is not asked again


def test_the_api_key_comes_from_the_environment(pairs, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test-123")
    stub = StubJudge(api_key="sk-test-123")
    rows = judged(stub, pairs, tmp_path / "judge.jsonl", "--judge.llm.api_key_env", "MY_JUDGE_KEY")
    assert len(rows) == N and {r["auth"] for r in stub.requests} == {"Bearer sk-test-123"}


def test_a_reply_with_no_verdict_becomes_a_skip_after_its_tries(pairs, tmp_path):
    stub = StubJudge(reply="I cannot decide between these.")
    rows = judged(stub, pairs, tmp_path / "judge.jsonl", "--judge.llm.tries", "2")
    assert [row["kind"] for row in rows] == ["skip"] * N
    assert "no verdict" in rows[0]["reason"] and len(stub.requests) == 2 * N * 2


def test_concurrency_is_limited(pairs, tmp_path):
    stub = StubJudge(delay=0.1)
    judged(stub, pairs, tmp_path / "judge.jsonl", "--judge.llm.concurrency", "2")
    assert 1 <= stub.most_in_flight <= 2  # never more than the limit (2 unless the machine ran them one by one)


def test_a_template_of_ones_own(pairs, tmp_path):
    template = tmp_path / "template.txt"
    template.write_text(
        "Judge this.\n[The user's request]\n{prompt}\n\n[Answer A]\n{answer_a}\n\n[Answer B]\n{answer_b}\n\nA or B?"
    )
    stub = StubJudge()
    judged(stub, pairs, tmp_path / "judge.jsonl", "--judge.llm.template", str(template), "--judge.llm.system", "")
    # the requests arrive concurrently, in any order: each has the template's text and no system message
    asked = [request["body"]["messages"] for request in stub.requests]
    assert all(len(messages) == 1 for messages in asked)
    assert any(
        m[0]["content"].startswith("Judge this.\n[The user's request]\nIs 0 fine?\n\n[Answer A]\n") for m in asked
    )
    template.write_text("no placeholders")
    with pytest.raises(ConfigError, match=r"does not contain \{prompt\}, \{answer_a\}, \{answer_b\}"):
        judged(StubJudge(), pairs, tmp_path / "judge2.jsonl", "--judge.llm.template", str(template))


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [("A", "A"), ("b.", "B"), (" **B**", "B"), ("Answer A", "A"), ("tie", "tie"), ("Tie — both fine", "tie"),
     ("After thinking: [[B]]", "B"), ("Both are bad", None), ("", None), ("Absolutely A", None)],
)  # fmt: skip
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) == verdict


def test_bad_judge_specs_are_refused_before_anything_runs(pairs, tmp_path, capsys):
    for spec, message in [
        ("openai:http://127.0.0.1:9/v1", "must look like openai:http://host:port/v1#model-name"),
        ("openai:ftp://x#m", "must look like"),
    ]:
        code = cli.main(["label", str(pairs), "--out", str(tmp_path / "x.jsonl"), "--judge.source", spec])
        assert code == 2 and message in capsys.readouterr().err
    code = cli.main(["sample", "--model.name", "m", "--prompts", "p", "--output", "o", "--mode", "candidates",
                     "--judge.source", "openai:http://127.0.0.1:9/v1#m"])  # fmt: skip
    assert code == 2 and "it labels mode='preferences' only" in capsys.readouterr().err


def test_a_judge_whose_server_is_down_is_the_users_environment_not_a_bug(pairs, tmp_path, capsys):
    server, url = serve(StubJudge())
    server.shutdown()  # the port was ours a moment ago and nothing listens there now
    server.server_close()
    flags = ["--judge.source", f"openai:{url}#m", "--judge.llm.tries", "2", "--judge.llm.backoff", "0"]
    code = cli.main(["label", str(pairs), "--out", str(tmp_path / "x.jsonl"), *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "internal error" not in err and "bug" not in err
    assert f"LLM judge {url}/chat/completions failed after 2 tries" in err
    assert "try 1: cannot connect" in err and "try 2: cannot connect" in err


def test_a_cache_cut_by_a_crash_is_read_without_its_torn_line(pairs, tmp_path, capsys):
    out = tmp_path / "judge.jsonl"
    first = StubJudge()
    judged(first, pairs, out)
    cache = Path(f"{out}.judge-cache.jsonl")
    lines = cache.read_text().splitlines(keepends=True)
    cache.write_text("".join(lines[:-1]) + lines[-1][:20])  # the last reply's line cut mid-write
    out.unlink()
    again = StubJudge()
    judged(again, pairs, out)
    assert len(again.requests) == 1  # only the reply whose line was cut is asked again
    assert Path(f"{cache}.torn-1").read_text() == lines[-1][:20]
    assert "cut off by a crash" in capsys.readouterr().err


# k answers at once (label mode ranking): rlhf.labelling.listwise

M = 4


@pytest.fixture
def candidates(tmp_path: Path) -> Path:
    """M items of 3 answers whose lengths differ, the longest in a different place in each."""
    rows = []
    for i in range(M):
        answers = [f"Yes {i}: {'and more ' * n}" for n in (1, 3, 2)]
        answers = answers[i % 3 :] + answers[: i % 3]
        rows.append({"prompt": f"Is {i} fine?", "completions": answers})
    path = tmp_path / "candidates.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def ranked(stub: StubJudge, candidates: Path, out: Path, *flags: str) -> list[dict]:
    return judged(stub, candidates, out, "--mode", "ranking", *flags)


def completions(path: Path) -> list[list[str]]:
    return [json.loads(line)["completions"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("reply", "k", "order"),
    [("[2] > [3] > [1]", 3, [1, 2, 0]), ("2 > 3 > 1", 3, [1, 2, 0]), ("[2], [3], [1].", 3, [1, 2, 0]),
     ("Best first: [Answer 2] > [Answer 3] > [Answer 1]", 3, [1, 2, 0]),
     ("[3] is thin and [1] is wrong.\nSo: [2] > [1] > [3]", 3, [1, 0, 2]),
     ("1. [3]\n2. [1]\n3. [2]", 3, [2, 0, 1]), ("[1] > [2]", 2, [0, 1]),
     ("I like them all.", 3, None), ("", 3, None), ("[2] > [1]", 3, None), ("[2] > [2] > [1]", 3, None),
     ("[4] > [2] > [1]", 3, None), ("[2] > [3] > [1]", 4, None), ("[0] > [1] > [2]", 3, None),
     ("So: [2] > [1] > [3] > [3]", 3, None)],
)  # fmt: skip
def test_parse_ranking(reply, k, order):
    assert parse_ranking(reply, k) == order


@pytest.mark.parametrize(
    ("rankings", "combined"),
    [
        ([[1, 0, 2]], [1, 0, 2]),
        ([[1, 0, 2], [1, 0, 2]], [1, 0, 2]),  # the orders agree
        ([[0, 1, 2], [1, 0, 2]], [[0, 1], 2]),  # mean ranks 0.5, 0.5, 2
        ([[0, 1, 2], [2, 1, 0]], [[0, 1, 2]]),  # the order shown, both times: position alone, every mean rank 1
        ([[0, 1, 2, 3], [2, 3, 1, 0]], [2, [0, 1], 3]),  # mean ranks 1.5, 1.5, 1, 2
        ([[0, 1, 2], [2, 0, 1]], [0, 2, 1]),  # mean ranks 0.5, 1.5, 1
    ],
)
def test_two_rankings_combine_by_mean_rank_and_equal_means_tie(rankings, combined):
    assert combine(rankings) == combined


def test_the_listwise_prompt_shows_the_answers_as_given_then_reversed(candidates, tmp_path):
    stub = StubJudge()
    ranked(stub, candidates, tmp_path / "judge.jsonl")
    users = {r["body"]["messages"][-1]["content"] for r in stub.requests}
    a = completions(candidates)[0]
    for shown in (a, a[::-1]):
        assert (
            "[The user's request]\nIs 0 fine?\n\n"
            f"[Answer 1]\n{shown[0]}\n\n[Answer 2]\n{shown[1]}\n\n[Answer 3]\n{shown[2]}\n\n"
            "Rank the 3 answers from best to worst. Reply with one line only: the answers' numbers in brackets, best "
            'first, separated by ">", for example [2] > [3] > [1]. Name every answer exactly once.'
        ) in users
    assert len(users) == len(stub.requests) == 2 * M
    assert {r["body"]["max_tokens"] for r in stub.requests} == {16 + 8 * 3}  # room for the order of 3
    assert stub.requests[0]["body"]["messages"][0]["role"] == "system"


def test_a_consistent_judge_ranks_each_item_in_one_row(candidates, tmp_path):
    stub = StubJudge(rule="longer")
    out = tmp_path / "judge.jsonl"
    rows = ranked(stub, candidates, out)
    assert [row["kind"] for row in rows] == ["ranking"] * M
    for row, answers in zip(rows, completions(candidates), strict=True):
        longest_first = sorted(range(3), key=lambda i: -len(answers[i]))
        assert row["ranking"] == longest_first and row["completions"] == answers
        assert [o["shown"] for o in row["judge"]] == [[0, 1, 2], [2, 1, 0]]
        assert [o["ranking"] for o in row["judge"]] == [longest_first] * 2
        assert row["source"] == row["labeller"] == "openai:stub-model" and row["item"] and row["id"]
    pairs = read_preferences(out)  # what `rlhf rm` reads: each ranking as its 3 pairs, the longer answer chosen
    assert len(pairs) == 3 * M and all(len(p.chosen) > len(p.rejected) for p in pairs)
    assert json.loads(out.read_text().splitlines()[0])["mode"] == "ranking"


def test_a_judge_with_pure_position_bias_gives_ties(candidates, tmp_path):
    rows = ranked(StubJudge(rule="first"), candidates, tmp_path / "judge.jsonl")
    assert [row["kind"] for row in rows] == ["tie"] * M
    assert all("ranking" not in row and len(row["completions"]) == 3 for row in rows)
    assert [o["ranking"] for o in rows[0]["judge"]] == [[0, 1, 2], [2, 1, 0]]


def test_rankings_that_disagree_tie_the_answers_of_equal_mean_rank(candidates, tmp_path):
    given = completions(candidates)

    def rank(shown: list[str]) -> str:  # as given: 0 > 1 > 2; reversed (2, 1, 0): [2] > [3] > [1] = 1 > 0 > 2
        return "[1] > [2] > [3]" if shown in given else "[2] > [3] > [1]"

    out = tmp_path / "judge.jsonl"
    rows = ranked(StubJudge(rank=rank), candidates, out)
    assert [row["ranking"] for row in rows] == [[[0, 1], 2]] * M
    assert [(p.chosen, p.rejected) for p in read_preferences(out)][:2] == [(given[0][0], given[0][2]),
                                                                            (given[0][1], given[0][2])]  # fmt: skip


def test_one_order_only_when_asked_for_k_answers(candidates, tmp_path):
    stub = StubJudge(rule="first")
    rows = ranked(stub, candidates, tmp_path / "judge.jsonl", "--judge.llm.no_both_orders")
    assert len(stub.requests) == M and [row["ranking"] for row in rows] == [[0, 1, 2]] * M


@pytest.mark.parametrize("reply", ["I cannot rank these.", "[2] > [1]", "[2] > [2] > [1]"])
def test_a_reply_that_is_no_order_is_asked_again_then_skipped(candidates, tmp_path, reply):
    stub = StubJudge(reply=reply)
    rows = ranked(stub, candidates, tmp_path / "judge.jsonl", "--judge.llm.tries", "2")
    assert [row["kind"] for row in rows] == ["skip"] * M and len(stub.requests) == 2 * M * 2
    assert rows[0]["reason"] == f"no order of the 3 answers in the reply {reply!r}"
    assert rows[0]["judge"][0]["reply"] == reply and rows[0]["judge"][0]["ranking"] is None


def test_one_unreadable_item_is_skipped_and_the_others_ranked(candidates, tmp_path):
    bad = completions(candidates)[2]

    def rank(shown: list[str]) -> str:
        return "no idea" if sorted(shown) == sorted(bad) else "[1] > [2] > [3]"

    rows = ranked(StubJudge(rank=rank), candidates, tmp_path / "judge.jsonl", "--judge.llm.tries", "1")
    assert [row["kind"] for row in rows] == ["tie", "tie", "skip", "tie"]


def test_a_rerun_asks_only_what_is_missing_from_the_cache_and_the_labels(candidates, tmp_path):
    out = tmp_path / "judge.jsonl"
    stub = StubJudge()
    server, url = serve(stub)
    try:
        config = judge_config(url, candidates, out, "--mode", "ranking")
        judge = ListwiseJudge(config.judge.source, config.judge.llm, cache_path_for(config.judge.llm, out))
        judge.rank(read_candidates(candidates).items[:2])  # interrupted before its rows were written
        judge.close()
        assert len(stub.requests) == 4
        run(config)  # the 2 cached items are not asked again
        assert len(stub.requests) == 2 * M
        assert run(config)["judged"] == 0  # every item is in the labels file: none ranked twice
        assert len(stub.requests) == 2 * M and len(read_lines(out)) == 1 + M
        out.unlink()
        run(config)  # a new labels file: every reply from the cache
        assert len(stub.requests) == 2 * M
    finally:
        server.shutdown()
    assert [row["kind"] for row in read_lines(out)] == ["session"] + ["ranking"] * M


def test_label_mode_picks_the_question(candidates, pairs, tmp_path):
    stub = StubJudge()
    rows = judged(stub, candidates, tmp_path / "auto.jsonl")  # auto: pairs with an LLM judge
    assert [row["kind"] for row in rows] == ["preference"] * 3 * M and len(stub.requests) == 2 * 3 * M
    rows = judged(StubJudge(), candidates, tmp_path / "in_pairs.jsonl", "--mode", "pairs")
    assert [row["kind"] for row in rows] == ["preference"] * 3 * M
    rows = ranked(StubJudge(), pairs, tmp_path / "a_pairs_file.jsonl")  # a pairs file is labelled in pairs
    assert [row["kind"] for row in rows] == ["preference"] * N
    with pytest.raises(ConfigError, match=r"judge\.jsonl was not started by `rlhf label --mode ranking`"):
        out = tmp_path / "judge.jsonl"
        judged(StubJudge(), candidates, out)
        ranked(StubJudge(), candidates, out)


def test_a_listwise_template_of_ones_own_and_max_tokens(candidates, tmp_path):
    template = tmp_path / "template.txt"
    template.write_text("Order these {k}.\n{prompt}\n\n{answers}\n\nBest first, like {example}.")
    stub = StubJudge()
    rows = ranked(stub, candidates, tmp_path / "judge.jsonl", "--judge.llm.template", str(template),
                  "--judge.llm.max_tokens", "7")  # fmt: skip
    assert [row["kind"] for row in rows] == ["ranking"] * M
    assert any(r["body"]["messages"][-1]["content"].startswith("Order these 3.\nIs 0 fine?\n\n[Answer 1]\n")
               for r in stub.requests)  # fmt: skip
    assert {r["body"]["max_tokens"] for r in stub.requests} == {7}
    template.write_text("Order these: {prompt}")
    with pytest.raises(ConfigError, match=r"does not contain \{answers\}"):
        ranked(StubJudge(), candidates, tmp_path / "judge2.jsonl", "--judge.llm.template", str(template))
