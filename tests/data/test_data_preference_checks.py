"""Preference checks the reward model relies on: two different answers, pairs that fit the model, and the
one-text encoding of encoder reward models — each problem reported as ``file:line: what is wrong``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.data import DataError, PreferenceExample, load_preferences, read_preferences, tokenize_preferences
from rlhf.models.tiny import toy_corpus
from tiny_models import train_wordpiece_tokenizer

USER = {"role": "user", "content": "what is 1 + 1?"}
TWO = {"role": "assistant", "content": "2"}


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def wordpiece():
    """A lower-casing BERT-style tokenizer: [CLS] text [SEP], no eos."""
    return train_wordpiece_tokenizer(toy_corpus(500, seed=0), vocab_size=300, model_max_length=64)


@pytest.mark.parametrize(
    ("row", "what"),
    [
        ({"prompt": "p", "chosen": " 2", "rejected": " 2"}, "text"),
        ({"prompt": [USER], "chosen": [TWO], "rejected": [TWO]}, "messages"),
        ({"chosen": [USER, TWO], "rejected": [USER, TWO]}, "messages"),  # implicit prompt
    ],
    ids=["plain", "chat", "implicit-prompt"],
)
def test_chosen_identical_to_rejected_is_refused(tmp_path, row, what):
    good = {"prompt": "p", "chosen": " 2", "rejected": " 3"}
    path = _write(tmp_path, [good, row])
    with pytest.raises(DataError, match=rf'^{path}:2: "chosen" and "rejected" are the same {what}: the pair'):
        read_preferences(path)


def test_model_limit_prompt_and_pair_lengths(tokenizer):
    def length(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompt = "the red cat sees a dog in the park."
    n_prompt, n_short, n_long = length(prompt), length(" 5") + 1, length(" 1 2 3 4 5 6 7 8 9") + 1  # + eos
    limit = n_prompt + n_short
    fits = PreferenceExample("f:1", prompt, " 5", " 6")
    long_answer = PreferenceExample("f:2", prompt, " 1 2 3 4 5 6 7 8 9", " 6")
    (ok,) = tokenize_preferences([fits], tokenizer, model_max_length=limit)
    assert len(ok.prompt_ids) + len(ok.chosen_ids) == limit
    with pytest.raises(DataError) as error:
        tokenize_preferences([fits, long_answer], tokenizer, model_max_length=limit)
    assert str(error.value) == (
        f'f:2: prompt + "chosen" takes {n_prompt + n_long} tokens, more than the model\'s {limit} '
        f"positions; shorten it, or set max_length ≤ {limit} to cut long responses"
    )
    with pytest.raises(DataError, match=rf"^f:1: the prompt takes {n_prompt} tokens, leaving no room for a "):
        tokenize_preferences([fits], tokenizer, model_max_length=n_prompt)
    # max_length cuts responses first; what is cut to fit is no longer too long for the model
    (cut,) = tokenize_preferences([long_answer], tokenizer, max_length=limit, model_max_length=limit)
    assert cut.truncated and len(cut.chosen_ids) == n_short


def test_answers_cut_or_encoded_to_the_same_tokens_are_refused(tokenizer, wordpiece):
    prompt = "count to 9:"
    same_start = PreferenceExample("c:1", prompt, " 1 2 3 4", " 1 2 3 5")
    n = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    with pytest.raises(DataError, match=r'^c:1: "chosen" and "rejected" encode to the same tokens once cut to '
                                        r"data.max_length=\d+; raise data.max_length"):  # fmt: skip
        tokenize_preferences([same_start], tokenizer, max_length=n + 6)  # " 1 2 3" both
    # a lower-casing tokenizer cannot tell "Yes" from "yes"
    case = PreferenceExample("c:2", "is it?", " Yes", " yes")
    tokenize_preferences([case], tokenizer)  # case-sensitive BPE: fine
    with pytest.raises(DataError, match=r'^c:2: "chosen" and "rejected" encode to the same tokens: the pair'):
        tokenize_preferences([case], wordpiece, join_text=True)


def test_encoders_get_prompt_and_response_as_one_text(wordpiece):
    example = PreferenceExample("e:1", "what is 2 + 3?", " 5", " 6", margin=0.5)
    (ex,) = tokenize_preferences([example], wordpiece, join_text=True, model_max_length=64)
    assert ex.prompt_ids == [] and ex.margin == 0.5 and not ex.truncated
    assert ex.chosen_ids == wordpiece("what is 2 + 3? 5")["input_ids"]
    assert wordpiece.convert_ids_to_tokens(ex.rejected_ids) == ["[CLS]", "what", "is", "2", "+", "3", "?", "6", "[SEP]"]
    # cut to max_length by the tokenizer: the closing [SEP] stays, as the model was trained to read it
    long = PreferenceExample("e:2", "count to 9:", " 1 2 3 4 5 6 7 8 9", " 5")
    (cut,) = tokenize_preferences([long], wordpiece, max_length=8, join_text=True)
    assert cut.truncated and len(cut.chosen_ids) == 8 and cut.chosen_ids[-1] == wordpiece.sep_token_id
    assert cut.rejected_ids == wordpiece("count to 9: 5")["input_ids"]
    with pytest.raises(DataError, match=r'^e:2: prompt \+ "chosen" takes 15 tokens, more than the model\'s 10'):
        tokenize_preferences([long], wordpiece, join_text=True, model_max_length=10)


def test_load_preferences_lists_every_problem_with_file_and_line(tokenizer, tmp_path):
    rows = [
        {"prompt": "what is 2 + 3?", "chosen": " 5", "rejected": " 6"},
        {"prompt": "the red cat sees a dog in the park. " * 4, "chosen": " 5", "rejected": " 6"},
        {"prompt": "what is 2 + 3?", "chosen": " 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5 5", "rejected": " 6"},
    ]
    path = _write(tmp_path, rows)
    with pytest.raises(DataError) as error:
        load_preferences(path, tokenizer, model_max_length=24)
    assert error.value.count == 2
    assert error.value.problems[0].startswith(f"{path}:2: the prompt takes")
    assert error.value.problems[1].startswith(f'{path}:3: prompt + "chosen" takes')
    assert len(load_preferences(path, tokenizer, max_length=60, model_max_length=64)) == 3
