"""Built-in verifiable rewards, used by name as ``reward: rlhf.rollout.verifiers:<function>`` (README, "GRPO").

Each follows TRL's reward-function convention (``rlhf.rollout.rewards.function``): ``fn(prompts, completions,
**columns) -> list[float | None]``, one value per completion, ``None`` = cannot score this one (NaN: advantage
0). A completion is a string, or for chat prompts TRL's ``[{"role": "assistant", "content": text}]``: both
work. The dataset column each function reads is its keyword parameter. Weighting them, and another pattern for
every row: docs/architecture.md, "Reward sources".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

DEFAULT_FORMAT = r"<think>.*?</think>\s*<answer>.*?</answer>"
"""DeepSeek-R1's format reward: reasoning in ``<think>`` tags, then the answer in ``<answer>`` tags."""

LENGTH_SCALE = 1000.0
"""Characters per unit of length penalty."""

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None  # unbalanced: the completion was cut inside the box


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (``-3``, ``1,234``, ``0.5``, ``3/4``), or None."""
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def extract_answer(completion: str) -> str | None:
    """The answer of a completion: the last ``\\boxed{}`` content, else the last number."""
    boxed = last_boxed(completion)
    return boxed if boxed is not None else last_number(completion)


def _as_number(text: str) -> Fraction | None:
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str | None, reference: Any) -> bool:
    """Equal as numbers when both parse (``"1,000" == 1000``, ``"0.50" == "1/2"``), else as stripped text."""
    if predicted is None:
        return False
    reference = str(reference).strip()
    boxed = last_boxed(reference)  # references written as "...\\boxed{42}" compare by their box
    reference = boxed if boxed is not None else reference.rpartition("####")[2].strip()  # GSM8K "... #### 42"
    a, b = _as_number(predicted), _as_number(reference)
    if a is not None and b is not None:
        return a == b
    return predicted.strip() == reference


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The text of a completion: the string itself, or what the model wrote in a conversational completion (TRL
    reads ``completion[0]["content"]``): its assistant messages, one after another — a multi-turn episode's turns
    without the tool results and replies between them — each with its reasoning trace (``reasoning_content``, a
    reasoning model's) back in its ``<think>`` block, as the model wrote it."""
    if isinstance(completion, str):
        return completion
    own = [m for m in completion if m.get("role", "assistant") == "assistant"]
    return "\n".join(_written(message) for message in own)


def _written(message: dict[str, Any]) -> str:
    trace = message.get("reasoning_content")
    content = str(message.get("content") or "")
    return f"<think>\n{trace}\n</think>\n\n{content}" if trace else content


def answer_text(completion: str | list[dict[str, Any]]) -> str:
    """The answer of a completion without its reasoning: a conversational one's ``content`` (TRL's convention
    keeps a reasoning model's trace in ``reasoning_content``), and in any text what follows the last
    ``</think>`` (a trace the model wrote inline). What the verifiers judge."""
    if isinstance(completion, str):
        return completion.rpartition("</think>")[2]
    own = [m for m in completion if m.get("role", "assistant") == "assistant"]
    return "\n".join(str(m.get("content") or "").rpartition("</think>")[2] for m in own)


def exact_match(completions: list[str], answer: Sequence[Any] | None = None, **columns: Any) -> list[float | None]:
    """1.0 when the completion's answer (last ``\\boxed{}``, else last number, after any reasoning trace:
    :func:`answer_text`) equals ``answer`` (the reference's box or GSM8K ``#### x`` tail when it has one), else 0.0; None for a row without an answer (its column value
    is None, or the dataset has no ``answer`` column)."""
    if answer is None:
        return [None] * len(completions)
    return [
        None if ref is None else float(answers_match(extract_answer(answer_text(c)), ref))
        for c, ref in zip(completions, answer, strict=True)
    ]


def format_regex(
    completions: list[str], format_pattern: Sequence[str | None] | None = None, **columns: Any
) -> list[float]:
    """1.0 when the whole completion (stripped) matches the row's ``format_pattern`` (``re.fullmatch`` with
    DOTALL), else 0.0; rows without a pattern use :data:`DEFAULT_FORMAT`."""
    patterns = format_pattern if format_pattern is not None else [None] * len(completions)
    return [
        float(re.fullmatch(p or DEFAULT_FORMAT, completion_text(c).strip(), flags=re.DOTALL) is not None)
        for c, p in zip(completions, patterns, strict=True)
    ]


def length_penalty(
    completions: list[str], target_length: Sequence[int | None] | None = None, **columns: Any
) -> list[float]:
    """``−|len(c) − target| / 1000`` in characters; target = the row's ``target_length``, else 0 (shorter is
    better). A soft pressure to add with a small weight next to a task reward."""
    targets = target_length if target_length is not None else [None] * len(completions)
    lengths = [len(completion_text(c)) for c in completions]
    return [-abs(n - (t or 0)) / LENGTH_SCALE for n, t in zip(lengths, targets, strict=True)]
