"""Agreement statistics against numbers worked out by hand or published with the statistic."""

from __future__ import annotations

import math

import pytest

from rlhf.core.agreement import cohen_kappa, fleiss_kappa, pairwise_cohen, percent_agreement, wilson_interval


def test_cohen_kappa_of_the_textbook_two_by_two_table():
    # 50 items: both yes 20, first yes/second no 5, first no/second yes 10, both no 15.
    # p_o = 35/50 = 0.7; p_yes = 25/50 · 30/50 = 0.3, p_no = 25/50 · 20/50 = 0.2 → p_e = 0.5; κ = 0.2/0.5 = 0.4
    first = ["y"] * 20 + ["y"] * 5 + ["n"] * 10 + ["n"] * 15
    second = ["y"] * 20 + ["n"] * 5 + ["y"] * 10 + ["n"] * 15
    assert cohen_kappa(first, second) == pytest.approx(0.4, abs=1e-12)  # a few float divisions


def test_cohen_kappa_is_one_for_identical_labels_and_undefined_without_variety():
    assert cohen_kappa(["a", "b", "tie"], ["a", "b", "tie"]) == pytest.approx(1.0)
    assert cohen_kappa(["a", "a"], ["a", "a"]) is None  # p_e = 1: nothing to beat chance with
    assert cohen_kappa([], []) is None
    with pytest.raises(ValueError, match="same items"):
        cohen_kappa(["a"], ["a", "b"])


def test_cohen_kappa_below_zero_when_two_labellers_systematically_disagree():
    # p_o = 0, p_e = 0.5·0.5 + 0.5·0.5 = 0.5 → κ = −1
    assert cohen_kappa(["a", "b"], ["b", "a"]) == pytest.approx(-1.0)


def test_fleiss_kappa_of_fleiss_1971_worked_example():
    # The worked example published with the statistic: 10 items, 14 raters each, 5 categories; κ = 0.210
    # (P̄ = 0.378, P̄_e = 0.213). Rows: how many raters chose each category for the item.
    table = [
        [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
    ]  # fmt: skip
    items = [[str(k) for k, count in enumerate(row) for _ in range(count)] for row in table]
    assert fleiss_kappa(items) == pytest.approx(0.20993, abs=5e-6)  # the published value, to its 5 digits


def test_fleiss_kappa_with_two_raters_per_item_by_hand():
    # Items: (a,a) (a,b) (b,b) (tie,tie). P_i = 1, 0, 1, 1 → P̄ = 0.75.
    # Totals: a 3, b 3, tie 2 of 8 → P̄_e = (9 + 9 + 4)/64 = 22/64. κ = (0.75 − 22/64)/(1 − 22/64) = 26/42.
    items = [["a", "a"], ["a", "b"], ["b", "b"], ["tie", "tie"], ["a"]]  # the single label is left out
    assert fleiss_kappa(items) == pytest.approx(26 / 42, abs=1e-12)
    assert percent_agreement(items) == pytest.approx(0.75)
    assert fleiss_kappa([["a"]]) is None
    assert percent_agreement([["a"]]) is None


def test_percent_agreement_counts_pairs_of_labels():
    # Three labels a, a, b on one item: pairs (a,a) agree, (a,b) twice disagree → 1/3.
    assert percent_agreement([["a", "a", "b"]]) == pytest.approx(1 / 3)


def test_pairwise_cohen_uses_only_shared_items():
    labels = {"ana": {"p1": "a", "p2": "b", "p3": "a"}, "bo": {"p1": "a", "p2": "b"}, "cy": {"p9": "a"}}
    result = pairwise_cohen(labels)
    assert set(result) == {("ana", "bo")}  # cy shares nothing
    shared, kappa = result[("ana", "bo")]
    assert shared == 2 and kappa == pytest.approx(1.0)


def test_wilson_interval_by_hand():
    # 8 of 10, z = 1.96: centre = (0.8 + 0.19208)/1.38416 = 0.716737; half = 1.96·√(0.016 + 0.0096040)/1.38416
    # = 0.226602 → [0.490, 0.943]
    low, high = wilson_interval(8, 10)
    # abs 1e-6: the hand computation above kept 7 significant digits
    assert low == pytest.approx(0.4901625, abs=1e-6) and high == pytest.approx(0.9433178, abs=1e-6)
    assert wilson_interval(0, 0) is None
    low, high = wilson_interval(0, 5)
    assert low == 0.0 and 0 < high < 1 and not math.isnan(high)
