"""SFT labels of multi-turn conversations, token-exact against hand-written masks: the conversation rendered once by
the model's own template, each assistant turn found in it (`rlhf.data.tokenization`, module docstring).

Qwen3's template is the case that needs it: it writes a think block only into the turns after the last user query
(an empty one only into the last turn), so the history of a conversation is not what its prefixes render. A mask is
written as the rendered text with each trained stretch in ⟦ ⟧."""

from __future__ import annotations

import pytest
from transformers.utils import get_json_schema

from chat_models import CHAT_MODELS, chat_tokenizer
from rlhf.data import IGNORE_INDEX, DataError, chat
from rlhf.data.records import SFTExample
from rlhf.data.tokenization import tokenize_sft
from rlhf.rollout.tools import calculator

OFF = {"enable_thinking": False}
CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}, "id": "call00000"}
USER1 = {"role": "user", "content": "what is 2 + 3?"}
USER2 = {"role": "user", "content": "and 4 + 4?"}
RESULT = {"role": "tool", "name": "calculator", "content": "5", "tool_call_id": "call00000"}


def assistant(content: str, reasoning: str | None = None, call: bool = False) -> dict:
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message | ({"tool_calls": [CALL]} if call else {})


TOOLS = [USER1, assistant("", call=True), RESULT, assistant("5")]
TRACED = [USER1, assistant("", "use the calculator", call=True), RESULT, assistant("5", "it said 5")]
ASKED_AGAIN = [*TRACED, USER2, assistant("8", "4 + 4 = 8")]

# Qwen3's pieces, to write the masks with
U1 = "<|im_start|>user\nwhat is 2 + 3?<|im_end|>\n"
U2 = "<|im_start|>user\nand 4 + 4?<|im_end|>\n"
R = "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
A = "<|im_start|>assistant\n"
C = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call><|im_end|>'
E = "<think>\n\n</think>\n\n"  # the empty think block

QWEN3 = {
    # thinking on: the call turn, before a tool result, has no think block in the history (the model wrote an empty
    # one, which the history drops: the call is trained after the header); the last turn keeps its empty block
    ("on", "tools"): f"{U1}{A}⟦{C}⟧\n{R}{A}⟦{E}5<|im_end|>⟧\n",
    # a trace in a turn after the last user query stays in the history and is trained, as is the last turn's
    ("on", "traced"): f"{U1}{A}⟦<think>\nuse the calculator\n</think>\n\n{C}⟧\n{R}{A}⟦<think>\nit said 5\n</think>\n\n"
    "5<|im_end|>⟧\n",
    # a later user query: the turns before it lose their traces (the template drops them from the history, so they are
    # not trained), the last turn keeps its own
    ("on", "asked again"): f"{U1}{A}⟦{C}⟧\n{R}{A}⟦5<|im_end|>⟧\n{U2}{A}⟦<think>\n4 + 4 = 8\n</think>\n\n8<|im_end|>⟧\n",
    # thinking off: the generation prompt holds the empty think block, so it is never trained; the history turn has
    # none (the bare role header precedes it), the last turn has it as context
    ("off", "tools"): f"{U1}{A}⟦{C}⟧\n{R}{A}{E}⟦5<|im_end|>⟧\n",
    ("off", "plain"): f"{U1}{A}⟦5<|im_end|>⟧\n{U2}{A}{E}⟦8<|im_end|>⟧\n",
}
ROWS = {
    "tools": TOOLS,
    "traced": TRACED,
    "asked again": ASKED_AGAIN,
    "plain": [USER1, assistant("5"), USER2, assistant("8")],
}


def marked(tokenizer, example) -> str:
    """The example's text with each stretch of trained tokens in ⟦ ⟧ (each checked to be its own label)."""
    runs: list[tuple[bool, list[int]]] = []
    for token, label in zip(example.input_ids, example.labels, strict=True):
        trained = label != IGNORE_INDEX
        assert not trained or label == token
        if runs and runs[-1][0] == trained:
            runs[-1][1].append(token)
        else:
            runs.append((trained, [token]))
    return "".join(f"⟦{tokenizer.decode(ids)}⟧" if trained else tokenizer.decode(ids) for trained, ids in runs)


@pytest.fixture
def qwen3():
    tokenizer = chat_tokenizer("qwen3")
    yield tokenizer
    chat.set_template_kwargs(tokenizer, {})  # the tokenizer is shared between tests


@pytest.mark.parametrize(("thinking", "row"), list(QWEN3), ids=[" ".join(key) for key in QWEN3])
def test_qwen3_turns_are_trained_as_the_whole_conversation_renders_them(qwen3, thinking, row):
    chat.set_template_kwargs(qwen3, OFF if thinking == "off" else {})
    (example,) = tokenize_sft([SFTExample("x:1", messages=ROWS[row])], qwen3)
    assert marked(qwen3, example) == QWEN3[thinking, row]
    # the input is the template's rendering of the whole conversation, and its last turn is what the model reads and
    # writes at inference: the generation prompt of the conversation before it, then the turn
    assert qwen3.decode(example.input_ids) == chat.render(qwen3, ROWS[row], add_generation_prompt=False)
    before_last = QWEN3[thinking, row].rsplit("⟦", 1)[0]
    assert before_last.replace("⟦", "").replace("⟧", "") == chat.render(
        qwen3, ROWS[row][:-1], add_generation_prompt=True
    )


