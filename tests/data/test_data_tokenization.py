"""Tokenisation: chat prompts, SFT label masking, eos on preference responses, truncation, pad token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.data import (
    IGNORE_INDEX,
    DataError,
    PreferenceExample,
    PromptExample,
    SFTExample,
    ensure_pad_token,
    load_preferences,
    load_prompts,
    load_sft,
    require_pad_token_id,
    tokenize_preferences,
    tokenize_prompts,
    tokenize_sft,
)

SYSTEM = {"role": "system", "content": "answer briefly"}
USER1 = {"role": "user", "content": "what is 2 + 3?"}
ASSISTANT1 = {"role": "assistant", "content": "5"}
USER2 = {"role": "user", "content": "and 4 + 4?"}
ASSISTANT2 = {"role": "assistant", "content": "8, of course"}
CONVERSATION = [SYSTEM, USER1, ASSISTANT1, USER2, ASSISTANT2]


def _chat_ids(tokenizer, messages, add_generation_prompt):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _trained(example) -> list[int]:
    return [label for label in example.labels if label != IGNORE_INDEX]


# ---------------------------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------------------------


def test_plain_and_chat_prompts(tokenizer):
    plain, chat = tokenize_prompts(
        [
            PromptExample("p:1", prompt="count to 3:", columns={"answer": "1 2 3"}),
            PromptExample("p:2", messages=[SYSTEM, USER1], columns={"answer": "5"}),
        ],
        tokenizer,
    )
    assert plain.input_ids == tokenizer("count to 3:", add_special_tokens=False)["input_ids"]
    assert plain.text == "count to 3:" and plain.columns == {"answer": "1 2 3"} and not plain.truncated
    # Chat: the template with the generation prompt, so the policy continues as the assistant.
    assert chat.input_ids == _chat_ids(tokenizer, [SYSTEM, USER1], add_generation_prompt=True)
    assert chat.text == tokenizer.apply_chat_template([SYSTEM, USER1], tokenize=False, add_generation_prompt=True)
    assert chat.text.startswith("<|bos|>") and chat.text.endswith("<|assistant|>\n")
    assert chat.messages == [SYSTEM, USER1] and chat.columns == {"answer": "5"}


def test_prompt_left_truncation_keeps_the_end_and_bos(tokenizer):
    plain, chat, short = tokenize_prompts(
        [
            PromptExample("p:1", prompt="the red cat sees a dog in the park."),
            PromptExample("p:2", messages=[SYSTEM, USER1]),
            PromptExample("p:3", prompt="hi"),
        ],
        tokenizer,
        max_prompt_length=4,
    )
    full = tokenizer("the red cat sees a dog in the park.", add_special_tokens=False)["input_ids"]
    assert plain.truncated and plain.input_ids == full[-4:]
    chat_full = _chat_ids(tokenizer, [SYSTEM, USER1], add_generation_prompt=True)
    assert chat.truncated and chat.input_ids == [tokenizer.bos_token_id, *chat_full[-3:]]
    assert not short.truncated
    assert sum(p.truncated for p in (plain, chat, short)) == 2  # the counter a trainer logs


def test_missing_chat_template_is_a_data_error(tokenizer):
    tokenizer.chat_template = None
    with pytest.raises(DataError, match=r"p:7: chat messages need a chat template, but the tokenizer has none"):
        tokenize_prompts([PromptExample("p:7", messages=[USER1])], tokenizer)


def test_load_prompts_end_to_end(tokenizer, tmp_path: Path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "what is 1 + 1?", "answer": 2}) + "\n" + json.dumps({"messages": [USER1]}))
    first, second = load_prompts(path, tokenizer)
    assert first.where == f"{path}:1" and first.columns == {"answer": 2}
    assert second.where == f"{path}:2" and second.input_ids == _chat_ids(tokenizer, [USER1], True)


# ---------------------------------------------------------------------------------------------------------------
# SFT
# ---------------------------------------------------------------------------------------------------------------


def test_sft_plain_labels_are_the_response_and_eos(tokenizer):
    (ex,) = tokenize_sft([SFTExample("s:1", prompt="what is 2 + 3?", response=" 5")], tokenizer)
    prompt_ids = tokenizer("what is 2 + 3?", add_special_tokens=False)["input_ids"]
    assert ex.input_ids[: len(prompt_ids)] == prompt_ids
    assert ex.labels[: len(prompt_ids)] == [IGNORE_INDEX] * len(prompt_ids)
    assert ex.labels[len(prompt_ids) :] == ex.input_ids[len(prompt_ids) :]
    assert tokenizer.decode(_trained(ex)) == " 5" + tokenizer.eos_token
    assert ex.input_ids[-1] == tokenizer.eos_token_id and not ex.truncated


def test_sft_multi_turn_trains_on_assistant_turns_only(tokenizer):
    (ex,) = tokenize_sft([SFTExample("s:1", messages=CONVERSATION)], tokenizer)
    assert ex.input_ids == _chat_ids(tokenizer, CONVERSATION, add_generation_prompt=False)
    eos = tokenizer.eos_token
    assert tokenizer.decode(_trained(ex)) == f"5{eos}8, of course{eos}"
    # Two contiguous trained spans, one per assistant turn, each the content and the template's end of turn.
    spans, inside = [], False
    for i, label in enumerate(ex.labels):
        if (label != IGNORE_INDEX) != inside:
            inside = not inside
            spans.append(i)
    spans += [len(ex.labels)] if inside else []
    assert len(spans) == 4
    assert tokenizer.decode(ex.input_ids[spans[0] : spans[1]]) == f"5{eos}"
    assert tokenizer.decode(ex.input_ids[spans[2] : spans[3]]) == f"8, of course{eos}"
    # The same tokens the template marks with its {% generation %} block.
    marked = tokenizer.apply_chat_template(CONVERSATION, return_dict=True, return_assistant_tokens_mask=True)
    assert [int(label != IGNORE_INDEX) for label in ex.labels] == list(marked["assistant_masks"])


def test_sft_messages_after_the_last_assistant_turn_are_context(tokenizer):
    (ex,) = tokenize_sft([SFTExample("s:1", messages=[USER1, ASSISTANT1, USER2])], tokenizer)
    assert ex.input_ids == _chat_ids(tokenizer, [USER1, ASSISTANT1, USER2], add_generation_prompt=False)
    assert tokenizer.decode(_trained(ex)) == "5" + tokenizer.eos_token


def test_sft_template_breaking_the_prefix_property_is_refused(tokenizer):
    # A template that writes the number of messages up front: each rendering rewrites the start.
    tokenizer.chat_template = (
        "{{ messages | length }}{% for m in messages %}{{ m['role'] ~ ': ' ~ m['content'] ~ '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    with pytest.raises(DataError, match=r"^s:9: the chat template breaks the prefix property at message 2"):
        tokenize_sft([SFTExample("s:9", messages=[SYSTEM, USER1, ASSISTANT1])], tokenizer)


def test_sft_template_rewriting_a_history_turn_is_refused(tokenizer):
    # A template that writes earlier assistant turns in capitals: the history's "FIVE" is no tail of the "five" the
    # model writes for that turn, so it cannot be labelled.
    tokenizer.chat_template = (
        "{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>\\n' }}{{ m['content'] | upper if m['role'] == 'assistant' "
        "and not loop.last else m['content'] }}{{ '<|eos|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    )
    messages = [USER1, {"role": "assistant", "content": "five"}, USER2, ASSISTANT2]
    with pytest.raises(DataError, match=r"^s:3: message 1 cannot be found in the rendering of the whole conversation"):
        tokenize_sft([SFTExample("s:3", messages=messages)], tokenizer)
    (last_only,) = tokenize_sft([SFTExample("s:4", messages=messages[:2])], tokenizer)  # no history: labelled
    assert tokenizer.decode(_trained(last_only)) == "five" + tokenizer.eos_token


def test_sft_right_truncation(tokenizer):
    (ex,) = tokenize_sft([SFTExample("s:1", prompt="count to 9:", response=" 1 2 3 4 5 6 7 8 9")], tokenizer)
    (cut,) = tokenize_sft([SFTExample("s:1", prompt="count to 9:", response=" 1 2 3 4 5 6 7 8 9")], tokenizer, 8)
    assert cut.truncated and cut.input_ids == ex.input_ids[:8] and cut.labels == ex.labels[:8]
    with pytest.raises(DataError, match=r"s:2: nothing left to train on after truncating to data.max_length=2"):
        tokenize_sft([SFTExample("s:2", prompt="count to 9:", response=" 1")], tokenizer, max_length=2)


def test_load_sft_reports_template_problems_with_location(tokenizer, tmp_path: Path):
    tokenizer.chat_template = "{{ raise_exception('no chats here') }}"
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n" + json.dumps({"messages": [USER1, ASSISTANT1]}))
    with pytest.raises(DataError, match=rf"{path}:2: the chat template failed: .*no chats here"):
        load_sft(path, tokenizer)


# ---------------------------------------------------------------------------------------------------------------
# Preferences
# ---------------------------------------------------------------------------------------------------------------


def test_preference_responses_end_with_eos(tokenizer):
    (ex,) = tokenize_preferences([PreferenceExample("r:1", "what is 2 + 3?", " 5", " 6", margin=1.5)], tokenizer)
    assert ex.prompt_ids == tokenizer("what is 2 + 3?", add_special_tokens=False)["input_ids"]
    assert ex.chosen_ids == [*tokenizer(" 5", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    assert ex.rejected_ids == [*tokenizer(" 6", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    assert ex.margin == 1.5 and not ex.truncated


def test_chat_preferences(tokenizer):
    bad = {"role": "assistant", "content": "6"}
    (ex,) = tokenize_preferences([PreferenceExample("r:1", [SYSTEM, USER1], [ASSISTANT1], [bad])], tokenizer)
    assert ex.prompt_ids == _chat_ids(tokenizer, [SYSTEM, USER1], add_generation_prompt=True)
    assert ex.prompt_ids + ex.chosen_ids == _chat_ids(tokenizer, [SYSTEM, USER1, ASSISTANT1], False)
    assert tokenizer.decode(ex.chosen_ids) == "5" + tokenizer.eos_token
    assert tokenizer.decode(ex.rejected_ids) == "6" + tokenizer.eos_token


def test_chat_preferences_get_eos_when_the_template_ends_turns_otherwise(tokenizer):
    tokenizer.chat_template = (
        "{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>\\n' ~ m['content'] ~ '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    )
    (ex,) = tokenize_preferences([PreferenceExample("r:1", [USER1], [ASSISTANT1], [ASSISTANT2])], tokenizer)
    assert ex.chosen_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ex.chosen_ids) == "5\n" + tokenizer.eos_token


def test_preference_truncation(tokenizer):
    long_prompt = "the red cat sees a dog in the park. the old robot reads a book at home."
    example = PreferenceExample("r:3", long_prompt, " 1 2 3 4 5 6 7 8 9", " 5")
    (full,) = tokenize_preferences([example], tokenizer)
    (ex,) = tokenize_preferences([example], tokenizer, max_length=10, max_prompt_length=6)
    assert ex.truncated and ex.prompt_ids == full.prompt_ids[-6:]
    assert ex.chosen_ids == full.chosen_ids[:4] and ex.rejected_ids == full.rejected_ids  # " 5<eos>" fits
    with pytest.raises(DataError, match=r"r:3: the prompt takes \d+ tokens, leaving no room"):
        tokenize_preferences([example], tokenizer, max_length=10)


def test_load_preferences_end_to_end(tokenizer, tmp_path: Path):
    path = tmp_path / "prefs.jsonl"
    rows = [
        {"prompt": "what is 2 + 3?", "chosen": " 5", "rejected": " 6"},
        {"chosen": [USER1, ASSISTANT1], "rejected": [USER1, {"role": "assistant", "content": "6"}], "margin": 1},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    plain, chat = load_preferences(path, tokenizer)
    assert plain.chosen_ids[-1] == chat.chosen_ids[-1] == chat.rejected_ids[-1] == tokenizer.eos_token_id
    assert chat.margin == 1.0 and chat.where == f"{path}:2"


# ---------------------------------------------------------------------------------------------------------------
# Pad token
# ---------------------------------------------------------------------------------------------------------------


def test_pad_equal_to_eos_is_refused_and_ensure_pad_token_fixes_it(tokenizer):
    assert require_pad_token_id(tokenizer) == tokenizer.pad_token_id
    assert ensure_pad_token(tokenizer) is False  # already distinct: untouched

    tokenizer.pad_token = tokenizer.eos_token
    with pytest.raises(ValueError, match=r"pad token '<\|eos\|>' is also its eos token.*add_special_tokens"):
        require_pad_token_id(tokenizer)
    with pytest.raises(ValueError, match="pad token"):
        load_prompts(Path("never-read.jsonl"), tokenizer)  # refused before reading anything
    assert ensure_pad_token(tokenizer) is True
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert require_pad_token_id(tokenizer) == tokenizer.pad_token_id


def test_missing_pad_is_refused_and_added(tokenizer):
    tokenizer.pad_token = None
    with pytest.raises(ValueError, match=r"the tokenizer has no pad token; add a distinct pad token"):
        require_pad_token_id(tokenizer)
    assert ensure_pad_token(tokenizer, "<|my_pad|>") is True
    assert tokenizer.pad_token == "<|my_pad|>" and tokenizer.pad_token_id not in (None, tokenizer.eos_token_id)
    assert tokenizer.convert_ids_to_tokens(tokenizer("a<|my_pad|>")["input_ids"])[-1] == "<|my_pad|>"


def test_plain_text_gets_the_tokenizers_leading_specials_only(tokenizer):
    """A Llama-like tokenizer wraps a text as `<bos> text <eos>`: prompts keep the bos, never the eos."""
    from tokenizers.processors import TemplateProcessing

    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|bos|> $A <|eos|>", special_tokens=[("<|bos|>", bos), ("<|eos|>", eos)]
    )
    text_ids = tokenizer("what is 2 + 3?", add_special_tokens=False)["input_ids"]
    assert tokenizer("what is 2 + 3?")["input_ids"] == [bos, *text_ids, eos]  # the wrapping is in place
    (prompt,) = tokenize_prompts([PromptExample("p:1", prompt="what is 2 + 3?")], tokenizer, max_prompt_length=3)
    assert prompt.input_ids == [bos, *text_ids[-2:]] and prompt.truncated  # left truncation keeps the bos
    (sft,) = tokenize_sft([SFTExample("s:1", prompt="what is 2 + 3?", response=" 5")], tokenizer)
    assert sft.input_ids[: len(text_ids) + 1] == [bos, *text_ids]
    assert tokenizer.decode(_trained(sft)) == " 5" + tokenizer.eos_token
    (pref,) = tokenize_preferences([PreferenceExample("r:1", "what is 2 + 3?", " 5", " 6")], tokenizer)
    assert pref.prompt_ids == [bos, *text_ids] and pref.chosen_ids[-1] == eos and pref.chosen_ids.count(eos) == 1
