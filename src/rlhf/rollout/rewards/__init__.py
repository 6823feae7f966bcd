"""Reward sources for ``ppo`` / ``grpo`` (the ``reward:`` config field) and scoring a batch with all of them.

:func:`load_reward_source` picks a source by the spec's form (README, "Reward sources"; the forms and their default
names: docs/architecture.md, "Reward sources"). :func:`load_reward_set` turns the whole ``reward:`` value into a
:class:`RewardSet`, whose :meth:`~RewardSet.score` returns the (B, K) score matrix; combining the columns (weighted sum
or GDPO) is ``rlhf.rollout.scoring``'s job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf.data import chat
from rlhf.rollout.rewards.base import (
    ENVIRONMENT,
    EnvironmentReward,
    RewardContext,
    RewardError,
    RewardLog,
    RewardScores,
    RewardSet,
    RewardSource,
)
from rlhf.rollout.rewards.ensemble import EnsembleReward, is_ensemble
from rlhf.rollout.rewards.function import FunctionReward
from rlhf.rollout.rewards.model import ModelLoader, RewardModelReward
from rlhf.rollout.rewards.remote import HttpReward

_ENTRY_KEYS = ("source", "weight", "name")


def load_reward_source(
    spec: str,
    *,
    name: str | None = None,
    policy_tokenizer: Any = None,
    device: str = "cpu",
    batch_size: int = 16,
    loader: ModelLoader | None = None,
    dtype: str | None = None,
    objective: str = "mean",
    uwo_lambda: float = 0.0,
) -> RewardSource:
    """The reward source ``spec`` names, ``name`` defaulting per the table in docs/architecture.md. ``policy_tokenizer``
    tells a reward function whether the policy writes reasoning traces (its chat template renders ``reasoning_content``:
    conversational completions then carry the trace apart, as TRL's do). The other arguments are for a reward model
    (``RewardModelReward.load``): ``policy_tokenizer`` lets it detect a shared vocabulary (``shares_policy_tokenizer``,
    enabling its ``score_ids`` fast path), ``device`` and ``batch_size`` are where its forwards run and their
    micro-batch size, ``loader`` how its weights load, ``dtype`` the dtype they load in (None: the checkpoint's);
    for a reward-model ensemble (a directory with ``ensemble.json``) ``objective`` and ``uwo_lambda`` combine its
    members (`rlhf.rollout.rewards.ensemble`)."""
    if not isinstance(spec, str) or not spec.strip():
        raise RewardError(f"reward spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec == ENVIRONMENT:
        return EnvironmentReward(name=name or ENVIRONMENT)
    if spec.lower().startswith(("http://", "https://")):
        return HttpReward(spec, name=name)
    model = dict(
        name=name, policy_tokenizer=policy_tokenizer, device=device, batch_size=batch_size, loader=loader, dtype=dtype
    )
    if Path(spec).expanduser().is_dir():
        if is_ensemble(Path(spec).expanduser()):
            return EnsembleReward.load(spec, objective=objective, uwo_lambda=uwo_lambda, **model)
        return RewardModelReward.load(spec, **model)
    if ":" in spec:  # `file.py:function` or `module:function` (hub ids never contain ':')
        return FunctionReward.load(spec, name=name, reasoning=chat.writes_reasoning(policy_tokenizer))
    if spec.endswith(".py"):
        raise RewardError(f"reward spec {spec!r} names a Python file but no function: write `{spec}:function_name`")
    return RewardModelReward.load(spec, **model)


def load_reward_set(reward: str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]], **options: Any) -> RewardSet:
    """A :class:`RewardSet` from the config's ``reward:``: one spec string, or a list of spec strings (weight 1)
    and mappings ``{"source": spec, "weight": float = 1.0, "name": str = default}``; ``options``: the other keyword
    arguments of :func:`load_reward_source`."""
    entries = [reward] if isinstance(reward, str | Mapping) else list(reward)
    if not entries:
        raise ValueError("reward: the list of reward sources is empty")
    sources, weights = [], []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {"source": entry}
        if not isinstance(entry, Mapping):
            raise ValueError(f"reward[{i}]: expected a spec string or a mapping with keys {_ENTRY_KEYS}")
        unknown = sorted(set(entry) - set(_ENTRY_KEYS))
        if unknown:
            raise ValueError(f"reward[{i}]: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(_ENTRY_KEYS)}")
        if "source" not in entry:
            raise ValueError(f"reward[{i}]: missing `source` (a URL, directory, file.py:function or module:function)")
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"reward[{i}]: weight must be a number, got {weight!r}")
        sources.append(load_reward_source(entry["source"], name=entry.get("name"), **options))
        weights.append(float(weight))
    return RewardSet(sources, weights)


def reward_models(source: RewardSource) -> list[RewardModelReward]:
    """The reward models a source holds: itself, an ensemble's members, or none (a function, a URL)."""
    if isinstance(source, EnsembleReward):
        return list(source.members)
    return [source] if isinstance(source, RewardModelReward) else []
