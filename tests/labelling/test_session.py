"""The labelling session without HTTP: serving order, labels on disk, undo, restart, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from label_servers import read_lines, write_pairs

from rlhf.config import ConfigError
from rlhf.data import read_preferences
from rlhf.data.files import DataError, Record
from rlhf.data.labels import live_preferences, pair_id
from rlhf.labelling.pairs import read_candidates, read_items, read_pairs
from rlhf.labelling.session import LabelSession, Refused


def open_session(tmp_path: Path, n: int = 4, **kwargs) -> LabelSession:
    pairs = tmp_path / "pairs.jsonl"
    if not pairs.exists():
        write_pairs(pairs, n)
    return LabelSession(read_items(pairs, mode="pairs"), tmp_path / "prefs.jsonl", **kwargs)


def label(session: LabelSession, who: str, label: str = "a", **kwargs):
    served = session.next(who)
    assert served is not None
    return served, session.label(who, served.item.id, label, served.label_id, served.left, **kwargs)


def test_pair_ids_ignore_which_answer_is_called_a():
    assert pair_id("q", "x", "y") == pair_id("q", "y", "x") != pair_id("q", "x", "z")
    assert pair_id([{"role": "user", "content": "q"}], "x", "y") != pair_id("q", "x", "y")


def test_candidates_become_every_pair_of_distinct_answers(tmp_path):
    path = tmp_path / "candidates.jsonl"
    rows = [
        {"prompt": "p", "completions": ["x", "y", "z", "x"]},
        {"messages": [{"role": "user", "content": "hi"}], "a": "u", "b": "v"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = read_pairs(path)
    # x,y x,z x,x(identical) y,z y,x(repeat of x,y) z,x(repeat) → 3 pairs, 1 identical, 2 repeated; + 1 chat pair
    assert [(p.a, p.b) for p in pairs.pairs] == [("x", "y"), ("x", "z"), ("y", "z"), ("u", "v")]
    assert (pairs.identical, pairs.repeated) == (1, 2)
    assert pairs.pairs[3].prompt == [{"role": "user", "content": "hi"}]


def test_candidates_to_rank_keep_each_rows_distinct_answers_and_their_ranking_reads_as_pairs(tmp_path):
    path = tmp_path / "candidates.jsonl"
    chat = [{"role": "user", "content": "hi"}]
    rows = [
        {"prompt": "p", "completions": ["x", "y", "z", "x"]},
        {"prompt": "p", "completions": ["z", "y", "x"]},  # the same item in another order: repeated
        {"messages": chat, "completions": ["u", "v"]},
        {"prompt": "p", "completions": ["w", "w"]},
        {"prompt": "p", "a": "x", "b": "y"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as error:
        read_candidates(path)
    assert 'candidates.jsonl:4: "completions" are all the same text' in str(error.value)
    assert 'candidates.jsonl:5: expected "completions"' in str(error.value)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    items = read_candidates(path)
    assert [item.answers for item in items.items] == [("x", "y", "z"), ("u", "v")]
    assert (items.identical, items.repeated) == (1, 1)
    # a ranking row is a label like a preference: kept, counted, and read as its pairs (best first, ties apart)
    row = items.items[0].ranking_row([1, [0, 2]], id="r1")
    chat_row = items.items[1].ranking_row([1, 0], id="r2")
    assert chat_row["completions"][0] == [{"role": "assistant", "content": "u"}]
    kept, counts = live_preferences([Record(row, "l:1"), Record(chat_row, "l:2")])
    assert (counts.preferences, counts.rankings) == (0, 2)
    assert len(kept) == 2
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(chat_row) + "\n")
    pairs = [(p.chosen, p.rejected) for p in read_preferences(path)]
    assert pairs[:2] == [("y", "x"), ("y", "z")]
    assert pairs[2] == ([{"role": "assistant", "content": "v"}], [{"role": "assistant", "content": "u"}])


def test_bad_pair_rows_are_listed_with_their_lines(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": "p", "a": "x"},
        {"prompt": "p", "completions": ["only one"]},
        {"prompt": 3, "a": "x", "b": "y"},
        {"x": 1},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as error:
        read_pairs(path)
    text = str(error.value)
    assert 'pairs.jsonl:1: "b" must be a string' in text
    assert 'pairs.jsonl:2: "completions" has 1 answer(s)' in text
    assert "pairs.jsonl:3:" in text and "pairs.jsonl:4: expected" in text


def test_each_label_is_a_line_on_disk_when_label_returns(tmp_path):
    session = open_session(tmp_path)
    served, row = label(session, "ana", "a", seconds=2.25, ratings={"a": "good", "b": "bad"})
    lines = read_lines(tmp_path / "prefs.jsonl")  # read back before the session closes: already on disk
    assert lines[0]["kind"] == "session" and lines[0]["pairs_count"] == 4
    assert lines[1] == row
    pair = served.item
    assert row["kind"] == "preference" and (row["chosen"], row["rejected"]) == (pair.a, pair.b)
    assert row["left"] == ("chosen" if served.left == "a" else "rejected")
    assert row["ratings"] == {"chosen": "good", "rejected": "bad"}
    assert row["seconds"] == 2.25 and row["source"] == "human" and row["labeller"] == "ana"
    session.close()


def test_pairs_go_out_in_order_each_to_labels_per_pair_labellers_never_twice_to_one(tmp_path):
    session = open_session(tmp_path, n=3, labels_per_pair=2)
    ana, bo, cy = (session.next(who) for who in ("ana", "bo", "cy"))
    assert ana.item.id == bo.item.id  # the first pair is leased to two labellers: it needs two labels
    assert cy.item.id != ana.item.id  # …and no third
    assert session.next("ana").label_id == ana.label_id  # a reload shows the same pair, same id
    session.label("ana", ana.item.id, "a", ana.label_id, ana.left)
    assert session.next("ana").item.id != ana.item.id  # never the same pair twice to one labeller
    with pytest.raises(Refused) as error:
        session.label("ana", ana.item.id, "b", "another-id-123", ana.left)
    assert error.value.status == 409
    session.close()


def test_a_label_sent_twice_is_saved_once(tmp_path):
    session = open_session(tmp_path)
    served, row = label(session, "ana")
    again = session.label("ana", served.item.id, "a", served.label_id, served.left)
    assert again == row
    assert len(read_lines(tmp_path / "prefs.jsonl")) == 2  # the session line and one label
    with pytest.raises(Refused, match="already used"):
        session.label("bo", served.item.id, "a", served.label_id, served.left)
    session.close()


def test_undo_appends_a_retraction_and_gives_the_pair_back(tmp_path):
    session = open_session(tmp_path)
    first, row1 = label(session, "ana", "a")
    second, row2 = label(session, "ana", "tie")
    with pytest.raises(Refused, match="latest"):
        session.undo("ana", row1["id"])
    undone = session.undo("ana", row2["id"])
    assert undone["id"] == row2["id"]
    assert session.undo("ana", row2["id"])["id"] == row2["id"]  # sent twice: retracted once
    lines = read_lines(tmp_path / "prefs.jsonl")
    assert [line["kind"] for line in lines] == ["session", "preference", "tie", "retraction"]
    assert lines[3]["retracts"] == row2["id"]
    assert session.next("ana").item.id == second.item.id  # label it again
    session.undo("ana")
    with pytest.raises(Refused, match="no label to undo"):
        session.undo("ana")
    session.close()


def test_a_restart_replays_the_file_and_continues(tmp_path):
    session = open_session(tmp_path)
    _, kept = label(session, "ana", "b")
    _, gone = label(session, "ana", "a")
    session.undo("ana")
    skipped, _ = label(session, "bo", "skip")
    session.close()
    again = open_session(tmp_path)
    assert again.history["ana"] == [kept["id"]]
    assert again.progress("ana")["last"] == kept["id"]
    assert again.next("bo").item.id != skipped.item.id  # bo skipped it: not shown to bo again
    assert again.progress("ana")["done"] == 1  # a skip decides nothing
    assert len([line for line in read_lines(tmp_path / "prefs.jsonl") if line["kind"] == "session"]) == 1
    again.close()


def test_a_changed_pairs_file_or_a_second_session_is_refused(tmp_path):
    session = open_session(tmp_path)
    with pytest.raises(ConfigError, match="another `rlhf label` process"):
        open_session(tmp_path)
    session.close()
    write_pairs(tmp_path / "pairs.jsonl", 5)
    with pytest.raises(ConfigError, match="changed since labelling"):
        open_session(tmp_path)
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text(json.dumps({"prompt": "p", "chosen": "x", "rejected": "y"}) + "\n")
    with pytest.raises(ConfigError, match="not started by `rlhf label`"):
        LabelSession(read_items(tmp_path / "pairs.jsonl", mode="pairs"), foreign)


def test_a_torn_last_line_is_set_aside_and_never_read_as_a_label(tmp_path, capsys):
    session = open_session(tmp_path)
    label(session, "ana")
    session.close()
    out = tmp_path / "prefs.jsonl"
    with open(out, "a") as f:
        f.write('{"kind": "preference", "prompt": "cut of')  # a crash mid-write
    again = open_session(tmp_path)
    assert "cut off by a crash" in capsys.readouterr().err
    assert (tmp_path / "prefs.jsonl.torn-1").read_text().startswith('{"kind": "preference"')
    label(again, "ana")
    assert [line["kind"] for line in read_lines(out)] == ["session", "preference", "preference"]
    again.close()


def test_bad_values_are_refused_with_4xx(tmp_path):
    session = open_session(tmp_path)
    served = session.next("ana")
    cases = [
        (dict(labeller="<b>x</b>"), 400), (dict(pair_id="nope"), 404), (dict(label="c"), 422), (dict(left="middle"), 422),
        (dict(label_id="short"), 422), (dict(seconds=-1), 422), (dict(seconds=float("nan")), 422),
        (dict(ratings={"a": "great"}), 422), (dict(ratings={"c": "good"}), 422), (dict(ratings=[1]), 422),
    ]  # fmt: skip
    base = dict(labeller="ana", pair_id=served.item.id, label="a", label_id=served.label_id, left=served.left)
    for change, status in cases:
        with pytest.raises(Refused) as error:
            session.label(**(base | change))
        assert error.value.status == status, change
    assert len(read_lines(tmp_path / "prefs.jsonl")) == 1  # nothing written
    session.close()


def test_the_reward_model_reads_live_preferences_only(tmp_path, capsys):
    session = open_session(tmp_path, n=5)
    label(session, "ana", "a")
    label(session, "ana", "b")
    label(session, "ana", "tie")
    label(session, "ana", "skip")
    label(session, "ana", "a")
    session.undo("ana")
    session.close()
    examples = read_preferences(tmp_path / "prefs.jsonl")
    assert len(examples) == 2
    assert (
        "2 preferences and 0 rankings kept; left out 1 ties, 1 skips and 1 retracted labels" in capsys.readouterr().err
    )
    empty = tmp_path / "only_ties.jsonl"
    empty.write_text(json.dumps({"kind": "tie", "id": "x", "prompt": "p", "a": "x", "b": "y"}) + "\n")
    with pytest.raises(DataError, match="no preference to train on"):
        read_preferences(empty)