def test_qwen3_with_thinking_off_refuses_a_reasoning_content_naming_the_row_and_message(qwen3):
    """Thinking off, the generation prompt closes an empty think block; a turn with a trace cannot follow it."""
    chat.set_template_kwargs(qwen3, OFF)
    rows = [SFTExample("x:1", messages=ROWS["tools"]), SFTExample("x:2", messages=TRACED)]
    with pytest.raises(DataError, match=r"^x:2: the chat template breaks the prefix property at message 1: .*"
                       r"Qwen3 with enable_thinking false and a reasoning_content") as raised:  # fmt: skip
        tokenize_sft(rows, qwen3)
    assert "x:1" not in str(raised.value)


PLAIN = {
    "qwen2_5": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    f"{U1}{A}⟦5<|im_end|>⟧\n{U2}{A}⟦8<|im_end|>⟧\n",
    "qwen3": f"{U1}{A}⟦5<|im_end|>⟧\n{U2}{A}⟦{E}8<|im_end|>⟧\n",
    "qwen3_coder": f"{U1}{A}⟦5<|im_end|>⟧\n{U2}{A}⟦8<|im_end|>⟧\n",
    "llama3_1": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nwhat is 2 + 3?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n⟦5<|eot_id|>⟧<|start_header_id|>user<|end_header_id|>\n\n"
    "and 4 + 4?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n⟦8<|eot_id|>⟧",
    "mistral_v0_3": "<s>[INST] what is 2 + 3?[/INST]⟦ 5</s>⟧[INST] and 4 + 4?[/INST]⟦ 8</s>⟧",
    # Gemma's eos is <eos>; its turns end with <end_of_turn>, the last special token of the turn (the newline after
    # it is the template's, between turns)
    "gemma3": "<bos><start_of_turn>user\nwhat is 2 + 3?<end_of_turn>\n<start_of_turn>model\n⟦5<end_of_turn>⟧\n"
    "<start_of_turn>user\nand 4 + 4?<end_of_turn>\n<start_of_turn>model\n⟦8<end_of_turn>⟧\n",
}


@pytest.mark.parametrize("name", list(CHAT_MODELS))
def test_plain_multi_turn_on_each_template(name):
    tokenizer = chat_tokenizer(name)
    (example,) = tokenize_sft([SFTExample("x:1", messages=ROWS["plain"])], tokenizer)
    assert marked(tokenizer, example) == PLAIN[name]


def test_mistral_drops_a_system_message_from_a_finished_conversation_and_is_refused_by_name():
    """Mistral v0.3's template writes the system message into the last user message only when the conversation ends
    with it: a conversation that ends with the answer has none, so no turn is what the model reads at inference."""
    tokenizer = chat_tokenizer("mistral_v0_3")
    messages = [{"role": "system", "content": "answer briefly"}, *ROWS["plain"]]
    with pytest.raises(DataError, match=r"^x:1: the chat template breaks the prefix property at message 2: .*Mistral"):
        tokenize_sft([SFTExample("x:1", messages=messages)], tokenizer)


def test_mistral_writes_the_tools_before_the_last_user_message_and_each_turn_is_still_found():
    """Mistral v0.3 shows [AVAILABLE_TOOLS] before the last user message, so the conversation before the first answer
    renders them elsewhere than the whole conversation does: rendered once, every turn is found all the same."""
    tokenizer = chat_tokenizer("mistral_v0_3")
    messages = [USER1, assistant("5"), USER2, assistant("", call=True), RESULT, assistant("8")]
    (example,) = tokenize_sft([SFTExample("x:1", messages=messages, tools=[get_json_schema(calculator)])], tokenizer)
    text = marked(tokenizer, example)
    assert text.startswith("<s>[INST] what is 2 + 3?[/INST]⟦ 5</s>⟧[AVAILABLE_TOOLS] [")
    assert text.endswith(
        '[/AVAILABLE_TOOLS][INST] and 4 + 4?[/INST]⟦[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": '
        '"2 + 3"}, "id": "call00000"}]</s>⟧[TOOL_RESULTS] {"content": 5, "call_id": "call00000"}[/TOOL_RESULTS]⟦ 8</s>⟧'
    )
    assert text.count("⟦") == 3


def test_phi3_ends_a_finished_conversation_with_its_eos_and_the_answer_is_trained_through_it():
    """Phi-3's template writes the eos after a conversation that ends without the generation prompt: the conversation
    before the answer is then not a prefix of its generation prompt's rendering, by a special token alone, and the
    answer is what follows the prompt (trained through the eos, as the model stops there when sampled with
    ``sampling.stop: eos``). In a longer conversation a history turn has no eos after it: refused by name."""
    from rlhf.models.tiny import toy_corpus
    from tiny_models import train_family_tokenizer

    tokenizer = train_family_tokenizer("phi3", toy_corpus(200))
    (example,) = tokenize_sft([SFTExample("x:1", messages=ROWS["plain"][:2])], tokenizer)
    assert marked(tokenizer, example) == "<|user|>\nwhat is 2 + 3?<|end|>\n<|assistant|>\n⟦5<|end|>\n<|endoftext|>⟧"
    with pytest.raises(DataError, match=r"^x:2: message 1 cannot be found in the rendering of the whole conversation"):
        tokenize_sft([SFTExample("x:2", messages=ROWS["plain"])], tokenizer)
