"""Validation per kind: every problem is reported as `file:line: what is wrong`, all in one DataError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.data import DataError, read_preferences, read_prompts, read_sft

READERS = {"prompts": read_prompts, "sft": read_sft, "preferences": read_preferences}
USER = {"role": "user", "content": "what is 1 + 1?"}
ASSISTANT = {"role": "assistant", "content": "2"}

CASES = [
    # kind, bad record, expected problem
    ("prompts", {"prompt": 3}, '"prompt" must be a non-empty string, got int'),
    ("prompts", {"prompt": ""}, '"prompt" must be a non-empty string, got an empty string'),
    ("prompts", {"prompt": None}, '"prompt" must be a non-empty string, got null'),
    ("prompts", {"text": "hi", "id": 1}, 'missing "prompt" (or "messages") (keys present: text, id)'),
    ("prompts", {"prompt": "hi", "messages": [USER]}, 'has both "prompt" and "messages"; use one of them'),
    (
        "prompts",
        {"messages": []},
        '"messages" must be a non-empty list of {"role", "content"} messages, got an empty list',
    ),
    ("prompts", {"messages": ["hi"]}, '"messages"[0] must be an object {"role", "content"}, got str'),
    ("prompts", {"messages": [{"role": "user"}]}, '"messages"[0]: missing "content" (keys present: role)'),
    (
        "prompts",
        {"messages": [USER, {"role": "bot", "content": "x"}]},
        '"messages"[1]["role"] must be one of system, user, assistant, tool, got \'bot\'',
    ),
    ("prompts", {"messages": [{"role": "user", "content": 5}]}, '"messages"[0]["content"] must be a string, got int'),
    ("sft", {"prompt": "hi"}, 'missing "response" (keys present: prompt)'),
    ("sft", {"prompt": "hi", "response": ["a"]}, '"response" must be a non-empty string, got list'),
    ("sft", {"messages": [USER]}, '"messages" has no assistant message: nothing to train on'),
    ("sft", {"messages": [ASSISTANT, USER]}, '"messages"[0] is an assistant message'),
    ("preferences", {"prompt": "p", "chosen": "a"}, 'missing "rejected" (keys present: prompt, chosen)'),
    ("preferences", {"chosen": "a", "rejected": "b"}, 'missing "prompt" (keys present: chosen, rejected)'),
    (
        "preferences",
        {"prompt": "p", "chosen": "a", "rejected": 1.5},
        '"rejected" must be a non-empty string, got float',
    ),
    (
        "preferences",
        {"prompt": "p", "chosen": "a", "rejected": "b", "margin": "big"},
        '"margin" must be a number, got str',
    ),
    (
        "preferences",
        {"prompt": "p", "chosen": "a", "rejected": "b", "margin": True},
        '"margin" must be a number, got bool',
    ),
    (
        "preferences",
        {"prompt": "p", "chosen": [ASSISTANT], "rejected": "b"},
        '"chosen" and "rejected" must both be strings or both be message lists, got list and str',
    ),
    (
        "preferences",
        {"prompt": [USER], "chosen": "a", "rejected": "b"},
        '"prompt" is a message list but "chosen" and "rejected" are strings',
    ),
    (
        "preferences",
        {"chosen": [ASSISTANT], "rejected": [ASSISTANT]},
        'no "prompt", and "chosen" and "rejected" share no leading messages',
    ),
    (
        "preferences",
        {"prompt": [USER], "chosen": [USER], "rejected": [ASSISTANT]},
        '"chosen": the answer after the prompt must start with an assistant message',
    ),
]


def _write(tmp_path: Path, records: list[dict], name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


GOOD = {
    "prompts": {"prompt": "what is 1 + 1?"},
    "sft": {"prompt": "what is 1 + 1?", "response": "2"},
    "preferences": {"prompt": "what is 1 + 1?", "chosen": "2", "rejected": "3"},
}


@pytest.mark.parametrize(("kind", "record", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_problem_names_file_line_and_what_is_wrong(kind: str, record: dict, expected: str, tmp_path: Path):
    path = _write(tmp_path, [GOOD[kind], GOOD[kind], record, GOOD[kind]], name="train.jsonl")
    with pytest.raises(DataError) as e:
        READERS[kind](path)
    assert str(e.value).startswith(f"{path}:3: {expected}")  # one problem: the message is that line
    assert isinstance(e.value, ValueError)


def test_all_problems_in_one_error_capped_at_twenty(tmp_path: Path):
    records = [GOOD["prompts"] if i % 2 else {"prompt": i} for i in range(60)]  # 30 bad records
    path = _write(tmp_path, records, name="prompts.jsonl")
    with pytest.raises(DataError) as e:
        read_prompts(path)
    message = str(e.value)
    assert message.splitlines()[0] == "30 problems in the data (fix them and run again):"
    assert f"{path}:1: " in message and f"{path}:39: " in message and f"{path}:41: " not in message
    assert message.splitlines()[-1].strip() == "... and 10 more"
    assert e.value.count == 30 and len(e.value.problems) == 20


def test_prompt_columns_are_kept(tmp_path: Path):
    path = _write(tmp_path, [{"prompt": "2 + 2 =", "answer": "4", "level": 1}, {"messages": [USER], "answer": "2"}])
    first, second = read_prompts(path)
    assert first.prompt == "2 + 2 =" and first.messages is None and first.columns == {"answer": "4", "level": 1}
    assert second.prompt is None and second.messages == [USER] and second.columns == {"answer": "2"}


def test_trl_conversational_prompt_is_accepted(tmp_path: Path):
    (example,) = read_prompts(_write(tmp_path, [{"prompt": [USER], "solution": "2"}]))
    assert example.messages == [USER] and example.columns == {"solution": "2"}


def test_preferences_plain_and_chat_forms(tmp_path: Path):
    bad = {"role": "assistant", "content": "3"}
    path = _write(
        tmp_path,
        [
            {"prompt": "p", "chosen": "a", "rejected": "b"},
            {"prompt": "p", "chosen": "a", "rejected": "b", "margin": 2},
            {"chosen": [USER, ASSISTANT], "rejected": [USER, bad]},  # implicit prompt
            {"prompt": "what is 1 + 1?", "chosen": [ASSISTANT], "rejected": [bad]},  # string prompt, chat answers
        ],
    )
    plain, margin, implicit, explicit = read_preferences(path)
    assert (plain.prompt, plain.chosen, plain.rejected, plain.margin, plain.is_chat) == ("p", "a", "b", 0.0, False)
    assert margin.margin == 2.0
    assert implicit.is_chat and implicit.prompt == [USER]
    assert implicit.chosen == [ASSISTANT] and implicit.rejected == [bad]
    assert explicit.prompt == [USER] and explicit.chosen == [ASSISTANT]


def test_sft_forms(tmp_path: Path):
    path = _write(tmp_path, [{"prompt": "p", "response": "r"}, {"messages": [USER, ASSISTANT]}])
    plain, chat = read_sft(path)
    assert (plain.prompt, plain.response, plain.messages) == ("p", "r", None)
    assert chat.messages == [USER, ASSISTANT]
