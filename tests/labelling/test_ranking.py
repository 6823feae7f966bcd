"""Ranking k answers at once, without HTTP: the items a file gives in each mode, the row on disk, the shown order,
refusals, skip, undo, restart and several labellers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from label_servers import gold_order, grade, read_lines, write_candidates

from rlhf.config import ConfigError
from rlhf.data import read_preferences
from rlhf.labelling.pairs import Candidates, Pair, read_items
from rlhf.labelling.session import LabelSession, Refused, shown_order


def open_session(tmp_path: Path, n: int = 3, k: int = 4, mode: str = "auto", **kwargs) -> LabelSession:
    path = tmp_path / "candidates.jsonl"
    if not path.exists():
        write_candidates(path, n, k)
    return LabelSession(read_items(path, mode=mode), tmp_path / "prefs.jsonl", **kwargs)


def rank_next(session: LabelSession, who: str, ranking=None, **kwargs):
    """Rank ``who``'s next item: ``ranking`` (indices into its answers), by default the gold order."""
    served = session.next(who)
    assert served is not None and isinstance(served.item, Candidates)
    ranking = gold_order(list(served.item.answers)) if ranking is None else ranking
    row = session.rank(labeller=who, item_id=served.item.id, ranking=ranking, label_id=served.label_id, **kwargs)
    return served, row


