"""``update.plan_micro_batches``: row limits, token budgets and the padding each micro-batch may cut, by hand."""

from __future__ import annotations

import torch

from rlhf.trainers.update import plan_micro_batches

C, T = 4, 5
QUERY = [4, 2, 3, 1, 4]  # real query tokens per row (left-padded to C)
RESPONSE = [5, 1, 3, 2, 4]  # real response tokens per row (right-padded to T)
# columns of the response a row needs: its tokens + 1 (the value one past the stop token), at most T
NEEDED = [5, 2, 4, 3, 5]


def mask() -> torch.Tensor:
    m = torch.zeros(len(QUERY), C + T, dtype=torch.long)
    for b, (q, r) in enumerate(zip(QUERY, RESPONSE, strict=True)):
        m[b, C - q : C] = 1
        m[b, C : C + r] = 1
    return m


def described(plan) -> list[tuple[list[int], int, int]]:
    return [(m.rows.tolist(), m.first_column, m.response_length) for m in plan]


def test_without_a_budget_rows_keep_their_order_and_each_chunk_is_cut_to_its_longest_row():
    plan = plan_micro_batches(torch.arange(5), mask(), T, max_rows=2, max_tokens=None)
    # [0, 1]: longest query 4 → first column 0; NEEDED 5, 2 → 5
    # [2, 3]: longest query 3 → first column 1; NEEDED 4, 3 → 4
    assert described(plan) == [([0, 1], 0, 5), ([2, 3], 1, 4), ([4], 0, 5)]


def test_a_token_budget_sorts_longest_first_and_fills_micro_batches_up_to_it():
    # lengths (query + needed): 9, 4, 7, 4, 9 → order 0, 4, 2, 1, 3
    # [0] 9 tokens; + row 4 → 2 × 9 = 18 > 16: closed. [4]; + row 2 → 2 × 9 > 16: closed.
    # [2] 7; + row 1 → 2 × (3 + 4) = 14 ≤ 16; + row 3 → 3 × 7 = 21 > 16: closed. [3].
    plan = plan_micro_batches(torch.arange(5), mask(), T, max_rows=5, max_tokens=16)
    assert described(plan) == [([0], 0, 5), ([4], 0, 5), ([2, 1], 1, 4), ([3], 3, 3)]
    for micro in plan:  # within budget, and the cut columns held no real token
        kept = mask()[micro.rows][:, micro.columns(C)]
        assert kept.numel() <= 16
        assert kept.sum() == mask()[micro.rows].sum()


def test_both_limits_hold_and_a_row_over_the_budget_runs_alone():
    plan = plan_micro_batches(torch.arange(5), mask(), T, max_rows=1, max_tokens=100)
    assert [m.rows.tolist() for m in plan] == [[0], [4], [2], [1], [3]]
    plan = plan_micro_batches(torch.arange(5), mask(), T, max_rows=5, max_tokens=3)
    assert sorted(r for m in plan for r in m.rows.tolist()) == [0, 1, 2, 3, 4]
    assert all(len(m.rows) == 1 for m in plan)


def test_a_minibatch_is_planned_with_its_own_row_indices():
    plan = plan_micro_batches(torch.tensor([3, 1, 4]), mask(), T, max_rows=2, max_tokens=None)
    assert described(plan) == [([3, 1], 2, 3), ([4], 0, 5)]
