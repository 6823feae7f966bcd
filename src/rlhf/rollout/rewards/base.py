"""The reward-source interface, its error type, and :class:`RewardSet`, which calls every source and checks what comes
back. Notation: B samples (prompt, completion pairs), K reward sources.

A *reward source* has ``name: str`` (its scores are logged as ``reward/<name>/mean``) and
``score(prompts, completions, columns) -> list[float | None]``, ``None`` = could not be scored (NaN in the score matrix,
never silently 0). With ``takes_context = True`` (:class:`~rlhf.rollout.rewards.function.FunctionReward`) ``score`` also
gets ``context=`` a :class:`RewardContext` and ``log=`` its ``(log_metric, log_extra)``, as TRL's ``GRPOTrainer`` gives
reward functions; with ``is_async = True`` it has ``score_async`` (same arguments), and a batch's async sources run
concurrently on one event loop in a daemon thread, as TRL runs ``async def`` ones."""

from __future__ import annotations

import asyncio
import copy
import functools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

from rlhf.rollout.user_code import run_coroutine

_FLOAT32_MAX = torch.finfo(torch.float32).max

EXCERPT_CHARS = 80
"""How many leading characters of a completion an error message quotes."""


class RewardError(RuntimeError):
    """A reward source could not be loaded, failed, or returned something unusable. Messages name the source
    and, when one sample is at fault, its index in the batch and the start of its completion."""


def sample_error(source: str, index: int, completion: str, problem: str) -> RewardError:
    """A :class:`RewardError` about one sample: ``reward 'name', sample 3 (completion 'abc…'): problem``."""
    text = str(completion)
    quoted = repr(text[:EXCERPT_CHARS] + "…") if len(text) > EXCERPT_CHARS else repr(text)
    return RewardError(f"reward {source!r}, sample {index} (completion {quoted}): {problem}")


@runtime_checkable
class RewardSource(Protocol):
    """What the trainers need from a reward source (see the module docstring)."""

    name: str

    def score(self, prompts: list[str], completions: list[str], columns: dict[str, list]) -> list[float | None]: ...


class RewardScores(NamedTuple):
    """What :meth:`RewardSet.score` returns."""

    scores: torch.Tensor
    """(B, K) float32; column k holds source k's scores, NaN where it returned ``None`` (unscored)."""
    names: list[str]
    """K source names, in column order."""
    metrics: dict[str, list[float]] = {}
    """``log_metric`` calls of this batch: ``"<source>/<name>"`` → the values logged, in call order."""
    extra: dict[str, list[Any]] = {}
    """``log_extra`` calls of this batch: ``"<source>/<column>"`` → B values, one per sample."""


@dataclass
class RewardContext:
    """What TRL's ``GRPOTrainer._calculate_rewards`` passes to a reward function besides the prompt texts, completion
    texts and dataset columns; every list has one entry per sample (B). ``messages``: each sample's chat prompt (None
    for a plain-text one), or None for a batch without any; ``completion_ids``: as in the README's "Reward sources";
    ``trainer_state``: a ``TrainerState`` or None; ``episodes``: multi-turn episodes (`rlhf.rollout.episodes.Episode`),
    whose opening messages are the prompts and whose turns (assistant, tool, user…) the completions, as TRL passes them,
    and whose environment rewards the ``environment`` source gives."""

    messages: list[list[dict[str, Any]] | None] | None = None
    completion_ids: list[list[int]] | None = None
    trainer_state: Any = None
    episodes: list[Any] | None = None

    def select(self, rows: list[int]) -> RewardContext:
        """The context of the samples ``rows``, in that order (a rank's shard of a batch, one failing sample)."""

        def take(values: list | None) -> list | None:
            return None if values is None else [values[i] for i in rows]

        return RewardContext(take(self.messages), take(self.completion_ids), self.trainer_state, take(self.episodes))

    def copy(self) -> RewardContext:
        """Deep copies of the per-sample lists (a source that mutates them must not change what the next sees);
        the trainer state is shared, as TRL passes its one ``self.state`` to every function."""
        return RewardContext(
            copy.deepcopy(self.messages), copy.deepcopy(self.completion_ids), self.trainer_state, self.episodes
        )


