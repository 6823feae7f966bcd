"""The chat templates of the model families people post-train, on tiny tokenizers with each model's special
tokens: what the episode, SFT and tool-call tests run over. The templates are the ones the models' tokenizers ship
(tests/rollout/templates/, each naming its source in its first line); nothing is downloaded.

``CHAT_MODELS[name]`` is the `Family` a tokenizer is trained with (`tiny_models.train_family_tokenizer`) and
``END_OF_TURN[name]`` the token an assistant turn ends with, which `sampling.stop` must name where it is not the eos.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

from rlhf.models.tiny import toy_corpus
from tiny_models import FAMILIES, Family, train_family_tokenizer

TEMPLATES = Path(__file__).resolve().parent / "rollout" / "templates"


def template(name: str) -> str:
    """The chat template ``tests/rollout/templates/<name>.jinja``."""
    return (TEMPLATES / f"{name}.jinja").read_text()


def _qwen(name: str) -> Family:
    return dataclasses.replace(FAMILIES["qwen2"], chat_template=template(name))


CHAT_MODELS: dict[str, Family] = {
    "qwen2_5": _qwen("qwen2_5"),
    "qwen3": _qwen("qwen3"),
    "qwen3_coder": _qwen("qwen3_coder"),
    # Llama-3.1-Instruct: its eos is <|eot_id|> (tokenizer_config.json), it has no pad token (fine-tuners use
    # <|finetune_right_pad_id|>, as here).
    "llama3_1": Family(
        "llama",
        (
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eom_id|>",
            "<|eot_id|>",
            "<|python_tag|>",
            "<|finetune_right_pad_id|>",
        ),
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
        pad="<|finetune_right_pad_id|>",
        specials_last=True,
        add_bos=True,
        chat_template=template("llama3_1"),
    ),
    # Mistral-7B-Instruct-v0.3: the control tokens of its v3 tokenizer at their ids 0-9; no pad token.
    "mistral_v0_3": Family(
        "mistral",
        (
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        eos="</s>",
        bos="<s>",
        unk="<unk>",
        add_bos=True,
        chat_template=template("mistral_v0_3"),
    ),
    "gemma3": dataclasses.replace(FAMILIES["gemma2"], chat_template=template("gemma3")),
}

END_OF_TURN = {
    "qwen2_5": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "qwen3_coder": "<|im_end|>",
    "llama3_1": "<|eot_id|>",
    "mistral_v0_3": "</s>",
    "gemma3": "<end_of_turn>",
}

TOOL_FORMATS = {
    "qwen2_5": "hermes",
    "qwen3": "hermes",
    "qwen3_coder": "qwen3_coder",
    "llama3_1": "llama3_json",
    "mistral_v0_3": "mistral",
}
"""The tool-call format each template writes (`rlhf.rollout.tools.FORMATS`); Gemma 3's has no tool role."""


@cache
def chat_tokenizer(name: str, extra: tuple[str, ...] = ()):
    """A tokenizer with ``name``'s special tokens and chat template, trained on the toy corpus and ``extra``
    (the caller must not change it: it is shared)."""
    return train_family_tokenizer(CHAT_MODELS[name], [*toy_corpus(300), *extra])


def stops(tokenizer, name: str) -> list[int]:
    """The stop tokens a run of ``name`` needs: the eos and the end of turn."""
    return sorted({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(END_OF_TURN[name])})
