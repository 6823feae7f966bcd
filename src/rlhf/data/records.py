"""Validation of records per kind of data — prompts, SFT, preferences — into typed examples.

Each ``validate_*`` function checks every record before any training starts and raises one `DataError` listing
every problem as ``file:line: what is wrong`` (e.g. ``prefs.jsonl:3: missing "rejected" (keys present: prompt,
chosen)``). The shapes, chat forms and roles: the README's "Data files". A prompt's keys other than its text are
*columns*, passed to reward functions as keyword lists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlhf.data.files import Problem, ProblemList, Record

ROLES = ("system", "user", "assistant", "tool")

Message = dict[str, Any]
"""One chat message (the OpenAI/Hugging Face schema): ``{"role": "system" | "user" | "assistant" | "tool",
"content": str, ...}``; an assistant message may carry ``tool_calls`` (``[{"type": "function", "function": {"name",
"arguments"}, "id"?}]``, content then "" or null), a tool message its result as content (and ``name``,
``tool_call_id``)."""


@dataclass(frozen=True)
class PromptExample:
    """A prompt for generation: plain text (``prompt``) or a conversation (``messages``), never both;
    ``columns`` holds the record's other keys, for reward functions."""

    where: str
    prompt: str | None = None
    messages: list[Message] | None = None
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SFTExample:
    """A demonstration: ``prompt`` + ``response`` (plain), or ``messages`` (chat; loss on assistant turns, their
    tool calls included), with ``tools``: the JSON schemas the chat template shows (TRL's ``tools`` column)."""

    where: str
    prompt: str | None = None
    response: str | None = None
    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class PreferenceExample:
    """A comparison: ``chosen`` is preferred to ``rejected`` as an answer to ``prompt``. Plain form: all three are
    strings. Chat form: ``prompt`` is a message list ending where the answer starts, and ``chosen``/``rejected`` are the
    message lists that follow it (starting with an assistant message). ``margin`` (default 0) is how much more
    ``chosen`` is preferred, for a margin-aware loss."""

    where: str
    prompt: str | list[Message]
    chosen: str | list[Message]
    rejected: str | list[Message]
    margin: float = 0.0

    @property
    def is_chat(self) -> bool:
        return isinstance(self.chosen, list)


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


def _get(data: dict[str, Any], key: str) -> Any:
    if key not in data:
        raise Problem(f'missing "{key}" (keys present: {_keys(data)})')
    return data[key]


def _text(data: dict[str, Any], key: str) -> str:
    value = _get(data, key)
    if not _is_text(value):
        raise Problem(f'"{key}" must be a non-empty string, got {_got(value)}')
    return value


def _messages(value: Any, key: str) -> list[Message]:
    """Check a message list; returns it with each message copied (records are never aliased)."""
    if not isinstance(value, list) or not value:
        raise Problem(f'"{key}" must be a non-empty list of {{"role", "content"}} messages, got {_got(value)}')
    out = []
    for i, m in enumerate(value):
        at = f'"{key}"[{i}]'
        if not isinstance(m, dict):
            raise Problem(f'{at} must be an object {{"role", "content"}}, got {_got(m)}')
        calls = m.get("tool_calls")
        if calls is not None:
            _tool_calls(calls, at, m.get("role"))
            m = {**m, "content": m.get("content") or ""}  # OpenAI's null content beside tool calls
        for k in ("role", "content"):
            if k not in m:
                raise Problem(f'{at}: missing "{k}" (keys present: {_keys(m)})')
        if m["role"] not in ROLES:
            raise Problem(f'{at}["role"] must be one of {", ".join(ROLES)}, got {m["role"]!r}')
        if not isinstance(m["content"], str):
            raise Problem(f'{at}["content"] must be a string, got {_got(m["content"])}')
        out.append(dict(m))
    return out


def _tool_calls(calls: Any, at: str, role: Any) -> None:
    """Check an assistant message's ``tool_calls`` (the OpenAI/Hugging Face schema)."""
    if role != "assistant":
        raise Problem(f'{at}: only an assistant message has "tool_calls", not a {role!r} one')
    if not isinstance(calls, list) or not calls:
        raise Problem(f'{at}["tool_calls"] must be a non-empty list of calls, got {_got(calls)}')
    for j, call in enumerate(calls):
        where = f'{at}["tool_calls"][{j}]'
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not _is_text(function.get("name")):
            raise Problem(f'{where} must be {{"type": "function", "function": {{"name": str, "arguments": {{...}}}}}}')
        if not isinstance(function.get("arguments", {}), dict | str):
            raise Problem(f'{where}["function"]["arguments"] must be an object (or its JSON text)')


def _one_of(data: dict[str, Any], a: str, b: str) -> str:
    """Which of two alternative keys the record uses; exactly one must be present."""
    if a in data and b in data:
        raise Problem(f'has both "{a}" and "{b}"; use one of them')
    if a not in data and b not in data:
        raise Problem(f'missing "{a}" (or "{b}") (keys present: {_keys(data)})')
    return a if a in data else b


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
        raise Problem('"messages" has no assistant message: nothing to train on')
    if roles[0] == "assistant":
        raise Problem('"messages"[0] is an assistant message: it answers nothing; start with a system or user one')
    tools = data.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise Problem(f'"tools" must be a list of JSON schemas (objects), got {_got(tools)}')
    return SFTExample(r.where, messages=messages, tools=tools or None)


