"""SFT on tool conversations (the OpenAI/Hugging Face message schema: assistant ``tool_calls``, ``tool`` messages,
the row's ``tools`` schemas): the loss covers exactly the assistant's tokens, its calls included, and no tool
result, for each template with a tool format; packed, the same labels."""

from __future__ import annotations

import pytest
from transformers.utils import get_json_schema

from chat_models import chat_tokenizer
from rlhf.data import IGNORE_INDEX
from rlhf.data.files import DataError, Record
from rlhf.data.records import validate_sft
from rlhf.data.tokenization import ensure_pad_token, tokenize_sft
from rlhf.rollout.tools import calculator

CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}, "id": "call00000"}
ROW = {
    "messages": [
        {"role": "user", "content": "what is 2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "name": "calculator", "content": "5", "tool_call_id": "call00000"},
        {"role": "assistant", "content": "5"},
    ],
    "tools": [get_json_schema(calculator)],
}

TRAINED = {
    "qwen2_5": [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call><|im_end|>',
        "5<|im_end|>",
    ],
    # the call turn as the history shows it (no think block), the answer as the last turn (Qwen3 writes the empty
    # think block there): tests/data/test_sft_conversations.py for thinking off and reasoning traces
    "qwen3": [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call><|im_end|>',
        "<think>\n\n</think>\n\n5<|im_end|>",
    ],
    "qwen3_coder": [
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n2 + 3\n</parameter>\n</function>\n"
        "</tool_call><|im_end|>",
        "5<|im_end|>",
    ],
    "llama3_1": ['{"name": "calculator", "parameters": {"expression": "2 + 3"}}<|eot_id|>', "5<|eot_id|>"],
    "mistral_v0_3": [
        '[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "2 + 3"}, "id": "call00000"}]</s>',
        " 5</s>",
    ],
}
"""The tokens each template's assistant turns render to: the call, the answer, each through its end-of-turn token."""


def spans(example) -> list[str]:
    """The trained stretches of ``example``'s labels, as token-id lists."""
    out, current = [], []
    for token, label in zip(example.input_ids, example.labels, strict=True):
        if label != IGNORE_INDEX:
            assert label == token
            current.append(token)
        elif current:
            out.append(current)
            current = []
    return out + ([current] if current else [])


@pytest.mark.parametrize("name", list(TRAINED))
def test_the_loss_covers_exactly_the_assistants_tokens_calls_included(name):
    tokenizer = chat_tokenizer(name, ("what is 2 + 3?",))
    ensure_pad_token(tokenizer)
    (example,) = validate_sft([Record(ROW, "tools.jsonl:1")])
    assert example.messages[1]["content"] == ""  # OpenAI's null content beside a call
    (tokenized,) = tokenize_sft([example], tokenizer)
    assert [tokenizer.decode(span) for span in spans(tokenized)] == TRAINED[name]
    whole = tokenizer.apply_chat_template(example.messages, tools=example.tools, tokenize=False)
    assert tokenizer.decode(tokenized.input_ids) == whole  # the conversation as the template renders it


def test_malformed_tool_messages_are_named():
    bad = [
        {"messages": [{"role": "user", "content": "?"}, {"role": "assistant", "content": "", "tool_calls": []}]},
        {"messages": [{"role": "user", "content": "?", "tool_calls": [CALL]}, {"role": "assistant", "content": "x"}]},
        {"messages": [{"role": "user", "content": "?"}, {"role": "assistant", "content": "x"}], "tools": "calc"},
    ]
    with pytest.raises(DataError) as raised:
        validate_sft([Record(row, f"t.jsonl:{i + 1}") for i, row in enumerate(bad)])
    message = str(raised.value)
    assert 't.jsonl:1: "messages"[1]["tool_calls"] must be a non-empty list of calls' in message
    assert 't.jsonl:2: "messages"[0]: only an assistant message has "tool_calls", not a \'user\' one' in message
    assert 't.jsonl:3: "tools" must be a list of JSON schemas' in message