def test_each_mode_gives_its_items(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [
        {"prompt": "p", "completions": ["x", "y", "z", "x"]},  # 3 distinct answers
        {"prompt": "q", "completions": ["u", "v"]},
        {"prompt": "r", "a": "m", "b": "n"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kinds = {mode: [type(item).__name__ for item in read_items(path, mode=mode).items] for mode in ("auto", "ranking")}
    assert kinds["auto"] == ["Candidates", "Pair", "Pair"]  # ranking only from 3 answers up
    assert kinds["ranking"] == ["Candidates", "Candidates", "Pair"]  # a pair row stays a pair
    pairs = read_items(path, mode="pairs")
    assert all(isinstance(item, Pair) for item in pairs.items) and len(pairs.items) == 3 + 1 + 1
    assert read_items(path, mode="auto").items[0].answers == ("x", "y", "z")


def test_a_ranking_is_one_line_on_disk_when_rank_returns_and_reads_as_its_pairs(tmp_path):
    session = open_session(tmp_path, n=1, k=4)
    served, row = rank_next(session, "ana", seconds=7.5)
    lines = read_lines(tmp_path / "prefs.jsonl")  # before close: already on disk
    assert lines[0]["kind"] == "session" and lines[0]["rankings"] == 1 and lines[0]["mode"] == "auto"
    assert lines[1] == row and len(lines) == 2
    assert row["kind"] == "ranking" and row["item"] == served.item.id and row["labeller"] == "ana"
    assert row["completions"] == list(served.item.answers)  # the item's own order, not the shown one
    assert row["shown"] == list(served.shown) and sorted(row["shown"]) == [0, 1, 2, 3]
    assert [grade(row["completions"][i]) for i in row["ranking"]] == [3, 2, 1, 0]
    assert row["seconds"] == 7.5 and row["source"] == "human"
    session.close()
    pairs = [(p.chosen, p.rejected) for p in read_preferences(tmp_path / "prefs.jsonl")]
    assert len(pairs) == 6 and all(grade(chosen) > grade(rejected) for chosen, rejected in pairs)


def test_the_shown_order_is_a_shuffle_per_item_and_labeller_the_same_on_every_visit(tmp_path):
    session = open_session(tmp_path, n=6, k=8, labels_per_pair=2)
    ana, bo = session.next("ana"), session.next("bo")
    assert ana.item.id == bo.item.id and ana.shown != bo.shown  # 1 chance in 8! to be equal
    assert session.next("ana").shown == ana.shown == shown_order(item_id=ana.item.id, labeller="ana", k=8)
    orders = {shown_order(item_id=item.id, labeller="ana", k=8) for item in session.items}
    assert len(orders) == 6 and (0, 1, 2, 3, 4, 5, 6, 7) not in orders
    session.close()


def test_a_ranking_sent_twice_is_saved_once_and_ties_are_kept(tmp_path):
    session = open_session(tmp_path, k=4)
    served = session.next("ana")
    first = session.rank(labeller="ana", item_id=served.item.id, ranking=[2, [0, 3], 1], label_id=served.label_id)
    again = session.rank(labeller="ana", item_id=served.item.id, ranking=[2, [0, 3], 1], label_id=served.label_id)
    assert again == first and first["ranking"] == [2, [0, 3], 1]
    assert len(read_lines(tmp_path / "prefs.jsonl")) == 2
    with pytest.raises(Refused, match="already used"):
        session.rank(labeller="bo", item_id=served.item.id, ranking=[0, 1, 2, 3], label_id=served.label_id)
    with pytest.raises(Refused) as error:  # a second ranking of the same item by ana, under a new id
        session.rank(labeller="ana", item_id=served.item.id, ranking=[0, 1, 2, 3], label_id="another-id-123")
    assert error.value.status == 409
    session.close()


def test_bad_rankings_are_refused_with_400_and_nothing_is_written(tmp_path):
    session = open_session(tmp_path, k=4)
    served = session.next("ana")
    cases = {
        "repeated": [0, 1, 1, 2],
        "missing": [0, 1, 2],
        "out of range": [0, 1, 2, 4],
        "negative": [0, 1, 2, -1],
        "a bool": [True, 0, 2, 3],
        "all tied": [[0, 1, 2, 3]],
        "an empty tie": [0, 1, [], 2, 3],
        "not a list": "0123",
        "a text index": ["0", 1, 2, 3],
    }
    messages = {}
    for name, ranking in cases.items():
        with pytest.raises(Refused) as error:
            session.rank(labeller="ana", item_id=served.item.id, ranking=ranking, label_id=served.label_id)
        assert error.value.status == 400, name
        messages[name] = str(error.value)
    assert "more than once" in messages["repeated"] and "leaves out [3]" in messages["missing"]
    assert "indices 0 to 3" in messages["out of range"] and "skip the item" in messages["all tied"]
    with pytest.raises(Refused) as error:
        session.label("ana", served.item.id, "a", served.label_id, "a")  # a ranking item is not a pair
    assert error.value.status == 422 and "/api/rank" in str(error.value)
    with pytest.raises(Refused) as error:
        session.rank(labeller="ana", item_id="0" * 16, ranking=[0, 1, 2, 3], label_id=served.label_id)
    assert error.value.status == 404
    assert len(read_lines(tmp_path / "prefs.jsonl")) == 1  # the session line alone
    session.close()


def test_skip_undo_and_restart_for_rankings(tmp_path):
    session = open_session(tmp_path, n=3, k=4)
    skipped, skip = rank_next(session, "ana", ranking="skip")
    assert skip["kind"] == "skip" and skip["item"] == skipped.item.id and len(skip["completions"]) == 4
    kept_item, kept = rank_next(session, "ana")
    gone_item, gone = rank_next(session, "ana", ranking=[0, 1, 2, 3])
    assert session.undo("ana")["id"] == gone["id"]
    assert session.next("ana").item.id == gone_item.item.id  # undone: back to rank again
    assert session.progress("ana")["done"] == 1  # a skip decides nothing
    session.close()
    again = open_session(tmp_path, n=3, k=4)
    assert again.history["ana"] == [skip["id"], kept["id"]]
    assert again.next("ana").item.id == gone_item.item.id
    assert again.next("bo").item.id == skipped.item.id  # ana skipped it: it goes to someone else
    again.close()
    rows = read_lines(tmp_path / "prefs.jsonl")
    assert [row["kind"] for row in rows] == ["session", "skip", "ranking", "ranking", "retraction"]
    assert len(read_preferences(tmp_path / "prefs.jsonl")) == 6  # kept's 6 pairs; the undone one left out


def test_several_labellers_share_ranking_items_by_lease(tmp_path):
    session = open_session(tmp_path, n=2, k=3, labels_per_pair=2)
    ana, bo, cy = (session.next(who) for who in ("ana", "bo", "cy"))
    assert ana.item.id == bo.item.id != cy.item.id  # the first item needs two rankings: no third labeller
    rank_next(session, "ana")
    rank_next(session, "bo")
    assert session.overall() == (2, 4)
    assert session.next("ana").item.id == cy.item.id  # never the same item twice to one labeller
    session.close()


def test_a_restart_in_another_mode_is_refused(tmp_path):
    session = open_session(tmp_path, k=4, mode="auto")
    rank_next(session, "ana")
    session.close()
    with pytest.raises(ConfigError, match="give --mode auto"):
        open_session(tmp_path, k=4, mode="pairs")
    open_session(tmp_path, k=4, mode="ranking").close()  # k = 4: the same items as auto
