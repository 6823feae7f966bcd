"""Chat-template arguments (``data.chat_template_kwargs``, TRL's name): extra variables every render of a run's
chat template gets, such as Qwen3's ``enable_thinking``.

They live on the tokenizer, in ``tokenizer.init_kwargs["chat_template_kwargs"]``: one setting per run reaches
every render (SFT labels, preference pairs, prompts, episode deltas, the reward model's re-render) without being
passed down each call, and ``save_pretrained`` writes them into the saved ``tokenizer_config.json``, so a model
trained with ``enable_thinking: false`` is sampled and evaluated that way by ``rlhf sample`` / ``rlhf eval`` (and
an ``AutoTokenizer`` loads them back into ``init_kwargs``). ``transformers`` itself does not read them when
rendering: :func:`render` passes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KEY = "chat_template_kwargs"
"""The key in ``tokenizer.init_kwargs`` and tokenizer_config.json."""

RESERVED = frozenset({"messages", "conversation", "tools", "documents", "add_generation_prompt", "tokenize"})
"""Arguments of ``apply_chat_template`` itself, which a template argument cannot replace."""


def template_kwargs(tokenizer: Any) -> dict[str, Any]:
    """The template arguments ``tokenizer`` carries (none: ``{}``)."""
    return dict((getattr(tokenizer, "init_kwargs", None) or {}).get(KEY) or {})


def set_template_kwargs(tokenizer: Any, kwargs: Mapping[str, Any] | None) -> None:
    """Give ``tokenizer`` the template arguments ``kwargs``; None keeps those it was saved with (a model trained by
    rlhf with them), ``{}`` renders with the template's defaults."""
    if kwargs is None:
        return
    clash = sorted(RESERVED & kwargs.keys())
    if clash:
        raise ValueError(
            f"chat_template_kwargs: {', '.join(clash)} {'is an argument' if len(clash) == 1 else 'are arguments'} "
            "of apply_chat_template itself, which rlhf sets; use template variables only (e.g. enable_thinking)"
        )
    tokenizer.init_kwargs[KEY] = dict(kwargs)


def render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The chat template's text for ``messages`` with the tokenizer's template arguments (and ``tools``' schemas)."""
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs(tokenizer)
    )


def writes_reasoning(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template renders an assistant message's ``reasoning_content`` (Qwen3, and the
    reasoning models that follow transformers' message schema): its model writes traces in ``<think>`` blocks."""
    return "reasoning_content" in (getattr(tokenizer, "chat_template", None) or "")
