"""Ranking rows in a preferences file: ``{"prompt", "completions": [...], "ranking": [best, ..., worst]}`` (a list of
indices in the ranking ties them) read as the C(k,2) pairs it implies, less the pairs within a tie; and every bad
ranking refused with its file and line."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import pytest

from rlhf.data import DataError, read_preferences

USER = {"role": "user", "content": "name a colour"}


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def pairs_of(examples) -> list[tuple]:
    return [(ex.prompt if isinstance(ex.prompt, str) else ex.prompt[-1]["content"], ex.chosen, ex.rejected)
            for ex in examples]  # fmt: skip


def test_a_ranking_is_every_pair_it_orders_in_the_files_order(tmp_path):
    """k = 4 answers ranked 2 > 0 > 3 > 1: C(4,2) = 6 pairs, the better answer chosen in each; the pair rows around
    it keep their place."""
    answers = ["red", "blue", "green", "teal"]
    rows = [
        {"prompt": "p0", "chosen": "a", "rejected": "b"},
        {"prompt": "colour?", "completions": answers, "ranking": [2, 0, 3, 1]},
        {"prompt": "p2", "chosen": "c", "rejected": "d"},
    ]
    examples = read_preferences(_write(tmp_path, rows))
    order = [2, 0, 3, 1]
    expected = [("colour?", answers[order[i]], answers[order[j]]) for i, j in combinations(range(4), 2)]
    assert pairs_of(examples) == [("p0", "a", "b"), *expected, ("p2", "c", "d")]
    assert {ex.where for ex in examples[1:7]} == {f"{tmp_path / 'prefs.jsonl'}:2"}  # each pair knows its row
    assert all(ex.margin == 0.0 for ex in examples)


def test_tied_answers_give_no_pair_between_them(tmp_path):
    """2 > {0, 3} > 1: the tie's two answers are each better than 1 and worse than 2, and not compared: 6 − 1 = 5."""
    answers = ["red", "blue", "green", "teal"]
    rows = [{"prompt": "colour?", "completions": answers, "ranking": [2, [0, 3], 1]}]
    assert pairs_of(read_preferences(_write(tmp_path, rows))) == [
        ("colour?", "green", "red"),
        ("colour?", "green", "teal"),
        ("colour?", "green", "blue"),
        ("colour?", "red", "blue"),
        ("colour?", "teal", "blue"),
    ]


def test_a_chat_ranking_ranks_assistant_turns_after_the_prompt(tmp_path):
    answers = [[{"role": "assistant", "content": c}] for c in ("red", "blue", "green")]
    rows = [{"prompt": [USER], "completions": answers, "ranking": [1, 2, 0]}]
    examples = read_preferences(_write(tmp_path, rows))
    assert [(ex.chosen[0]["content"], ex.rejected[0]["content"]) for ex in examples] == [
        ("blue", "green"),
        ("blue", "red"),
        ("green", "red"),
    ]
    assert all(ex.is_chat and ex.prompt == [USER] for ex in examples)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"prompt": "p", "completions": ["a", "b", "c"], "ranking": [0, 1, 1]}, '"ranking" names [1] more than once'),
        ({"prompt": "p", "completions": ["a", "b", "c"], "ranking": [0, 2]}, '"ranking" leaves out [1]'),
        ({"prompt": "p", "completions": ["a", "b"], "ranking": [0, 2]}, '"ranking" names [2] but "completions" has 2'),
        ({"prompt": "p", "completions": ["a", "b"], "ranking": [-1, 0]}, '"ranking" names [-1]'),
        ({"prompt": "p", "completions": ["a"], "ranking": [0]}, '"completions" must be a list of at least 2'),
        ({"prompt": "p", "completions": ["a", "b"], "ranking": [1]}, '"ranking" must list the completions'),
        ({"prompt": "p", "completions": ["a", "b"], "ranking": "1>0"}, '"ranking" must list the completions'),
        ({"prompt": "p", "completions": ["a", "b", "c"], "ranking": [0, [], [1, 2]]}, "lists of tied indices"),
        ({"prompt": "p", "completions": ["a", "b"], "ranking": [0, "1"]}, "lists of tied indices"),
        ({"prompt": "p", "completions": ["a", "b"], "ranking": [[0, 1], []]}, "lists of tied indices"),
        ({"prompt": "p", "completions": ["a", "b"]}, 'missing "ranking"'),
        ({"prompt": "p", "ranking": [0, 1]}, 'missing "completions"'),
        ({"prompt": "p", "completions": ["a", "b"], "ranking": [[0, 1]]}, "in at least 2 places"),  # all tied
        ({"prompt": "p", "completions": ["a", "b", "c"], "ranking": [[0, 1, 2], 0]}, "more than once"),
        ({"prompt": "p", "completions": ["a", "b", "c"], "ranking": [[0, 1], [2]], "margin": 1}, '"margin" applies'),
        ({"prompt": "p", "completions": ["a", "a"], "ranking": [0, 1]}, 'completions 0 and 1: "chosen" and'),
        ({"prompt": "p", "completions": ["a", 3], "ranking": [0, 1]}, 'completions 0 and 1: "rejected" must be'),
    ],
)
def test_a_bad_ranking_is_refused_with_its_file_and_line(tmp_path, row, expected):
    """Each row after a good one: the error names line 2 and what is wrong with the ranking."""
    path = _write(tmp_path, [{"prompt": "p", "chosen": "a", "rejected": "b"}, row])
    with pytest.raises(DataError) as error:
        read_preferences(path)
    assert f"{path}:2: " in str(error.value) and expected in str(error.value)
