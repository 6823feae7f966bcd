"""Samples on disk: the held-out answers of every eval step (``samples/step_NNNNNN.jsonl``) and, when a reward function
logs columns, the training samples of a logged step (``completions/step_NNNNNN.jsonl``).

``scores`` is a :class:`rlhf.rollout.scoring.Scores` (read for ``raw``, ``names``, ``per_source``, ``extra``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlhf.runlog.rundir import atomic_open


def sample_rows(
    step: int, prompts: list[str], completions: list[str], scores: Any, episodes: list[Any] | None = None
) -> list[dict[str, Any]]:
    """One JSON row per sample: step, prompt, completion, ``reward`` (the weighted sum of the raw rewards),
    ``rewards`` by source (with several) and ``extra`` (the ``log_extra`` columns, ``"<source>/<column>"``); a
    multi-turn sample (``episodes``) adds ``episode``: its opening ``messages``, every ``turn``, the environment's
    ``rewards``, the tool calls, errors and time-outs and how it ``ended``."""
    rows = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        value = scores.raw[i].item()
        row: dict[str, Any] = {"step": step, "prompt": prompt, "completion": completion}
        if episodes is not None:
            row["episode"] = episode_record(episodes[i])
        row["reward"] = None if math.isnan(value) else value
        if len(scores.names) > 1:
            row["rewards"] = {
                name: (None if math.isnan(v) else v)
                for name, v in zip(scores.names, scores.per_source[i].tolist(), strict=True)
            }
        if scores.extra:
            row["extra"] = {key: values[i] for key, values in scores.extra.items()}
        rows.append(row)
    return rows


def episode_record(episode: Any) -> dict[str, Any]:
    """What a samples row keeps of an episode (`rlhf.rollout.episodes.Episode`)."""
    return {
        "messages": episode.messages,
        "turns": episode.turns,
        "rewards": episode.rewards,
        "tool_calls": episode.tool_calls,
        "tool_errors": episode.tool_errors,
        "tool_timeouts": episode.tool_timeouts,
        "ended": episode.ending,
    }


def write_step(
    folder: str,
    output_dir: Path,
    step: int,
    prompts: list[str],
    completions: list[str],
    scores: Any,
    episodes: list[Any] | None = None,
) -> Path:
    """``<folder>/step_NNNNNN.jsonl``, one `sample_rows` line per sample: ``samples/``, the held-out prompts'
    completions (or episodes) and rewards of an eval step; ``completions/``, a step's training samples (TRL's
    completions table), written when a reward function logged columns with ``log_extra``."""
    path = output_dir / folder / f"step_{step:06d}.jsonl"
    with atomic_open(path) as f:
        for row in sample_rows(step, prompts, completions, scores, episodes):
            # default=str: a log_extra value JSON cannot hold is written as its text rather than losing the file
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return path
