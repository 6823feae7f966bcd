"""Chat-template arguments (``data.chat_template_kwargs``, `rlhf.data.chat`) on Qwen3's template, whose
``enable_thinking: false`` writes an empty ``<think>`` block into the generation prompt: what SFT trains on, what
PPO and GRPO sample from, what the trained model records and what ``rlhf eval`` and ``rlhf sample`` reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from chat_models import chat_tokenizer
from configs import nested
from rlhf.config import config_from_dict
from rlhf.data import IGNORE_INDEX, chat
from rlhf.data.records import PromptExample, SFTExample
from rlhf.data.tokenization import tokenize_prompts, tokenize_sft
from rlhf.models.tiny import save_tiny
from rlhf.rollout.episodes import ChatFormat
from rlhf.trainers import reward_model, sft
from rlhf.trainers.rl.inputs import load_inputs
from tiny_models import tiny_family_lm

OFF = {"enable_thinking": False}
EMPTY_THINK = "<think>\n\n</think>\n\n"
"""What Qwen3's template writes after the assistant header with thinking off (and before an answer without a
reasoning_content when thinking is on)."""
CONVERSATION = [{"role": "user", "content": "what is 2 + 3?"}, {"role": "assistant", "content": "5"}]


@pytest.fixture
def qwen3():
    tokenizer = chat_tokenizer("qwen3")
    yield tokenizer
    chat.set_template_kwargs(tokenizer, {})  # the tokenizer is shared between tests


def trained_text(tokenizer, example) -> tuple[str, str, str]:
    """(the text before, the trained text, the text after) of one tokenised SFT example with one trained span."""
    trained = [i for i, label in enumerate(example.labels) if label != IGNORE_INDEX]
    start, end = trained[0], trained[-1] + 1
    assert trained == list(range(start, end))
    ids = example.input_ids
    return tokenizer.decode(ids[:start]), tokenizer.decode(ids[start:end]), tokenizer.decode(ids[end:])


def test_thinking_off_moves_the_empty_think_block_from_the_trained_tokens_into_the_prompt(qwen3):
    """Thinking on (the template's default), the empty think block Qwen3 writes before an answer is part of the
    assistant's turn, so SFT trains the model to write it; off, the generation prompt holds it and only the answer
    and <|im_end|> are trained."""
    (on,) = tokenize_sft([SFTExample("x:1", messages=CONVERSATION)], qwen3)
    chat.set_template_kwargs(qwen3, OFF)
    (off,) = tokenize_sft([SFTExample("x:1", messages=CONVERSATION)], qwen3)
    header = "<|im_start|>user\nwhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert trained_text(qwen3, on) == (header, EMPTY_THINK + "5<|im_end|>", "\n")
    assert trained_text(qwen3, off) == (header + EMPTY_THINK, "5<|im_end|>", "\n")
    assert on.input_ids == off.input_ids[: len(on.input_ids)]  # the same text: only the labels moved


def test_thinking_off_ends_every_prompt_and_episode_opening_with_the_empty_think_block(qwen3):
    messages = [{"role": "user", "content": "what is 2 + 3?"}]
    (on,) = tokenize_prompts([PromptExample("x:1", messages=messages)], qwen3)
    episode_on = qwen3.decode(ChatFormat(qwen3, [qwen3.eos_token_id]).opening(messages))
    chat.set_template_kwargs(qwen3, OFF)
    (off,) = tokenize_prompts([PromptExample("x:1", messages=messages)], qwen3)
    episode_off = qwen3.decode(ChatFormat(qwen3, [qwen3.eos_token_id]).opening(messages))
    assert on.text.endswith("<|im_start|>assistant\n") and episode_on == on.text
    assert off.text == on.text + EMPTY_THINK and episode_off == off.text
    assert qwen3.decode(off.input_ids) == off.text


def test_arguments_of_apply_chat_template_itself_are_refused(qwen3):
    with pytest.raises(ValueError, match="add_generation_prompt is an argument of apply_chat_template itself"):
        chat.set_template_kwargs(qwen3, {"add_generation_prompt": True})


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = chat_tokenizer("qwen3")
    return save_tiny(tiny_family_lm("qwen2", tokenizer), tokenizer, tmp_path_factory.mktemp("qwen3") / "base")


@pytest.fixture(scope="module")
def sums(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An SFT file of 8 conversations and a prompts file of 4 questions (with their answers)."""
    root = tmp_path_factory.mktemp("sums")
    demos, prompts = root / "sft.jsonl", root / "prompts.jsonl"
    pairs = [(a, b) for a in range(2) for b in range(4)]
    demos.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"what is {a} + {b}?"},
                     {"role": "assistant", "content": str(a + b)}]}) + "\n" for a, b in pairs))  # fmt: skip
    prompts.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"what is {a} + {b}?"}], "answer": str(a + b)}) + "\n"
            for a, b in pairs[:4]
        )
    )
    return demos, prompts


