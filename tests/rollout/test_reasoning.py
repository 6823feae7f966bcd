"""Reasoning traces in rewards: a reasoning model's completion (Qwen3's ``<think>…</think>`` then the answer) is
trained on whole, but reward functions get the answer apart from the trace as TRL gives it (``content`` and
``reasoning_content``), and the built-in verifiers judge the answer, not the trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from chat_models import chat_tokenizer
from rlhf.data import chat
from rlhf.rollout import verifiers
from rlhf.rollout.rewards import RewardContext, load_reward_source
from rlhf.rollout.rewards.function import assistant_message

TEXTS = [
    "<think>\nthe sum is 5\n</think>\n\n5",
    "<think>\n\n</think>\n\n5",  # Qwen3's empty trace
    "5",  # thinking off: the empty trace is in the prompt
    "<think>\ncut inside the",  # the turn ran out of tokens inside its trace
    "I think 5</think>\n\nx",  # no opening tag: not a trace
]


def test_completions_split_as_trls_grpo_parses_qwen3s():
    """TRL's GRPOTrainer parses a Qwen3 policy's completions with ``parse_response`` (transformers' response
    template for Qwen3, set by ``add_response_schema``); ours give the same messages. Ours do not depend on the
    transformers version; TRL's parser does: before transformers 5.13 it reads a trace the token limit cut as plain
    content (its legacy response_schema), where ours and today's read it as an unfinished trace."""
    trl = pytest.importorskip("trl")
    from trl.chat_template_utils import _SUPPORTS_RESPONSE_TEMPLATE, add_response_schema, parse_response

    tokenizer = chat_tokenizer("qwen3")
    ours = tokenizer.chat_template
    try:  # TRL recognises Qwen3 by its template's exact text: ours without the fixture's source comment
        tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
        add_response_schema(tokenizer)
        # the prompt's ids as rlhf renders them (apply_chat_template's own return type changed in transformers 5.25:
        # a BatchEncoding, which parse_response cannot read as a prefix)
        prefix = chat.encode(tokenizer, [{"role": "user", "content": "?"}], add_generation_prompt=True)
        for text in TEXTS:
            if text.startswith("<think>\ncut") and not _SUPPORTS_RESPONSE_TEMPLATE:
                continue  # before transformers 5.13 TRL's parser leaves a trace cut by the token limit in content
            ended = text + ("" if text.startswith("<think>\ncut") else "<|im_end|>")  # a cut turn has no end
            ids = tokenizer(ended, add_special_tokens=False)["input_ids"]
            assert assistant_message(text, reasoning=True) == parse_response(tokenizer, ids, prefix=prefix), text
    finally:
        tokenizer.chat_template = ours
        for key in ("response_template", "response_schema"):
            if hasattr(tokenizer, key):
                setattr(tokenizer, key, None)


def record(completions, **kwargs):
    record.seen = completions
    return [0.0] * len(completions)


@pytest.mark.parametrize(("name", "split"), [("qwen3", True), ("qwen2_5", False)])
def test_reward_functions_get_the_trace_apart_when_the_policy_writes_one(name, split):
    """Qwen3's template renders reasoning_content: its completions come split; Qwen2.5's does not: the text as
    the model wrote it (a format reward over <think> tags still sees them)."""
    tokenizer = chat_tokenizer(name)
    assert chat.writes_reasoning(tokenizer) == split
    source = load_reward_source(f"{__file__}:record", policy_tokenizer=tokenizer)
    prompt = [{"role": "user", "content": "what is 2 + 3?"}]
    source.score(["?"], [TEXTS[0]], {}, RewardContext(messages=[prompt]))
    expected = {"role": "assistant", "content": "5", "reasoning_content": "the sum is 5"}
    assert source.function.seen == [[expected if split else {"role": "assistant", "content": TEXTS[0]}]]


def test_verifiers_judge_the_answer_not_the_trace():
    """A number in the trace is not the answer; a format reward still reads the whole turn, trace included."""
    plain = "<think>the sum is 5</think>I do not know"
    split = [assistant_message("<think>the sum is 5</think>\n\nI do not know", reasoning=True)]
    assert split[0]["reasoning_content"] == "the sum is 5"
    assert verifiers.exact_match([plain, split, "<think>4?</think> 5"], answer=["5", "5", "5"]) == [0.0, 0.0, 1.0]
    answered = [assistant_message("<think>\nadd them\n</think>\n\n<answer>5</answer>", reasoning=True)]
    assert verifiers.format_regex([answered]) == [1.0]  # DeepSeek-R1's format: the trace, then the answer
