"""Reward functions written in Python: ``path/to/file.py:function`` or ``package.module:function``.

Called exactly the way TRL's ``GRPOTrainer._calculate_rewards`` calls its reward functions (TRL 1.16), so users bring
theirs unchanged; the arguments and what they hold are the README's "Reward sources". ``async def`` functions (and
objects with an ``async def __call__``) of a batch run concurrently on one event loop, after the synchronous ones (as
TRL does)."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from typing import Any

from rlhf.rollout.rewards.base import RewardContext, RewardError, RewardLog
from rlhf.rollout.user_code import load_callable, run_coroutine

_SIGNATURE = (
    "function(prompts=..., completions=..., completion_ids=..., trainer_state=..., log_metric=..., "
    "log_extra=..., **columns) -> list[float | None]"
)


class FunctionReward:
    """A Python callable used as a reward source (from a spec string: :meth:`load`). Its signature is checked once,
    here: it must accept ``completions`` or ``completion_ids`` by keyword (or take ``**kwargs``), and have no
    positional-only parameters without defaults."""

    takes_context = True
    """`score` takes ``context`` and ``log`` (see rlhf.rollout.rewards.base)."""

    def __init__(
        self, function: Callable[..., Any], *, name: str | None = None, spec: str | None = None, reasoning: bool = False
    ):
        self.function = function
        self.reasoning = reasoning  # conversational completions carry the trace apart (assistant_message)
        self.name = name or getattr(function, "__name__", None) or type(function).__name__
        self.spec = spec or f"{getattr(function, '__module__', '?')}:{self.name}"
        self.is_async = _is_async(function)
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):  # some builtins have no signature: pass everything
            self.accepts_kwargs, self.parameters, self.required = True, frozenset(), frozenset()
            return
        params = signature.parameters.values()
        self.accepts_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
        keyword = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        self.parameters = frozenset(p.name for p in keyword)
        """Keyword parameters the function declares (``prompts``, ``completions``, … and column names)."""
        self.required = frozenset(p.name for p in keyword if p.default is p.empty)
        positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
        if positional_only:
            raise RewardError(
                f"reward function {self.spec!r}: positional-only parameter(s) {', '.join(positional_only)} "
                f"cannot be passed; it is called as {_SIGNATURE}"
            )
        if not {"completions", "completion_ids"} & self.parameters and not self.accepts_kwargs:
            raise RewardError(
                f"reward function {self.spec!r}{signature} has no `completions` (or `completion_ids`) "
                f"parameter; it is called as {_SIGNATURE}"
            )

    @classmethod
    def load(cls, spec: str, *, name: str | None = None, reasoning: bool = False) -> FunctionReward:
        """The function ``spec`` names, read by `rlhf.rollout.user_code.load_callable` (its forms and errors)."""
        obj = load_callable(spec, "reward", RewardError)
        return cls(obj, name=name or spec.rpartition(":")[2].rsplit(".", 1)[-1], spec=spec, reasoning=reasoning)

    def score(self, *args: Any, **kwargs: Any) -> list[float | None]:
        """Call the function with the keyword arguments it can take (:meth:`arguments`: ``prompts, completions,
        columns, context, log``); an async one runs on the shared loop."""
        result = self.function(**self.arguments(*args, **kwargs))
        return run_coroutine(result) if inspect.isawaitable(result) else result

    async def score_async(self, *args: Any, **kwargs: Any) -> list[float | None]:
        """`score` (same arguments) for an ``async def`` function, awaited on the caller's loop (concurrently)."""
        result = self.function(**self.arguments(*args, **kwargs))
        return await result if inspect.isawaitable(result) else result

    def arguments(
        self,
        prompts: list[str],
        completions: list[str],
        columns: dict[str, list],
        context: RewardContext | None = None,
        log: tuple[Any, Any] | None = None,
    ) -> dict[str, Any]:
        """The keyword arguments of one call: TRL's (:data:`_SIGNATURE`), filtered to what the function takes.
        ``context``: chat prompts, completion ids, trainer state (None: plain prompts and nothing else); ``log``: the
        ``(log_metric, log_extra)`` callbacks (None: calls are accepted and dropped). A column named like a built-in
        argument does not replace it (in TRL it would replace ``trainer_state`` and the callbacks, and clash with
        ``prompts``/``completions``)."""
        context = context or RewardContext()
        log_metric, log_extra = log or RewardLog(len(completions)).callbacks(self.name)
        if context.episodes is not None:  # multi-turn: the opening, and every turn after it (TRL's convention)
            prompts = [copy.deepcopy(episode.messages) for episode in context.episodes]
            completions = [copy.deepcopy(episode.turns) for episode in context.episodes]
        elif context.messages is not None and any(m is not None for m in context.messages):
            prompts = [
                m if m is not None else [{"role": "user", "content": p}]
                for p, m in zip(prompts, context.messages, strict=True)
            ]
            completions = [[assistant_message(c, self.reasoning)] for c in completions]
        kwargs = {
            "prompts": prompts,
            "completions": completions,
            "completion_ids": context.completion_ids,
            "trainer_state": context.trainer_state,
            "log_extra": log_extra,
            "log_metric": log_metric,
        }
        kwargs |= {name: values for name, values in columns.items() if name not in kwargs}
        if context.completion_ids is None:  # scored outside a rollout (e.g. a direct call): no ids to give
            del kwargs["completion_ids"]
        missing = sorted(self.required - kwargs.keys())
        if missing:
            raise RewardError(
                f"reward function {self.spec!r} requires {', '.join(missing)}, which the batch does not "
                f"have; available: {', '.join(kwargs)}"
            )
        if not self.accepts_kwargs:
            kwargs = {key: value for key, value in kwargs.items() if key in self.parameters}
        return kwargs

    def __repr__(self) -> str:
        return f"FunctionReward({self.spec!r}, name={self.name!r})"


def _is_async(function: Callable[..., Any]) -> bool:
    """Whether calling ``function`` returns a coroutine: TRL's ``is_async_callable`` (trl/trainer/utils.py) —
    ``functools.partial`` unwrapped, and a callable object's ``async def __call__`` counts."""
    while isinstance(function, functools.partial):
        function = function.func
    call = type(function).__call__ if callable(function) else None  # an instance's `async def __call__`
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def assistant_message(text: str, reasoning: bool) -> dict[str, Any]:
    """A conversational completion's message. For a policy that writes reasoning traces (``reasoning``: its chat
    template renders ``reasoning_content``, as Qwen3's does), TRL's convention (its GRPO parses completions with
    the Qwen3 response template, ``trl.chat_template_utils``): a completion that opens with ``<think>`` keeps the
    trace in ``reasoning_content`` (left out when empty) and the answer after ``</think>`` in ``content`` (empty
    when the turn was cut inside the trace); any other completion (thinking off) is all content."""
    stripped = text.lstrip()
    if not reasoning or not stripped.startswith("<think>"):
        return {"role": "assistant", "content": text}
    trace, _, answer = stripped.removeprefix("<think>").partition("</think>")
    message = {"role": "assistant", "content": answer.lstrip()}
    return message | ({"reasoning_content": trace.strip()} if trace.strip() else {})