ENVIRONMENT = "environment"
"""The reward source that is a multi-turn environment's own rewards (``reward.source: environment``)."""


class EnvironmentReward:
    """``reward.source: environment``: each episode's return, the sum of the rewards its environment gave (`step`
    and `get_reward`); None (unscored) for an episode that got none. Only in multi-turn runs."""

    takes_context = True

    def __init__(self, name: str = ENVIRONMENT):
        self.name = name

    def score(self, *batch: Any, context: RewardContext | None = None, log: Any = None) -> list[float | None]:
        """The episodes' returns; the batch's texts and columns (``batch``) are not read."""
        if context is None or context.episodes is None:
            raise RewardError(
                "reward.source 'environment' scores multi-turn episodes; this run has none (set rollout.environment)"
            )
        return [episode.reward for episode in context.episodes]

    def __repr__(self) -> str:
        return f"EnvironmentReward({self.name!r})"


@dataclass
class RewardLog:
    """Collects ``log_metric`` and ``log_extra`` calls of one batch (:attr:`RewardScores.metrics` / ``extra``)."""

    batch: int
    metrics: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, list[Any]] = field(default_factory=dict)

    def callbacks(self, source: str) -> tuple[Callable[[str, float], None], Callable[[str, list], None]]:
        """``(log_metric, log_extra)`` for reward ``source``, with TRL's signatures (``GRPOTrainer._log_metric``
        and ``_log_completion_extra``); names are kept under ``<source>/`` so two sources never mix."""

        def log_metric(name: str, value: float) -> None:
            if not isinstance(name, str) or not name or name in _RESERVED_METRICS:
                raise RewardError(
                    f"reward {source!r}: log_metric name must be a non-empty string other than "
                    f"{' or '.join(_RESERVED_METRICS)} (those are rlhf's own per-source metrics), got {name!r}"
                )
            number = value.item() if hasattr(value, "item") else value  # 0-d tensors and numpy scalars
            if isinstance(number, bool) or not isinstance(number, numbers.Real):
                raise RewardError(
                    f"reward {source!r}: log_metric({name!r}, …) got {value!r}, a {type(value).__name__}; "
                    "it takes one number per call"
                )
            self.metrics.setdefault(f"{source}/{name}", []).append(float(number))

        def log_extra(column: str, values: list) -> None:
            if not isinstance(column, str) or not column:
                raise RewardError(f"reward {source!r}: log_extra column must be a non-empty string, got {column!r}")
            if isinstance(values, str | bytes | Mapping) or not isinstance(values, Sequence):
                raise RewardError(
                    f"reward {source!r}: log_extra({column!r}, …) got a {type(values).__name__}; "
                    f"it takes a list with one value per sample ({self.batch})"
                )
            if len(values) != self.batch:
                raise RewardError(
                    f"reward {source!r}: log_extra({column!r}, …) got {len(values)} values for a batch of "
                    f"{self.batch}; give one value per sample"
                )
            self.extra[f"{source}/{column}"] = list(values)  # a column logged again replaces the first

        return log_metric, log_extra


_RESERVED_METRICS = ("mean", "std")