@pytest.mark.parametrize("command", ["ppo", "grpo"])
def test_ppo_and_grpo_sample_from_prompts_rendered_with_the_arguments(qwen3_model, sums, tmp_path, command):
    _, prompts = sums
    values = {"model.name": str(qwen3_model), "data.train": str(prompts), "output_dir": str(tmp_path / "run"),
              "reward.source": "rlhf.rollout.verifiers:exact_match"}  # fmt: skip
    on = load_inputs(config_from_dict(command, nested(values)))
    off = load_inputs(config_from_dict(command, nested(values | {"data.chat_template_kwargs": OFF})))
    for a, b in zip(on.train_prompts, off.train_prompts, strict=True):
        assert b.text == a.text + EMPTY_THINK
        assert on.tokenizer.decode(b.input_ids).endswith("<|im_start|>assistant\n" + EMPTY_THINK)


def test_the_trained_model_records_the_arguments_and_eval_and_sample_reuse_them(
    qwen3_model, sums, tmp_path, monkeypatch
):
    """SFT with thinking off: the run's config.yaml and final/'s tokenizer_config.json record it; ``rlhf eval`` and
    ``rlhf sample`` of final/ render their prompts with it unless told otherwise ({} = the template's defaults)."""
    from rlhf import evaluate, sample

    demos, prompts = sums
    values = {"model.name": str(qwen3_model), "data.train": str(demos), "output_dir": str(tmp_path / "sft"),
              "data.chat_template_kwargs": OFF, "sft.epochs": 1, "batch.size": 4, "run.eval_every": 0,
              "run.save_every": 0, "run.progress": False}  # fmt: skip
    final = sft.run(config_from_dict("sft", nested(values)))
    assert yaml.safe_load((tmp_path / "sft" / "config.yaml").read_text())["data"]["chat_template_kwargs"] == OFF
    assert json.loads((final / "tokenizer_config.json").read_text())["chat_template_kwargs"] == OFF

    rendered: list[str] = []  # the text of every prompt the commands sample from

    def recording(load):
        def wrapped(*args, **kwargs):
            out = load(*args, **kwargs)
            rendered.extend(p.text for p in out)
            return out

        return wrapped

    monkeypatch.setattr(evaluate, "_prompts", recording(evaluate._prompts))
    monkeypatch.setattr(sample, "load_prompts", recording(sample.load_prompts))
    common = {"model.name": str(final), "sampling.max_new_tokens": 4, "progress": False}
    for fields in ({}, {"chat_template_kwargs": {}}):
        evaluate.run(config_from_dict("eval", nested(common | fields | {"eval_data": str(prompts),
            "reward.source": "rlhf.rollout.verifiers:exact_match", "output": str(tmp_path / f"eval{len(fields)}.json")})))  # fmt: skip
        sample.run(config_from_dict("sample", nested(common | fields | {"prompts": str(prompts),
            "output": str(tmp_path / f"sample{len(fields)}.jsonl"), "num_samples": 1})))  # fmt: skip
    reused, defaults = rendered[:8], rendered[8:]
    assert len(defaults) == 8 and all(text.endswith("<|im_start|>assistant\n" + EMPTY_THINK) for text in reused)
    assert [text + EMPTY_THINK for text in defaults] == reused


def test_rm_tokenizes_its_preference_pairs_with_the_arguments(qwen3_model, tmp_path, monkeypatch):
    """``rlhf rm`` with thinking off: every pair is rendered with the arguments, as the policy writes its answers
    (the prompt ends with the empty think block, the answers follow it), and final/ records them."""
    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": CONVERSATION[:1], "chosen": CONVERSATION[1:],
             "rejected": [{"role": "assistant", "content": str(n)}]} for n in (4, 6, 7, 8)]  # fmt: skip
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    loaded = []  # the pairs the run trains on
    load_pairs = reward_model.load_pairs
    monkeypatch.setattr(reward_model, "load_pairs", lambda *args: loaded.append(load_pairs(*args)) or loaded[-1])
    values = {"model.name": str(qwen3_model), "data.train": str(data), "output_dir": str(tmp_path / "rm"),
              "data.chat_template_kwargs": OFF, "rm.epochs": 1, "batch.size": 4, "run.eval_every": 0,
              "run.save_every": 0, "run.progress": False}  # fmt: skip
    final = reward_model.run(config_from_dict("rm", nested(values)))
    (train, _), tokenizer = loaded[0], chat_tokenizer("qwen3")
    assert len(train) == 4
    for pair in train:
        assert tokenizer.decode(pair.prompt_ids).endswith("<|im_start|>assistant\n" + EMPTY_THINK)
        assert tokenizer.decode(pair.chosen_ids) == "5<|im_end|>"
    assert json.loads((final / "tokenizer_config.json").read_text())["chat_template_kwargs"] == OFF
