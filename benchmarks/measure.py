"""Pure helpers of the benchmark: the FLOP count of a step, per-run summaries, the markdown table.

No torch, no I/O: ``run.py`` feeds them the raw numbers each child process reported, and
``tests/test_benchmarks.py`` checks them against hand-computed values.
"""

from __future__ import annotations

import statistics
from typing import Any

WARMUP_STEPS = 2
"""Steps left out of every median: the first ones pay for allocator growth and lazy initialisation."""

PHASES = ("generate", "reward", "score", "train")
"""Our step split, in order: sampling, reward model, no-grad pass (log-probs, values, reference), update."""


def step_flops(
    *,
    policy_params: int,
    reward_params: int,
    sequences: int,
    prompt_len: int,
    response_len: int,
    epochs: int,
    critic_params: int = 0,
    reference: bool = True,
    old_logprobs: bool = True,
) -> dict[str, int]:
    """Model FLOPs of one step of OUR PPO / GRPO loop: ``generate``, ``score``, ``train`` and ``total``.

    The usual transformer estimate: 2·N FLOPs per token through a forward and 6·N per trained token
    (forward + backward), N = the parameters that take part in matmuls (all but the input embedding; the
    LM head counts even if tied). Attention's own O(context) work is left out (a few % at these lengths).
    With B = ``sequences``, C = ``prompt_len``, T = ``response_len`` (generated columns), L = C + T:

    - generate: the prefill reads C tokens, then each sampled token but the last is fed back: B·(C + T − 1)
      policy tokens (rows that stopped early still go through the batch, so columns, not real tokens, count);
    - score: the no-grad pass over B·L tokens — old log-probs (policy), reference log-probs (policy-sized,
      when ``reference``), values (the separate critic, ``critic_params`` > 0; a shared critic's values come
      out of the policy forward) — plus the reward model on B·L tokens;
    - train: ``epochs`` passes of forward + backward over B·L tokens through the policy and the critic.

    ``old_logprobs=False``: the policy's no-grad pass is skipped (GRPO on-policy: one update per rollout,
    no reference; the training forward supplies the old log-probs). ``critic_params = 0`` means no separate critic (shared value head, whose h+1 weights are negligible, or
    GRPO). Small deliberate approximations: the reward model re-tokenises prompt + completion and appends
    EOS (within a token per row of B·L), and our forwards project only response positions onto the
    vocabulary, so counting the LM head at prompt positions overstates the work by V·h·C per row (< 1% here).
    """
    B, L = sequences, prompt_len + response_len
    generate = 2 * policy_params * B * (prompt_len + response_len - 1)
    score_models = policy_params * (int(old_logprobs) + int(reference)) + critic_params + reward_params
    score = 2 * score_models * B * L
    train = 6 * epochs * (policy_params + critic_params) * B * L
    return {"generate": generate, "score": score, "train": train, "total": generate + score + train}


def median_after_warmup(values: list[float], warmup: int = WARMUP_STEPS) -> float:
    """Median of ``values`` without the first ``warmup`` (all of them if there are no more than that)."""
    if not values:
        raise ValueError("no steps were timed")
    kept = values[warmup:] if len(values) > warmup else values
    return float(statistics.median(kept))


def summarize(steps: list[dict[str, float]], warmup: int = WARMUP_STEPS) -> dict[str, Any]:
    """Per-run numbers from per-step records.

    Each record has ``step_s``, ``sequences``, ``gen_tokens`` (real generated tokens, stop token included);
    ours also ``gen_columns`` and the phase seconds of :data:`PHASES` (as ``<phase>_s``). Returns the median
    seconds per step, episodes/s, generated tokens/s, mean generated length, the seconds of the warm-up
    steps together (where one-time work such as compiling shows), and for ours the median share of each
    phase in the step.
    """
    seconds = median_after_warmup([s["step_s"] for s in steps], warmup)
    kept = steps[warmup:] if len(steps) > warmup else steps
    sequences = statistics.mean(s["sequences"] for s in kept)
    gen_tokens = statistics.mean(s["gen_tokens"] for s in kept)
    out: dict[str, Any] = {
        "s_per_step": seconds,
        "episodes_per_s": sequences / seconds,
        "gen_tokens_per_s": gen_tokens / seconds,
        "mean_gen_len": gen_tokens / sequences,
        "warmup_s": sum(s["step_s"] for s in steps[:warmup]) if len(steps) > warmup else None,
    }
    if all(f"{phase}_s" in s for s in steps for phase in PHASES):
        out["split"] = {
            phase: median_after_warmup([s[f"{phase}_s"] / s["step_s"] for s in steps], warmup)
            for phase in PHASES
        }
    if all("gen_columns" in s for s in steps):
        out["gen_columns"] = median_after_warmup([float(s["gen_columns"]) for s in steps], warmup)
    return out


def ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, float]:
    """``speed``: our steps/s over the peer's (> 1 = we are faster); ``rss``: our peak RSS over the peer's."""
    return {
        "speed": peer["s_per_step"] / ours["s_per_step"],
        "rss": ours["peak_rss_mb"] / peer["peak_rss_mb"],
    }


def _num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _split(split: dict[str, float] | None) -> str:
    if not split:
        return "—"
    return " / ".join(f"{100 * split[phase]:.0f}" for phase in PHASES)


TABLE_HEADER = (
    "| case | run | s/step | warm-up s | episodes/s | gen tok/s | mean gen len | peak RSS MB | speed vs TRL | RSS vs TRL "
    "| % gen / reward / score / train | floor fraction |"
)


def table_row(case: str, label: str, run: dict[str, Any]) -> str:
    """One markdown row; a failed run (``error``) keeps its place with the reason."""
    if run.get("error"):
        reason = " ".join(str(run["error"]).split())[:80].replace("|", "/")
        return f"| {case} | {label} | failed: {reason} | | | | | | | | | |"
    s = run["summary"]
    vs = run.get("vs_peer") or {}
    speed = f"{vs['speed']:.2f}×" if "speed" in vs else "—"
    rss = f"{vs['rss']:.2f}×" if "rss" in vs else "—"
    floor = s.get("floor_fraction")
    cells = [
        case,
        label,
        _num(s["s_per_step"], 3),
        _num(s.get("warmup_s"), 1),
        _num(s["episodes_per_s"], 1),
        _num(s["gen_tokens_per_s"], 0),
        _num(s["mean_gen_len"], 1),
        _num(s["peak_rss_mb"], 0),
        speed,
        rss,
        _split(s.get("split")),
        "—" if floor is None else f"{100 * floor:.1f}%",
    ]
    return "| " + " | ".join(cells) + " |"


def markdown_table(cases: list[dict[str, Any]]) -> str:
    """The results table: one row per run, cases in order."""
    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|"]
    for case in cases:
        for run in case["runs"]:
            lines.append(table_row(case["name"], run["label"], run))
    return "\n".join(lines) + "\n"


START_MARKER = "<!-- benchmarks:start -->"
END_MARKER = "<!-- benchmarks:end -->"


def replace_between_markers(text: str, body: str) -> str | None:
    """``text`` with what lies between the benchmark markers replaced by ``body``; None if one is missing."""
    start, end = text.find(START_MARKER), text.find(END_MARKER)
    if start < 0 or end < start:
        return None
    head = text[: start + len(START_MARKER)]
    return f"{head}\n{body.strip()}\n{text[end:]}"