def _margin(data: dict[str, Any]) -> float:
    if "margin" not in data:
        return 0.0
    m = data["margin"]
    if isinstance(m, bool) or not isinstance(m, int | float):
        raise Problem(f'"margin" must be a number, got {_got(m)}')
    if not math.isfinite(m):
        raise Problem(f'"margin" must be a finite number, got {m}')
    return float(m)


def _preference(r: Record) -> PreferenceExample:
    data = r.data
    chosen, rejected = _get(data, "chosen"), _get(data, "rejected")
    margin = _margin(data)
    if not isinstance(chosen, list) and not isinstance(rejected, list):
        if isinstance(data.get("prompt"), list):
            raise Problem('"prompt" is a message list but "chosen" and "rejected" are strings; use one form')
        prompt, chosen, rejected = (_text(data, key) for key in ("prompt", "chosen", "rejected"))
    elif not (isinstance(chosen, list) and isinstance(rejected, list)):
        raise Problem(
            f'"chosen" and "rejected" must both be strings or both be message lists, '
            f"got {_got(chosen)} and {_got(rejected)}"
        )
    else:  # chat form
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
                raise Problem('no "prompt", and "chosen" and "rejected" share no leading messages to use as one')
        for key, answer in (("chosen", chosen), ("rejected", rejected)):
            if answer[0]["role"] != "assistant":
                raise Problem(f'"{key}": the answer after the prompt must start with an assistant message')
    if chosen == rejected:
        raise Problem(
            f'"chosen" and "rejected" are the same {"messages" if isinstance(chosen, list) else "text"}: the pair '
            "says nothing about which answer is better (its loss is log 2 whatever the model does); fix or drop the row"
        )
    return PreferenceExample(r.where, prompt, chosen, rejected, margin=margin)


def _ranking_order(ranking: Any, k: int) -> list[list[int]]:
    """The tiers of a ``"ranking"`` over ``k`` completions, best first: each entry an index, or a list of indices
    that tie. Every index from 0 to k − 1 exactly once."""
    if not isinstance(ranking, list) or len(ranking) < 2:
        raise Problem(
            f'"ranking" must list the completions\' indices, best first, in at least 2 places (a list of indices ties '
            f"them), got {_got(ranking)}"
        )
    tiers: list[list[int]] = []
    for entry in ranking:
        tier = entry if isinstance(entry, list) else [entry]
        if not tier or any(isinstance(i, bool) or not isinstance(i, int) for i in tier):
            raise Problem(
                f'"ranking" entries are indices or lists of tied indices (e.g. [2, [0, 3], 1]), got {_got(entry)}'
            )
        tiers.append(tier)
    named = [i for tier in tiers for i in tier]
    if bad := sorted({i for i in named if not 0 <= i < k}):
        raise Problem(f'"ranking" names {bad} but "completions" has {k} (indices 0 to {k - 1})')
    if repeated := sorted({i for i in named if named.count(i) > 1}):
        raise Problem(f'"ranking" names {repeated} more than once')
    if missing := sorted(set(range(k)) - set(named)):
        raise Problem(f'"ranking" leaves out {missing}: rank every completion (tied ones in one list)')
    return tiers


def _ranking(r: Record) -> list[PreferenceExample]:
    """A ranking row, ``{"prompt", "completions": [...], "ranking": [best, ..., worst]}``, as its C(k,2) pairs (less
    the pairs within a tie), best answer first in the ranking's order: every answer is preferred to each one ranked
    below it."""
    data = r.data
    completions = _get(data, "completions")
    if not isinstance(completions, list) or len(completions) < 2:
        raise Problem(f'"completions" must be a list of at least 2 answers, got {_got(completions)}')
    if "margin" in data:
        raise Problem('"margin" applies to a pair, not to a ranking; drop it or write the pairs')
    tiers = _ranking_order(_get(data, "ranking"), len(completions))
    ordered = [(i, j) for t, better in enumerate(tiers) for worse in tiers[t + 1 :] for i in better for j in worse]
    prompt = {"prompt": data["prompt"]} if data.get("prompt") is not None else {}  # absent: implicit (chat form)
    pairs = []
    for i, j in ordered:
        try:
            pairs.append(_preference(Record({**prompt, "chosen": completions[i], "rejected": completions[j]}, r.where)))
        except Problem as problem:
            raise Problem(f"completions {i} and {j}: {problem}") from None
    return pairs


def _preferences(r: Record) -> list[PreferenceExample]:
    """A preference row: one pair, or a ranking (:func:`_ranking`) as its pairs."""
    if "ranking" in r.data or "completions" in r.data:
        return _ranking(r)
    return [_preference(r)]


T = TypeVar("T")


def _validate(records: Sequence[Record], check: Callable[[Record], T]) -> list[T]:
    problems = ProblemList()
    out: list[T] = []
    for r in records:
        with problems.at(r.where):
            out.append(check(r))
    problems.raise_if_any()
    return out


def validate_prompts(records: Sequence[Record]) -> list[PromptExample]:
    """Check prompt records; raises `DataError` listing every bad record."""
    return _validate(records, _prompt)


def validate_sft(records: Sequence[Record]) -> list[SFTExample]:
    """Check SFT records; raises `DataError` listing every bad record."""
    return _validate(records, _sft)


def validate_preferences(records: Sequence[Record]) -> list[PreferenceExample]:
    """Check preference records, pairs and rankings (each ranking as its pairs, in the file's order); raises
    `DataError` listing every bad record."""
    return [pair for pairs in _validate(records, _preferences) for pair in pairs]
