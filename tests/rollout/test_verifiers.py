"""Built-in verifiable rewards (`rlhf.rollout.verifiers`): hand-computed cases, and loading them by name."""

from __future__ import annotations

import pytest

from rlhf.rollout import verifiers
from rlhf.rollout.rewards import load_reward_set
from rlhf.rollout.verifiers import exact_match, extract_answer, format_regex, length_penalty


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("so the answer is 42", "42"),
        ("3 apples and 4 pears: 7", "7"),  # the last number
        ("we get \\boxed{12} and then 13", "12"),  # a box wins over a later number
        ("\\boxed{1} ... finally \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # last box, nested braces
        ("total -3.5 units", "-3.5"),
        ("about 1,234 people", "1,234"),
        ("no number here", None),
        ("cut inside \\boxed{4", "4"),  # unbalanced box: falls back to the last number
    ],
)
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


def test_exact_match_hand_computed():
    completions = ["it is 42", "it is 41", "\\boxed{1,000}", "0.50", "\\boxed{x+1}", "7", "8"]
    answer = ["42", "42", "1000", "1/2", "x+1", "#### 7", None]
    # 42=42 ✓; 41≠42; 1,000 = 1000 as numbers ✓; 0.50 = 1/2 ✓; text "x+1" ✓; GSM8K "#### 7" → 7 ✓;
    # no answer → None
    assert exact_match(completions, answer=answer) == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, None]
    assert exact_match(["x+2", "7"], answer=["x+1", "so 3+4 #### 8"]) == [0.0, 0.0]
    assert exact_match(["5"], answer=["the result is \\boxed{5}"]) == [1.0]  # a boxed reference
    assert exact_match(["5", "6"]) == [None, None]  # no answer column at all


def test_format_regex_hand_computed():
    completions = [
        "<think>a</think> <answer>b</answer>",
        "<answer>b</answer>",
        "  <think>\nx\n</think><answer>1</answer>\n",
    ]
    assert format_regex(completions) == [1.0, 0.0, 1.0]  # default R1 format; surrounding whitespace ignored
    assert format_regex(["ANSWER: 3", "answer 3"], format_pattern=[r"ANSWER: \d+", None]) == [1.0, 0.0]


def test_length_penalty_hand_computed():
    assert length_penalty(["", "abcd", "x" * 500]) == [0.0, -0.004, -0.5]
    assert length_penalty(["abcd", "abcd"], target_length=[4, 10]) == [0.0, -0.006]


def test_loaded_by_module_name_through_the_reward_set():
    rewards = load_reward_set(
        [
            {"source": "rlhf.rollout.verifiers:exact_match", "weight": 1.0},
            {"source": "rlhf.rollout.verifiers:length_penalty", "weight": 2.0, "name": "short"},
        ]
    )
    result = rewards.score(["q1", "q2"], ["\\boxed{3}", "4"], {"answer": ["3", None]})
    assert list(result.names) == ["exact_match", "short"]
    scores = result.scores.tolist()
    assert scores[0] == pytest.approx([1.0, -0.009])
    assert scores[1][0] != scores[1][0]  # None → NaN: unscored
    assert scores[1][1] == pytest.approx(-0.001)
    assert verifiers.DEFAULT_FORMAT  # documented default exists


def test_a_multi_turn_completion_is_judged_on_what_the_model_wrote():
    """The tool's result (5) is not the model's answer: only the assistant turns count."""
    episode = [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator"}}]},
        {"role": "tool", "name": "calculator", "content": "5"},
        {"role": "assistant", "content": "It is 6."},
    ]
    assert exact_match([episode, episode[:2] + [{"role": "assistant", "content": "5"}]], answer=["5", "5"]) == [
        0.0,
        1.0,
    ]