class RewardSet:
    """K reward sources with their weights and unique names, scored together by :meth:`score`. The weights are
    only validated here: combining the columns (weighted sum, or GDPO, which needs the batch's groups) is
    ``rlhf.rollout.scoring``'s job."""

    def __init__(self, sources: Sequence[RewardSource], weights: Sequence[float] | None = None):
        sources = list(sources)
        if not sources:
            raise ValueError("a RewardSet needs at least one reward source")
        for source in sources:
            if not isinstance(source, RewardSource):
                raise TypeError(
                    f"{source!r} is not a reward source: it needs a `name` and a "
                    "`score(prompts, completions, columns)` method"
                )
        names = [source.name for source in sources]
        for name in names:
            if not isinstance(name, str) or not name or "/" in name or name != name.strip():
                raise ValueError(
                    f"reward name {name!r} is not usable in metric names: give a non-empty name "
                    "without '/' or surrounding spaces (`name:` in the reward config)"
                )
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(
                f"reward names must be unique, {', '.join(map(repr, duplicates))} appear more than once: "
                "set `name:` on the reward entries"
            )
        weights = [1.0] * len(sources) if weights is None else [float(w) for w in weights]
        if len(weights) != len(sources):
            raise ValueError(f"got {len(weights)} weights for {len(sources)} reward sources")
        for name, weight in zip(names, weights, strict=True):
            if not math.isfinite(weight):
                raise ValueError(f"reward {name!r}: weight must be a finite number, got {weight}")
        self.sources = sources
        self.names = names
        self.weights = torch.tensor(weights, dtype=torch.float32)
        """(K,) float32, in column order."""

    def __len__(self) -> int:
        return len(self.sources)

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}×{w:g}" for n, w in zip(self.names, self.weights.tolist(), strict=True))
        return f"RewardSet({parts})"

    def score(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        columns: Mapping[str, Sequence] | None = None,
        token_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
        context: RewardContext | None = None,
    ) -> RewardScores:
        """Call every source on the batch and stack the validated scores into a (B, K) :class:`RewardScores`.
        ``prompts``: B texts as the policy saw them (chat template applied); ``completions``: B texts decoded without
        special tokens; ``columns``: extra dataset columns, B values each; ``context`` None: plain-text prompts, no
        completion ids, no trainer state. ``token_ids``: the policy's ``(query ⊕ response ids, attention mask)``, both
        (B, L), which a reward model sharing the policy's tokenizer scores as they are (``score_ids``: no decode and
        re-encode, docs/architecture.md, "Reward sources"). Raises :class:`RewardError` when a source raises (the sample
        whose scoring fails on its own is located and named) or returns a non-list, the wrong number of scores, a
        non-number, NaN or ±inf."""
        sources, prompts, completions = self.sources, list(prompts), list(completions)
        batch = len(completions)
        if len(prompts) != batch:
            raise ValueError(f"got {len(prompts)} prompts for {batch} completions")
        columns = {key: list(values) for key, values in (columns or {}).items()}
        for key, values in columns.items():
            if len(values) != batch:
                raise ValueError(f"column {key!r} has {len(values)} values for {batch} completions")
        context = context or RewardContext()
        for what, values in (("messages", context.messages), ("completion_ids", context.completion_ids)):
            if values is not None and len(values) != batch:
                raise ValueError(f"context {what} has {len(values)} entries for {batch} completions")

        log = RewardLog(batch)
        scores = torch.full((batch, len(sources)), float("nan"), dtype=torch.float32)
        concurrent = [k for k, source in enumerate(sources) if batch and getattr(source, "is_async", False)]
        for k, source in enumerate(sources):
            if not batch or k in concurrent:  # async sources run together after the others, as TRL does
                continue
            if token_ids is not None and getattr(source, "shares_policy_tokenizer", False):
                logs = {"log": log.callbacks(source.name)} if getattr(source, "takes_context", False) else {}
                scores[:, k] = _validate(source.name, source.score_ids(*token_ids, **logs).cpu(), completions)
            else:
                call = _arguments(source, prompts, completions, columns, context, log)
                scores[:, k] = _validate(source.name, _call(source, call, source.score), completions)
        if concurrent:
            calls = [_arguments(sources[k], prompts, completions, columns, context, log) for k in concurrent]
            results = run_coroutine(_gather([sources[k] for k in concurrent], calls))
            for k, call, result in zip(concurrent, calls, results, strict=True):
                raw = _call(sources[k], call, functools.partial(_reraise, result))
                scores[:, k] = _validate(sources[k].name, raw, completions)
        return RewardScores(scores, list(self.names), log.metrics, log.extra)


