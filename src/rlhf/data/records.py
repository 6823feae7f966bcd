"""Validation of records per kind of data — prompts, SFT, preferences — into typed examples.

Each ``validate_*`` function checks every record before any training starts and raises one `DataError`
listing every problem as ``file:line: what is wrong`` (the first 20 of them), e.g.::

    train.jsonl:7: "prompt" must be a non-empty string, got int
    prefs.jsonl:3: missing "rejected" (keys present: prompt, chosen)

Accepted shapes (README, "Data files"):

- prompts: ``{"prompt": str}`` or ``{"messages": [{"role", "content"}, ...]}`` (``"prompt"`` may also be a
  message list, TRL's conversational prompt-only form). Every other key is a *column*, kept and passed to
  reward functions as keyword lists (``reward(prompts=..., completions=..., **columns)``).
- sft: ``{"prompt": str, "response": str}`` or ``{"messages": [...]}`` with at least one assistant message,
  which is not the first message (there must be something to respond to).
- preferences: ``{"prompt": str, "chosen": str, "rejected": str}`` with an optional number ``"margin"``
  (``chosen`` and ``rejected`` must differ); or
  the chat form, ``"chosen"``/``"rejected"`` as message lists (TRL's conversational preference format),
  with the prompt either explicit (``"prompt"``: a message list or a string, read as one user message) or
  implicit (the messages that ``chosen`` and ``rejected`` share at the start).

Roles are ``system``, ``user`` and ``assistant``; ``content`` is a string; other keys of a message are kept
(a chat template may use them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlhf.data.files import ProblemList, Record

ROLES = ("system", "user", "assistant")

Message = dict[str, Any]
"""One chat message: ``{"role": "system" | "user" | "assistant", "content": str, ...}``."""


@dataclass(frozen=True)
class PromptExample:
    """A prompt for generation: plain text (``prompt``) or a conversation (``messages``), never both.

    ``columns`` holds the record's other keys, for reward functions.
    """

    where: str
    prompt: str | None = None
    messages: list[Message] | None = None
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SFTExample:
    """A demonstration: ``prompt`` + ``response`` (plain), or ``messages`` (chat; loss on assistant turns)."""

    where: str
    prompt: str | None = None
    response: str | None = None
    messages: list[Message] | None = None


@dataclass(frozen=True)
class PreferenceExample:
    """A comparison: ``chosen`` is preferred to ``rejected`` as an answer to ``prompt``.

    Plain form: all three are strings. Chat form: ``prompt`` is a message list ending where the answer
    starts, and ``chosen``/``rejected`` are the message lists that follow it (starting with an assistant
    message). ``margin`` (default 0) is how much more ``chosen`` is preferred, for a margin-aware loss.
    """

    where: str
    prompt: str | list[Message]
    chosen: str | list[Message]
    rejected: str | list[Message]
    margin: float = 0.0

    @property
    def is_chat(self) -> bool:
        return isinstance(self.chosen, list)


# ----------------------------------------------------------------------------------------------------------
# Describing what is wrong
# ----------------------------------------------------------------------------------------------------------


def _got(value: Any) -> str:
    """How a wrong value is named in a message: its type, or what is odd about it."""
    if value is None:
        return "null"
    if isinstance(value, str) and not value:
        return "an empty string"
    if isinstance(value, list) and not value:
        return "an empty list"
    return type(value).__name__


def _keys(data: dict[str, Any]) -> str:
    return ", ".join(data) if data else "none"


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


class _Invalid(Exception):
    """Internal: one problem found in one record (message without the location)."""


def _text(data: dict[str, Any], key: str) -> str:
    if key not in data:
        raise _Invalid(f'missing "{key}" (keys present: {_keys(data)})')
    value = data[key]
    if not _is_text(value):
        raise _Invalid(f'"{key}" must be a non-empty string, got {_got(value)}')
    return value


def _messages(value: Any, key: str) -> list[Message]:
    """Check a message list; returns it with each message copied (records are never aliased)."""
    if not isinstance(value, list) or not value:
        raise _Invalid(f'"{key}" must be a non-empty list of {{"role", "content"}} messages, got {_got(value)}')
    out = []
    for i, m in enumerate(value):
        at = f'"{key}"[{i}]'
        if not isinstance(m, dict):
            raise _Invalid(f'{at} must be an object {{"role", "content"}}, got {_got(m)}')
        for k in ("role", "content"):
            if k not in m:
                raise _Invalid(f'{at}: missing "{k}" (keys present: {_keys(m)})')
        if m["role"] not in ROLES:
            raise _Invalid(f'{at}["role"] must be one of {", ".join(ROLES)}, got {m["role"]!r}')
        if not isinstance(m["content"], str):
            raise _Invalid(f'{at}["content"] must be a string, got {_got(m["content"])}')
        out.append(dict(m))
    return out


def _one_of(data: dict[str, Any], a: str, b: str) -> str:
    """Which of two alternative keys the record uses; exactly one must be present."""
    if a in data and b in data:
        raise _Invalid(f'has both "{a}" and "{b}"; use one of them')
    if a not in data and b not in data:
        raise _Invalid(f'missing "{a}" (or "{b}") (keys present: {_keys(data)})')
    return a if a in data else b


# ----------------------------------------------------------------------------------------------------------
# Per kind
# ----------------------------------------------------------------------------------------------------------


def _prompt(r: Record) -> PromptExample:
    data = r.data
    key = _one_of(data, "prompt", "messages")
    columns = {k: v for k, v in data.items() if k != key}
    value = data[key]
    if key == "prompt" and not isinstance(value, list):
        return PromptExample(r.where, prompt=_text(data, "prompt"), columns=columns)
    return PromptExample(r.where, messages=_messages(value, key), columns=columns)


def _sft(r: Record) -> SFTExample:
    data = r.data
    key = _one_of(data, "prompt", "messages")
    if key == "prompt":
        return SFTExample(r.where, prompt=_text(data, "prompt"), response=_text(data, "response"))
    messages = _messages(data["messages"], "messages")
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise _Invalid('"messages" has no assistant message: nothing to train on')
    if roles[0] == "assistant":
        raise _Invalid('"messages"[0] is an assistant message: it answers nothing; start with a system or user one')
    return SFTExample(r.where, messages=messages)


SAME_ANSWER = (
    '"chosen" and "rejected" are the same {what}: the pair says nothing about which answer is better '
    "(its loss is log 2 whatever the model does); fix or drop the row"
)


def _margin(data: dict[str, Any]) -> float:
    if "margin" not in data:
        return 0.0
    m = data["margin"]
    if isinstance(m, bool) or not isinstance(m, int | float):
        raise _Invalid(f'"margin" must be a number, got {_got(m)}')
    if not math.isfinite(m):
        raise _Invalid(f'"margin" must be a finite number, got {m}')
    return float(m)


def _preference(r: Record) -> PreferenceExample:
    data = r.data
    for key in ("chosen", "rejected"):
        if key not in data:
            raise _Invalid(f'missing "{key}" (keys present: {_keys(data)})')
    chosen, rejected = data["chosen"], data["rejected"]
    margin = _margin(data)
    if not isinstance(chosen, list) and not isinstance(rejected, list):
        if isinstance(data.get("prompt"), list):
            raise _Invalid('"prompt" is a message list but "chosen" and "rejected" are strings; use one form')
        prompt = _text(data, "prompt")
        chosen, rejected = _text(data, "chosen"), _text(data, "rejected")
        if chosen == rejected:
            raise _Invalid(SAME_ANSWER.format(what="text"))
        return PreferenceExample(r.where, prompt, chosen, rejected, margin=margin)
    # Chat form.
    if not (isinstance(chosen, list) and isinstance(rejected, list)):
        raise _Invalid(
            f'"chosen" and "rejected" must both be strings or both be message lists, '
            f"got {_got(chosen)} and {_got(rejected)}"
        )
    chosen, rejected = _messages(chosen, "chosen"), _messages(rejected, "rejected")
    if "prompt" in data:
        p = data["prompt"]
        prompt = [{"role": "user", "content": p}] if _is_text(p) else _messages(p, "prompt")
    else:  # implicit prompt: the messages both conversations start with
        n = 0
        while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
            n += 1
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
        if not prompt:
            raise _Invalid('no "prompt", and "chosen" and "rejected" share no leading messages to use as one')
    for key, answer in (("chosen", chosen), ("rejected", rejected)):
        if answer[0]["role"] != "assistant":
            raise _Invalid(f'"{key}": the answer after the prompt must start with an assistant message')
    if chosen == rejected:
        raise _Invalid(SAME_ANSWER.format(what="messages"))
    return PreferenceExample(r.where, prompt, chosen, rejected, margin=margin)


T = TypeVar("T")


def _validate(records: Sequence[Record], check: Callable[[Record], T]) -> list[T]:
    problems = ProblemList()
    out: list[T] = []
    for r in records:
        try:
            out.append(check(r))
        except _Invalid as e:
            problems.add(f"{r.where}: {e}")
    problems.raise_if_any()
    return out


def validate_prompts(records: Sequence[Record]) -> list[PromptExample]:
    """Check prompt records; raises `DataError` listing every bad record."""
    return _validate(records, _prompt)


def validate_sft(records: Sequence[Record]) -> list[SFTExample]:
    """Check SFT records; raises `DataError` listing every bad record."""
    return _validate(records, _sft)


def validate_preferences(records: Sequence[Record]) -> list[PreferenceExample]:
    """Check preference records; raises `DataError` listing every bad record."""
    return _validate(records, _preference)
