"""Ranking over real HTTP: the round trip, refusals that write nothing, and kill -9 after acknowledged rankings."""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from label_servers import call, gold_order, grade, read_lines, server_thread, start_process, write_candidates


def rank_body(served: dict, ranking) -> dict:
    """The POST /api/rank body of a ranking of ``served`` (an /api/next reply's ``rank``) by ana."""
    return {"labeller": "ana", "item": served["id"], "ranking": ranking, "id": served["label_id"], "seconds": 3.0}


def canonical(served: dict) -> list[int]:
    """The gold ranking of a served item, as indices into the item's own order (``shown`` maps them back)."""
    return [served["shown"][i] for i in gold_order(served["answers"])]


def test_a_ranking_round_trip_its_retry_and_refusals_that_write_nothing(tmp_path):
    path, out = write_candidates(tmp_path / "candidates.jsonl", 2, 4), tmp_path / "prefs.jsonl"
    with server_thread(path, out) as base:
        status, reply = call(base, "/api/next?labeller=ana")
        assert status == 200 and "pair" not in reply
        served = reply["rank"]
        assert sorted(served["shown"]) == [0, 1, 2, 3] and len(served["answers"]) == 4
        for name, ranking in {"repeated": [0, 0, 1, 2], "missing": [0, 1, 2], "out of range": [0, 1, 2, 9]}.items():
            status, refusal = call(base, "/api/rank", rank_body(served, ranking))
            assert status == 400 and "ranking" in refusal["error"], name
        assert [row["kind"] for row in read_lines(out)] == ["session"]  # nothing written
        assert call(base, "/api/rank", rank_body(served, [0, 1, 2, 3]) | {"item": "0" * 16})[0] == 404
        status, saved = call(base, "/api/rank", rank_body(served, canonical(served)))
        assert status == 200 and saved["saved"] is True and saved["kind"] == "ranking"
        assert read_lines(out)[-1]["id"] == saved["id"]  # on disk when the reply arrives
        assert call(base, "/api/rank", rank_body(served, canonical(served)))[1]["id"] == saved["id"]  # a retry
        status, undone = call(base, "/api/undo", {"labeller": "ana", "id": saved["id"]})
        assert status == 200 and undone == {"undone": saved["id"], "item": served["id"]}
    rows = read_lines(out)
    assert [row["kind"] for row in rows] == ["session", "ranking", "retraction"]
    ranked = rows[1]
    assert [grade(ranked["completions"][i]) for i in ranked["ranking"]] == [3, 2, 1, 0]
    assert ranked["shown"] == served["shown"]


@pytest.mark.slow
def test_kill_9_after_acknowledged_rankings_loses_and_doubles_nothing(tmp_path):
    path, out = write_candidates(tmp_path / "candidates.jsonl", 12, 5), tmp_path / "prefs.jsonl"
    acked: list[str] = []
    for round_ in range(3):  # label some, kill -9 right after the last acknowledgement, restart
        process, url = start_process(path, out)
        base = url.rstrip("/")
        try:
            for _ in range(3):
                served = call(base, "/api/next?labeller=ana")[1]["rank"]
                status, reply = call(base, "/api/rank", rank_body(served, canonical(served)))
                assert status == 200, reply
                acked.append(reply["id"])
            if round_ == 1:  # the reply of the last one "lost": sent again after the restart
                resend = rank_body(served, canonical(served))
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            process.stdout.close()
            process.stderr.close()
        if round_ == 2:
            process, url = start_process(path, out)
            try:
                assert call(url.rstrip("/"), "/api/rank", resend)[1]["id"] == acked[5]
                assert call(url.rstrip("/"), "/api/next?labeller=ana")[1]["progress"]["done"] == 9
            finally:
                process.terminate()
                process.wait(10)
    rows = [row for row in read_lines(out) if row["kind"] != "session"]
    assert Counter(row["id"] for row in rows) == Counter(acked)  # every acknowledged ranking, each once
    assert all(row["kind"] == "ranking" and len(row["completions"]) == 5 for row in rows)
    assert len({row["item"] for row in rows}) == 9
