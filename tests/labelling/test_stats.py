"""`rlhf label --stats`: counts, rates, position bias and agreement on labels files written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf import cli
from rlhf.data.files import DataError
from rlhf.data.labels import pair_id
from rlhf.labelling.stats import format_stats, label_stats


def pref(pair: str, who: str, winner: str, left: str = "chosen", **extra) -> dict:
    loser = {"x": "y", "y": "x"}[winner]
    return {"kind": "preference", "id": f"{who}-{pair}", "pair": pair, "labeller": who, "prompt": "p",
            "chosen": winner, "rejected": loser, "left": left, "seconds": 2.0} | extra  # fmt: skip


def other(kind: str, pair: str, who: str) -> dict:
    return {"kind": kind, "id": f"{who}-{pair}", "pair": pair, "labeller": who, "prompt": "p", "a": "x", "b": "y",
            "left": "a", "seconds": 4.0}  # fmt: skip


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_counts_rates_bias_and_agreement_by_hand(tmp_path):
    rows = [
        {"kind": "session", "pairs": "pairs.jsonl"},
        # ana: p1 x (left), p2 x (right), p3 tie, p4 skip, p5 y (left, then retracted)
        pref("p1", "ana", "x", "chosen"), pref("p2", "ana", "x", "rejected"), other("tie", "p3", "ana"),
        other("skip", "p4", "ana"), pref("p5", "ana", "y", "chosen"),
        {"kind": "retraction", "id": "r1", "retracts": "ana-p5", "labeller": "ana"},
        # bo: p1 x (left), p2 y (left), p3 tie
        pref("p1", "bo", "x", "chosen"), pref("p2", "bo", "y", "chosen"), other("tie", "p3", "bo"),
    ]  # fmt: skip
    stats = label_stats([str(write(tmp_path / "prefs.jsonl", rows))])
    assert stats["labels"] == 7 and stats["pairs"] == 4  # p5 retracted
    assert stats["tie_rate"] == pytest.approx(2 / 7) and stats["skip_rate"] == pytest.approx(1 / 7)
    assert stats["labellers"]["ana"] | {"left_wins": None} == {
        "labels": 4,
        "rankings": 0,
        "preferences": 2,
        "ties": 1,
        "skips": 1,
        "seconds_per_label": 3.0,
        "left_wins": None,
    }  # fmt: skip  (2 + 2 + 4 + 4) / 4 = 3 s
    # left won in 3 of the 4 preferences (ana p1, bo p1, bo p2); ana p2's winner was on the right
    assert stats["position_bias"]["rate"] == pytest.approx(0.75) and stats["position_bias"]["n"] == 4
    agreement = stats["agreement"]
    # shared decisions: p1 (x, x) agree, p2 (x, y) disagree, p3 (tie, tie) agree → 2/3;
    # Fleiss: P̄ = 2/3; totals x 3, y 1, tie 2 of 6 → P̄_e = (9 + 1 + 4)/36 = 14/36; κ = (2/3 − 14/36)/(22/36) = 10/22
    assert agreement["pairs"] == 3 and agreement["percent"] == pytest.approx(2 / 3)
    assert agreement["fleiss_kappa"] == pytest.approx(10 / 22)
    (cohen,) = agreement["cohen_kappa"]
    # Cohen over p1..p3: p_o = 2/3; ana (x, x, tie), bo (x, y, tie): p_e = (2·1 + 0·1 + 1·1)/9 = 3/9 → κ = (1/3)/(2/3)
    assert cohen["labellers"] == ["ana", "bo"] and cohen["pairs"] == 3 and cohen["kappa"] == pytest.approx(0.5)


def test_the_command_prints_a_table_and_refuses_files_that_are_not_labels(tmp_path, capsys):
    labels = write(tmp_path / "prefs.jsonl", [pref("p1", "ana", "x")])
    assert cli.main(["label", "--stats", str(labels)]) == 0
    out = capsys.readouterr().out
    assert "1 live labels of 1 pairs" in out and "ana" in out and "no pair was decided by two labellers" in out
    plain = write(tmp_path / "plain.jsonl", [{"prompt": "p", "chosen": "x", "rejected": "y"}])
    assert cli.main(["label", "--stats", str(plain)]) == 2
    assert "not a labels file" in capsys.readouterr().err
    assert cli.main(["label", "--stats", str(labels), "--pairs", str(labels)]) == 2


def test_a_ranking_counts_as_its_pairs_beside_pair_labels_of_the_same_answers(tmp_path):
    def ranking(who: str, order: list, shown: list[int]) -> dict:
        return {"kind": "ranking", "id": f"{who}-r", "item": "i1", "labeller": who, "prompt": "p",
                "completions": ["x", "y", "z"], "ranking": order, "shown": shown, "seconds": 9.0}  # fmt: skip

    xy, xz = pair_id("p", "x", "y"), pair_id("p", "x", "z")
    rows = [
        ranking("ana", [1, 0, 2], shown=[2, 0, 1]),  # y > x > z, shown z, x, y: the one shown earlier lost each time
        ranking("dan", [[0, 1], 2], shown=[0, 1, 2]),  # x = y > z, shown in order: the earlier one won twice
        pref(xy, "bo", "y", "chosen") | {"pair": xy},  # bo agrees with ana on x vs y
        other("tie", xz, "cy"),  # cy ties x and z, which ana and dan ranked x > z
    ]
    path = write(tmp_path / "prefs.jsonl", rows)
    stats = label_stats([str(path)])
    assert (stats["labels"], stats["rankings"], stats["ranking_pairs"], stats["pairs"]) == (4, 2, 6, 3)
    assert stats["labellers"]["ana"]["rankings"] == 1 and stats["labellers"]["ana"]["preferences"] == 3
    assert (stats["labellers"]["dan"]["preferences"], stats["labellers"]["dan"]["ties"]) == (2, 1)
    assert stats["tie_rate"] == pytest.approx(2 / 8)  # of 8 pair judgements: 3 + 3 implied, bo's, cy's
    assert stats["labellers"]["ana"]["left_wins"]["rate"] == 0.0 and stats["labellers"]["dan"]["left_wins"]["n"] == 2
    assert (stats["position_bias"]["rate"], stats["position_bias"]["n"]) == (0.5, 6)  # ana 0/3, dan 2/2, bo 1/1
    # x vs y: ana y, bo y, dan tie (1 of 3 label pairs agree); x vs z: ana x, dan x, cy tie (1 of 3); y vs z: 1 of 1
    assert stats["agreement"]["pairs"] == 3 and stats["agreement"]["percent"] == pytest.approx(3 / 7)
    text = format_stats(stats)
    assert "4 live labels (2 rankings, implying 6 pairs) of 3 pairs" in text and "shown first" in text
    bad = write(tmp_path / "bad.jsonl", [ranking("ana", [0, 0, 2], shown=[0, 1, 2])])
    with pytest.raises(DataError, match=r"bad.jsonl:1: ranking names \[0\] more than once"):
        label_stats([str(bad)])


def test_the_judges_tie_and_skip_rows_over_k_answers_count_as_their_pairs(tmp_path):
    """The listwise judge writes a tie (every answer's mean rank equal) or a skip (no readable order) as one row
    with the item's k answers: each is k(k−1)/2 tied or skipped pair judgements, under the pairs' own ids."""
    answers = {"prompt": "p", "completions": ["x", "y", "z"], "source": "judge"}
    rows = [{"kind": "tie", "id": "t1", **answers}, {"kind": "skip", "id": "s1", **answers, "prompt": "q"}]
    stats = label_stats([str(write(tmp_path / "judge.jsonl", rows))])
    assert stats["tie_rate"] == pytest.approx(3 / 6) and stats["skip_rate"] == pytest.approx(3 / 6)
    assert stats["labellers"]["judge"]["ties"] == 3 and stats["pairs"] == 3  # the three tied pairs of "p"
