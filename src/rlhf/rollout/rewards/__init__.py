"""Reward sources for ``ppo`` / ``grpo`` (the ``reward:`` config field) and scoring a batch with all of them.

Spec forms accepted by :func:`load_reward_source` (README, "Reward sources"):

=================================================  ===============================  =====================
spec                                               source                           default name
=================================================  ===============================  =====================
``http://host:port/path``, ``https://…``            :class:`HttpReward`              the URL's host
an existing directory                              :class:`RewardModelReward`       directory's basename
``path/to/file.py:function``                       :class:`FunctionReward`          the function's name
``package.module:function``                        :class:`FunctionReward`          the function's name
anything else without ``:`` (e.g. ``org/model``)   :class:`RewardModelReward`       the id's last part
=================================================  ===============================  =====================

:func:`load_reward_set` turns the whole ``reward:`` value — one spec, or a list of specs and
``{source, weight, name}`` entries — into a :class:`RewardSet`; :meth:`RewardSet.score` (or
:func:`score_all`) returns the (B, K) score matrix with NaN for unscored samples, the names, the time
each source took and what reward functions logged (``log_metric`` / ``log_extra``); a
:class:`RewardContext` carries what TRL's convention adds for reward functions (chat prompts, completion
ids, trainer state). Combining the columns (weighted sum or GDPO) is done by the trainer with ``rlhf.core``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf.rollout.rewards.base import (
    RewardContext,
    RewardError,
    RewardLog,
    RewardScores,
    RewardSet,
    RewardSource,
    score_all,
)
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
) -> RewardSource:
    """The reward source a spec string names (table in the module docstring).

    Args:
        spec: URL, directory, hub id, ``file.py:function`` or ``module:function``.
        name: metric name; defaults per the table.
        policy_tokenizer: the policy's tokenizer; lets a reward model detect a shared vocabulary
            (``shares_policy_tokenizer``, enabling its ``score_ids`` fast path).
        device, batch_size: reward model only — where its forwards run and their micro-batch size.
        loader: reward model only — how its weights are put in memory (``RewardModelReward.load``).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise RewardError(f"reward spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec.lower().startswith(("http://", "https://")):
        return HttpReward(spec, name=name)
    model_kwargs = {
        "name": name,
        "policy_tokenizer": policy_tokenizer,
        "device": device,
        "batch_size": batch_size,
        "loader": loader,
    }
    if Path(spec).expanduser().is_dir():
        return RewardModelReward.load(spec, **model_kwargs)
    if ":" in spec:  # `file.py:function` or `module:function` (hub ids never contain ':')
        return FunctionReward.load(spec, name=name)
    if spec.endswith(".py"):
        raise RewardError(f"reward spec {spec!r} names a Python file but no function: write `{spec}:function_name`")
    return RewardModelReward.load(spec, **model_kwargs)


def load_reward_set(
    reward: str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]],
    *,
    policy_tokenizer: Any = None,
    device: str = "cpu",
    batch_size: int = 16,
    loader: ModelLoader | None = None,
) -> RewardSet:
    """A :class:`RewardSet` from the config's ``reward:`` value.

    ``reward`` is one spec string, or a list whose items are spec strings (weight 1) or mappings
    ``{"source": spec, "weight": float = 1.0, "name": str = default}``. Names must come out unique.
    The other arguments are :func:`load_reward_source`'s.
    """
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
        sources.append(
            load_reward_source(
                entry["source"],
                name=entry.get("name"),
                policy_tokenizer=policy_tokenizer,
                device=device,
                batch_size=batch_size,
                loader=loader,
            )
        )
        weights.append(float(weight))
    return RewardSet(sources, weights)


__all__ = [
    "FunctionReward",
    "HttpReward",
    "ModelLoader",
    "RewardContext",
    "RewardError",
    "RewardLog",
    "RewardModelReward",
    "RewardScores",
    "RewardSet",
    "RewardSource",
    "load_reward_set",
    "load_reward_source",
    "score_all",
]
