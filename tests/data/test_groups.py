"""`rlhf.data.groups`: pairs gathered by prompt (each answer once) and the passes of answers a step is cut into."""

from __future__ import annotations

from rlhf.data.groups import AnswerBatch, answer_batches, group_preferences
from rlhf.data.tokenization import TokenizedPreference


def pair(where: str, prompt: list[int], chosen: list[int], rejected: list[int], **kwargs) -> TokenizedPreference:
    return TokenizedPreference(where, prompt, chosen, rejected, **kwargs)


def test_pairs_of_one_prompt_share_its_answers_and_keep_every_label():
    pairs = [
        pair("f:1", [1], [7], [8], margin=0.5),
        pair("f:2", [2], [7], [9]),  # another prompt, the same answer ids: another group
        pair("f:3", [1], [8], [9], truncated=True),
        pair("f:4", [1], [9], [8]),  # contradicts f:3: both kept
        pair("f:5", [1], [7], [8]),  # f:1 said again: counted twice
    ]
    first, second = group_preferences(pairs)
    assert first.prompt_ids == [1] and first.answers == [[7], [8], [9]]
    assert (first.better, first.worse) == ([0, 1, 2, 0], [1, 2, 1, 1])
    assert first.margins == [0.5, 0.0, 0.0, 0.0] and first.where == ["f:1", "f:3", "f:4", "f:5"]
    assert first.truncated == 1 and first.num_pairs == 4 and first.contradictions() == 2  # (8, 9) and (9, 8)
    assert first.sequences() == [[1, 7], [1, 8], [1, 9]] and first.tokens() == 6
    assert (second.answers, second.better, second.worse, second.contradictions()) == ([[7], [9]], [0], [1], 0)


def test_encoder_pairs_group_by_their_prompt_text_not_by_their_empty_prompt_ids():
    pairs = [pair("f:1", [], [5, 7], [5, 8], prompt_key='"a"'), pair("f:2", [], [6, 7], [6, 8], prompt_key='"b"')]
    assert [g.answers for g in group_preferences(pairs)] == [[[5, 7], [5, 8]], [[6, 7], [6, 8]]]


def test_one_pair_per_prompt_is_one_group_per_pair():
    pairs = [pair(f"f:{i}", [i], [10 + i], [20 + i]) for i in range(3)]
    groups = group_preferences(pairs)
    assert [(g.answers, g.better, g.worse) for g in groups] == [([[10 + i], [20 + i]], [0], [1]) for i in range(3)]


def test_passes_pack_whole_prompts_and_cut_a_larger_one_into_chunks():
    # limit 5: [2, 3] fit one pass, 4 starts the next (2 + 3 + 4 > 5), 7 > 5 is cut 5 + 2 after 4's pass is closed
    assert answer_batches([2, 3, 4, 7, 1], 5) == [
        AnswerBatch((0, 1)),
        AnswerBatch((2,)),
        AnswerBatch((3,), slice(0, 5)),
        AnswerBatch((3,), slice(5, 7)),
        AnswerBatch((4,)),
    ]
    assert answer_batches([2, 3, 4], None) == [AnswerBatch((0, 1, 2))]  # no limit: the step in one pass
    assert answer_batches([], 4) == [] and answer_batches([], None) == []
    assert answer_batches([2, 2, 2], 4) == [AnswerBatch((0, 1)), AnswerBatch((2,))]  # a full pass closes at once
