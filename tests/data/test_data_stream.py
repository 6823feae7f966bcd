"""The RL prompt stream: seeded epochs, exact resume; and the held-out split."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from rlhf.data import PromptStream, TokenizedPrompt, held_out, left_pad


def _prompts(n: int) -> list[TokenizedPrompt]:
    return [
        TokenizedPrompt(f"p.jsonl:{i + 1}", f"prompt {i}", [10 + i] * (1 + i % 3), {"answer": i} if i % 2 else {})
        for i in range(n)
    ]


def _summary(batch) -> tuple:
    return (batch.indices, batch.texts, batch.input_ids, batch.columns)


@pytest.mark.parametrize(("n", "batch_size", "consumed"), [(10, 4, 3), (10, 5, 2), (7, 16, 1), (12, 3, 0)])
def test_resume_yields_the_same_next_batches(n: int, batch_size: int, consumed: int):
    prompts = _prompts(n)
    original = PromptStream(prompts, batch_size, seed=7)
    for _ in range(consumed):
        next(original)
    state = json.loads(json.dumps(original.state_dict()))  # checkpoints may store it as JSON
    resumed = PromptStream(prompts, batch_size, seed=0)  # the saved seed wins
    resumed.load_state_dict(state)
    for _ in range(6):
        assert _summary(next(resumed)) == _summary(next(original))


def test_each_epoch_visits_every_prompt_once_in_a_seeded_order():
    stream = PromptStream(_prompts(10), batch_size=5, seed=1)
    epoch0 = next(stream).indices + next(stream).indices
    epoch1 = next(stream).indices + next(stream).indices
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1 and epoch0 != list(range(10))
    assert stream.state_dict()["epoch"] == 2 and stream.state_dict()["index"] == 0
    again = PromptStream(_prompts(10), batch_size=5, seed=1)
    assert next(again).indices == epoch0[:5]
    other = PromptStream(_prompts(10), batch_size=5, seed=2)
    assert next(other).indices + next(other).indices != epoch0


def test_batches_run_across_epochs_without_skipping():
    stream = PromptStream(_prompts(7), batch_size=3, seed=0)
    seen = Counter(i for _ in range(7) for i in next(stream).indices)  # 21 prompts = 3 epochs exactly
    assert seen == Counter({i: 3 for i in range(7)})


def test_columns_arrive_as_keyword_lists():
    stream = PromptStream(_prompts(4), batch_size=4, seed=0, shuffle=False)
    batch = next(stream)
    assert batch.indices == [0, 1, 2, 3]
    assert batch.columns == {"answer": [None, 1, None, 3]}


def test_resume_with_other_prompts_is_refused():
    state = PromptStream(_prompts(10), batch_size=2).state_dict()
    changed = _prompts(10)
    changed[3] = TokenizedPrompt("x", "another prompt", [1])
    with pytest.raises(ValueError, match="saved with other prompts"):
        PromptStream(changed, batch_size=2).load_state_dict(state)


def test_held_out_is_deterministic_and_disjoint():
    items = list(range(50))
    train, held = held_out(items, 8, seed=3)
    assert len(held) == 8 and len(train) == 42
    assert set(train).isdisjoint(held) and sorted(train + held) == items
    assert train == sorted(train) and held == sorted(held)  # original order kept
    assert held_out(items, 8, seed=3) == (train, held)
    assert held_out(items, 8, seed=4)[1] != held
    assert held_out(items, 0) == (items, [])
    with pytest.raises(ValueError, match="cannot hold out 50 of 50"):
        held_out(items, 50)


def test_stream_batch_left_pads_for_generation():
    batch = next(PromptStream(_prompts(3), batch_size=3, shuffle=False))
    ids, mask = left_pad(batch.input_ids, pad_id=0)
    assert ids.tolist() == [[0, 0, 10], [0, 11, 11], [12, 12, 12]]
    assert mask.sum(-1).tolist() == [1, 2, 3]
