"""A reward-model ensemble as one reward source: M reward models trained alike but for their seeds, their normalised
scores combined by a conservative objective (`rlhf.core.preference.ensemble_reward`: mean, wco, uwo), the members'
disagreement logged beside the reward (docs/ensembles.md).

On disk an ensemble is a directory with ``ensemble.json`` (``{"members": ["member_0", …]}``, paths relative to it) and
each member in its own directory, which ``from_pretrained`` loads as any reward model. B samples, M members."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlhf.core.preference import ensemble_reward
from rlhf.rollout.rewards.base import RewardError
from rlhf.rollout.rewards.model import RewardModelReward

MANIFEST = "ensemble.json"
"""The file that makes a directory an ensemble (and lists its members)."""


def is_ensemble(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def member_paths(path: Path) -> list[Path]:
    """The member directories ``path``'s manifest lists, each checked to exist; RewardError naming what is wrong."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        members = manifest["members"]
        if not isinstance(members, list) or not all(isinstance(m, str) and m for m in members):
            raise ValueError("'members' is not a list of directory names")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RewardError(f"reward ensemble {str(path)!r}: cannot read {MANIFEST}: {error}") from error
    if len(members) < 2:
        raise RewardError(
            f"reward ensemble {str(path)!r} lists {len(members)} member(s); an ensemble needs at least 2 (give a "
            "single reward model's directory instead)"
        )
    paths = [path / member for member in members]
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        raise RewardError(f"reward ensemble {str(path)!r}: member directory missing: {', '.join(missing)}")
    return paths


class EnsembleReward:
    """M reward models scored as one source named ``name``: each member reads the samples with its own tokenizer
    and its own stored normalisation, and :func:`~rlhf.core.preference.ensemble_reward` combines them. Logs
    ``<name>/ensemble_std`` (the members' standard deviation per sample, its batch mean) and ``<name>/member_<m>``
    (each member's batch mean) through the reward log (`rlhf.rollout.rewards.base.RewardLog`)."""

    takes_context = True  # for the log callbacks; the context itself is not read

    def __init__(self, members: list[RewardModelReward], *, name: str, objective: str, uwo_lambda: float):
        if uwo_lambda < 0:
            raise RewardError(f"reward ensemble {name!r}: uwo_lambda must be ≥ 0 (a penalty on disagreement)")
        self.members, self.name = members, name
        self.objective, self.uwo_lambda = objective, uwo_lambda
        self.shares_policy_tokenizer = all(member.shares_policy_tokenizer for member in members)
        """True when every member reads the policy's token ids as they are (:meth:`score_ids`)."""
        raw = [member.name for member in members if not member.normalised]
        if objective in ("wco", "uwo") and raw:
            # raw heads differ in offset and scale: the minimum (wco) then picks the member with the lowest offset,
            # the variance (uwo) measures the scales as much as the disagreement
            print(
                f"warning: reward ensemble {name!r}: objective {objective} compares its members' scores, but "
                f"{', '.join(raw)} carry no normalisation, so their scales differ; train the ensemble with "
                "normalize.policy set (rlhf rm --normalize.policy <the SFT model>: every member normalised on one "
                "shared sample, docs/ensembles.md)",
                file=sys.stderr,
            )

    @classmethod
    def load(cls, spec: str, *, name: str | None, objective: str, uwo_lambda: float, **options: Any) -> EnsembleReward:
        """Every member of the ensemble directory ``spec`` (`RewardModelReward.load` with ``options``)."""
        path = Path(spec).expanduser()
        name = name or path.name
        members = [
            RewardModelReward.load(str(member), name=f"{name}/{member.name}", **options)
            for member in member_paths(path)
        ]
        return cls(members, name=name, objective=objective, uwo_lambda=uwo_lambda)

    def __repr__(self) -> str:
        return f"EnsembleReward({self.name!r}, {len(self.members)} members, {self.objective})"

    def score(
        self, prompts: list[str], completions: list[str], columns: dict[str, list], *, log: Any = None, **_: Any
    ) -> list[float]:
        members = [torch.tensor(m.score(prompts, completions, columns), dtype=torch.float32) for m in self.members]
        return self._combine(torch.stack(members, dim=-1), log).tolist()

    def score_ids(
        self, query_response_ids: torch.Tensor, attention_mask: torch.Tensor, *, log: Any = None
    ) -> torch.Tensor:
        members = [m.score_ids(query_response_ids, attention_mask).cpu() for m in self.members]
        return self._combine(torch.stack(members, dim=-1), log).to(query_response_ids.device)

    def _combine(self, scores: torch.Tensor, log: tuple[Callable, Callable] | None) -> torch.Tensor:
        """(B,) rewards of the members' (B, M) scores; their spread and means logged when there is a log."""
        if log is not None and len(scores):
            log_metric = log[0]
            log_metric("ensemble_std", scores.std(-1, correction=0).mean().item())
            for m, column in enumerate(scores.unbind(-1)):
                log_metric(f"member_{m}", column.mean().item())
        return ensemble_reward(scores, self.objective, self.uwo_lambda)
