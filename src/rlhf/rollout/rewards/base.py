"""The reward-source interface, its error type, and :func:`score_all`, which calls every source and checks
what comes back.

Notation: B samples (prompt, completion pairs), K reward sources.

A *reward source* is any object with

* ``name: str`` — the name its scores are logged under (``reward/<name>/mean``), and
* ``score(prompts, completions, columns) -> list[float | None]`` — one score per sample, ``None`` meaning
  "could not be scored" (kept as NaN in the score matrix, never silently turned into 0).

The three built-in sources live in sibling modules: :class:`~rlhf.rollout.rewards.function.FunctionReward`,
:class:`~rlhf.rollout.rewards.remote.HttpReward` and
:class:`~rlhf.rollout.rewards.model.RewardModelReward` (which also offers a token fast path, ``score_ids``).
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

_FLOAT32_MAX = torch.finfo(torch.float32).max

EXCERPT_CHARS = 80
"""How many leading characters of a completion an error message quotes."""


class RewardError(RuntimeError):
    """A reward source could not be loaded, failed, or returned something unusable.

    Messages name the source and, when one sample is at fault, its index in the batch and the first
    :data:`EXCERPT_CHARS` characters of its completion.
    """


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``repr`` of the first ``limit`` characters of ``text`` (``…`` marks a cut), for error messages."""
    text = str(text)
    return repr(text[:limit] + "…") if len(text) > limit else repr(text)


def sample_error(source: str, index: int, completion: str, problem: str) -> RewardError:
    """A :class:`RewardError` about one sample: ``reward 'name', sample 3 (completion 'abc…'): problem``."""
    return RewardError(f"reward {source!r}, sample {index} (completion {excerpt(completion)}): {problem}")


@runtime_checkable
class RewardSource(Protocol):
    """What the trainers need from a reward source (see the module docstring)."""

    name: str

    def score(
        self, prompts: list[str], completions: list[str], columns: dict[str, list]
    ) -> list[float | None]: ...


class RewardScores(NamedTuple):
    """What :func:`score_all` returns."""

    scores: torch.Tensor
    """(B, K) float32; column k holds source k's scores, NaN where it returned ``None`` (unscored)."""
    names: list[str]
    """K source names, in column order."""
    seconds: list[float]
    """K wall-clock times (s) spent in each source's ``score``, for ``time/`` metrics."""


class RewardSet:
    """K reward sources with their weights and unique names, scored together by :meth:`score`.

    The weights are only stored and validated here: combining the columns (weighted sum, or GDPO) is the
    trainer's job, with ``rlhf.core``, because GDPO needs the group structure of the batch.
    """

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
    ) -> RewardScores:
        """Score every sample with every source; see :func:`score_all`.

        ``token_ids``: the policy's ``(query ⊕ response ids, attention mask)``, both (B, L). A reward model
        that reads the policy's tokens (``shares_policy_tokenizer``) then scores exactly those tokens through
        ``score_ids``: no decode and re-encode, which can split a sampled text into other, often more, tokens
        (measured: 217 instead of 139 for 128 sampled tokens of the benchmark's model) and costs time.
        """
        return _score(self.sources, prompts, completions, columns, token_ids)


def score_all(
    sources: Sequence[RewardSource],
    weights: Sequence[float] | None,
    prompts: Sequence[str],
    completions: Sequence[str],
    columns: Mapping[str, Sequence] | None = None,
) -> RewardScores:
    """Call every source on the batch and stack the validated scores into a (B, K) matrix.

    Args:
        sources: K reward sources with unique names.
        weights: K weights, only validated here (finite, one per source); ``None`` = all 1.
        prompts: B prompt texts (as the policy saw them, chat template applied).
        completions: B completion texts (decoded without special tokens).
        columns: extra dataset columns, each a list of B values, passed to every source.

    Returns:
        :class:`RewardScores` — ``scores`` (B, K) float32 with NaN where a source returned ``None``,
        ``names`` (K,) and per-source wall ``seconds`` (K,).

    Raises:
        RewardError: a source raised (the sample whose scoring fails on its own is located and named), or
            returned a non-list, the wrong number of scores, a non-number, NaN or ±inf.
    """
    return RewardSet(sources, weights).score(prompts, completions, columns)


def _score(
    sources: Sequence[RewardSource],
    prompts: Sequence[str],
    completions: Sequence[str],
    columns: Mapping[str, Sequence] | None,
    token_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> RewardScores:
    prompts, completions = list(prompts), list(completions)
    batch = len(completions)
    if len(prompts) != batch:
        raise ValueError(f"got {len(prompts)} prompts for {batch} completions")
    columns = {key: list(values) for key, values in (columns or {}).items()}
    for key, values in columns.items():
        if len(values) != batch:
            raise ValueError(f"column {key!r} has {len(values)} values for {batch} completions")

    scores = torch.full((batch, len(sources)), float("nan"), dtype=torch.float32)
    seconds = []
    for k, source in enumerate(sources):
        start = time.perf_counter()
        if batch and token_ids is not None and getattr(source, "shares_policy_tokenizer", False):
            scores[:, k] = _validate(source.name, source.score_ids(*token_ids).cpu(), completions)
        elif batch:
            # copies: a source that mutates its arguments must not change what the next one sees
            raw = _call(source, list(prompts), list(completions), {c: list(v) for c, v in columns.items()})
            scores[:, k] = _validate(source.name, raw, completions)
        seconds.append(time.perf_counter() - start)
    return RewardScores(scores, [s.name for s in sources], seconds)


def _call(source: RewardSource, prompts: list[str], completions: list[str], columns: dict[str, list]) -> Any:
    """``source.score(...)``; an exception that is not already a RewardError is traced to a sample.

    The batch is re-scored one sample at a time to find the first sample that fails on its own, so the
    error can name it (a user function that chokes on one odd completion is the common case).
    """
    try:
        return source.score(prompts, completions, columns)
    except RewardError:
        raise
    except Exception as batch_error:
        for i, completion in enumerate(completions):
            try:
                source.score([prompts[i]], [completion], {c: [v[i]] for c, v in columns.items()})
            except Exception as error:
                raise sample_error(
                    source.name, i, completion, f"raised {type(error).__name__}: {error}"
                ) from error
        raise RewardError(
            f"reward {source.name!r} raised {type(batch_error).__name__}: {batch_error} on a batch of "
            f"{len(completions)}, but every sample scores fine alone"
        ) from batch_error


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
            raise sample_error(
                name, i, completions[i], f"score {value!r} is a {type(value).__name__}, not a number"
            )
        value = float(value)
        if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:  # the latter would become inf in the matrix
            raise sample_error(
                name, i, completions[i], f"score is {value} (return None for a sample that cannot be scored)"
            )
        values.append(value)
    return torch.tensor(values, dtype=torch.float32)