Call = tuple[tuple[list[str], list[str], dict[str, list]], dict[str, Any]]
"""A source's ``score`` arguments: ``((prompts, completions, columns), {"context": …, "log": …})``."""


def _arguments(
    source: RewardSource,
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list],
    context: RewardContext,
    log: RewardLog,
) -> Call:
    """Fresh copies of the batch for one source (a source that mutates its arguments must not change what the
    next one sees), with its context and logging callbacks when it takes them."""
    positional = (list(prompts), list(completions), {c: list(v) for c, v in columns.items()})
    if not getattr(source, "takes_context", False):
        return positional, {}
    return positional, {"context": context.copy(), "log": log.callbacks(source.name)}


def _call(source: RewardSource, call: Call, run: Callable[..., Any]) -> Any:
    """``run(*positional, **keywords)`` of ``call``. Another exception than a RewardError is traced to a sample:
    the batch is re-scored one sample at a time (``source.score``: an async one on the shared loop; no logging)
    to find the first that fails on its own (a user function choking on one odd completion is the common case)."""
    try:
        return run(*call[0], **call[1])
    except RewardError:
        raise
    except Exception as batch_error:
        (prompts, completions, columns), keywords = call
        for i, completion in enumerate(completions):
            single = {}
            if "context" in keywords:  # what this sample logs is thrown away: the batch fails anyway
                single = {"context": keywords["context"].select([i]), "log": RewardLog(1).callbacks(source.name)}
            try:
                source.score([prompts[i]], [completion], {c: [v[i]] for c, v in columns.items()}, **single)
            except Exception as error:
                raise sample_error(source.name, i, completion, f"raised {type(error).__name__}: {error}") from error
        raise RewardError(
            f"reward {source.name!r} raised {type(batch_error).__name__}: {batch_error} on a batch of "
            f"{len(completions)}, but every sample scores fine alone"
        ) from batch_error


def _reraise(result: Any, *call: Any, **keywords: Any) -> Any:
    """The outcome of a call already made (by :func:`_gather`): its value, or its exception raised again."""
    if isinstance(result, BaseException):
        raise result
    return result


async def _gather(sources: list[RewardSource], calls: list[Call]) -> list[Any]:
    """Every async source's ``score_async`` at once (TRL: ``asyncio.gather`` of the async reward functions);
    each result is its scores or the exception it raised."""

    async def kept(source: RewardSource, call: Call) -> Any:
        try:
            return await source.score_async(*call[0], **call[1])
        except Exception as error:  # kept, so the other sources' results still arrive
            return error

    return await asyncio.gather(*(kept(s, c) for s, c in zip(sources, calls, strict=True)))


def _validate(name: str, raw: Any, completions: list[str]) -> torch.Tensor:
    """(B,) float32 from a source's reply: ``None`` → NaN; anything else must be a finite real number."""
    if hasattr(raw, "tolist"):  # a 1-D tensor or numpy array is accepted as the list it holds
        raw = raw.tolist()
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Sequence):
        raise RewardError(f"reward {name!r} returned {type(raw).__name__}, expected a list of floats")
    if len(raw) != len(completions):
        raise RewardError(f"reward {name!r} returned {len(raw)} scores for {len(completions)} completions")
    values = []
    for i, value in enumerate(raw):
        if value is None:
            values.append(float("nan"))
            continue
        # bool is an int: True/False score as 1/0. numbers.Real also admits numpy scalars.
        if not isinstance(value, numbers.Real):
            raise sample_error(name, i, completions[i], f"score {value!r} is a {type(value).__name__}, not a number")
        value = float(value)
        if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:  # the latter would become inf in the matrix
            raise sample_error(
                name, i, completions[i], f"score is {value} (return None for a sample that cannot be scored)"
            )
        values.append(value)
    return torch.tensor(values, dtype=torch.float32)
