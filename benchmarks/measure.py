"""Pure helpers of the benchmark: the FLOP count of a step, per-run summaries, the markdown table.

No torch, no I/O: ``run.py`` feeds them the raw numbers each child process reported, and
``tests/test_benchmarks.py`` checks them against hand-computed values.
"""

from __future__ import annotations

import math
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


def summarize(
    steps: list[dict[str, float]], warmup: int = WARMUP_STEPS, phase_peaks: list[dict[str, float]] | None = None
) -> dict[str, Any]:
    """Per-run numbers from per-step records.

    Each record has ``step_s``, ``sequences``, ``gen_tokens`` (real generated tokens, stop token included);
    ours also ``gen_columns`` and the phase seconds of :data:`PHASES` (as ``<phase>_s``). Returns the median
    seconds per step, episodes/s, generated tokens/s, mean generated length, the seconds of the warm-up
    steps together (where one-time work such as compiling shows), and for ours the median share of each
    phase in the step. ``phase_peaks`` (ours: per step, each phase's peak RSS in MB) gives
    ``phase_peak_mb``: per phase, the median over the steps after warm-up that ran it, phases in the order
    they first appear.
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
            phase: median_after_warmup([s[f"{phase}_s"] / s["step_s"] for s in steps], warmup) for phase in PHASES
        }
    if all("gen_columns" in s for s in steps):
        out["gen_columns"] = median_after_warmup([float(s["gen_columns"]) for s in steps], warmup)
    if phase_peaks:
        timed = phase_peaks[warmup:] if len(phase_peaks) > warmup else phase_peaks
        names = list(dict.fromkeys(name for step in timed for name in step))
        out["phase_peak_mb"] = {
            name: float(statistics.median(step[name] for step in timed if name in step)) for name in names
        }
    return out


def spread(values: list[float]) -> dict[str, float]:
    """``median``, ``min`` and ``max`` of ``values`` (the repeats of one run)."""
    if not values:
        raise ValueError("no repeat finished")
    return {"median": float(statistics.median(values)), "min": min(values), "max": max(values)}


def median_index(values: list[float]) -> int:
    """Index of the value that is the median: the middle one of an odd count; of an even count the lower of
    the two middle ones (for seconds per step: the faster)."""
    if not values:
        raise ValueError("no repeat finished")
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    return order[(len(values) - 1) // 2]


def combine_repeats(repeats: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One run's summary over its repeats (``None``: a repeat that failed); ``None`` if every one failed.

    ``s_per_step`` is the median over repeats of each repeat's s/step (itself the median of its timed steps)
    with ``s_per_step_min`` / ``s_per_step_max``; ``peak_rss_mb`` the median over repeats (with min / max).
    Every other number (rates, split, warm-up, floor fraction, memory by phase) is the median repeat's
    (:func:`median_index`, kept as ``median_repeat``); ``repeats_s_per_step`` lists every repeat's s/step
    (``None`` where it failed).
    """
    done = [(i, s) for i, s in enumerate(repeats) if s is not None]
    if not done:
        return None
    seconds = spread([s["s_per_step"] for _, s in done])
    rss = spread([s["peak_rss_mb"] for _, s in done])
    index, representative = done[median_index([s["s_per_step"] for _, s in done])]
    return {
        **representative,
        "s_per_step": seconds["median"],
        "s_per_step_min": seconds["min"],
        "s_per_step_max": seconds["max"],
        "peak_rss_mb": rss["median"],
        "peak_rss_mb_min": rss["min"],
        "peak_rss_mb_max": rss["max"],
        "median_repeat": index,
        "repeats": len(done),
        "repeats_s_per_step": [None if s is None else s["s_per_step"] for s in repeats],
    }


def ratios(ours: list[dict[str, Any] | None], peer: list[dict[str, Any] | None]) -> dict[str, Any]:
    """Our run against the peer's, from both runs' per-repeat summaries (``None``: a failed repeat).

    ``speed``: the peer's median s/step over ours (> 1 = we are faster); ``rss``: our median peak RSS over
    the peer's. Their ranges pair repeat i of ours with repeat i of the peer (run back to back, so a drift of
    the machine hits both): ``speed_min`` / ``speed_max`` are the extremes of the per-repeat ratios
    (``speed_per_repeat``, over the repeats where both finished), likewise ``rss_min`` / ``rss_max``.
    """
    ours_done, peer_done = [s for s in ours if s], [s for s in peer if s]
    pairs = [(o, p) for o, p in zip(ours, peer, strict=False) if o and p]
    speed = [p["s_per_step"] / o["s_per_step"] for o, p in pairs]
    rss = [o["peak_rss_mb"] / p["peak_rss_mb"] for o, p in pairs]
    out: dict[str, Any] = {
        "speed": spread([s["s_per_step"] for s in peer_done])["median"]
        / spread([s["s_per_step"] for s in ours_done])["median"],
        "rss": spread([s["peak_rss_mb"] for s in ours_done])["median"]
        / spread([s["peak_rss_mb"] for s in peer_done])["median"],
        "speed_per_repeat": speed,
        "rss_per_repeat": rss,
    }
    if pairs:
        out |= {"speed_min": min(speed), "speed_max": max(speed), "rss_min": min(rss), "rss_max": max(rss)}
    return out


def _num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _range(low: float, high: float, digits: int) -> str:
    """``low–high`` rounded outwards (down, up), so the printed range always holds the true one."""
    scale = 10**digits
    down = math.floor(round(low * scale, 6)) / scale
    up = math.ceil(round(high * scale, 6)) / scale
    return f"{down:.{digits}f}–{up:.{digits}f}"


def _with_range(value: float, low: float | None, high: float | None, digits: int, range_digits: int,
                unit: str = "") -> str:  # fmt: skip
    """``value`` and, when there is one (more than one repeat), its range: ``0.444 (0.43–0.46)``."""
    text = f"{value:.{digits}f}{unit}"
    if low is None or high is None or low == high:
        return text
    return f"{text} ({_range(low, high, range_digits)})"


def _phase_peaks(peaks: dict[str, float] | None) -> str:
    """``rollout 512 / logprobs 530 / train 575``: each phase's peak RSS in MB."""
    if not peaks:
        return "—"
    return " / ".join(f"{name} {mb:.0f}" for name, mb in peaks.items())


def _split(split: dict[str, float] | None) -> str:
    if not split:
        return "—"
    return " / ".join(f"{100 * split[phase]:.0f}" for phase in PHASES)


TABLE_HEADER = (
    "| case | run | s/step | warm-up s | episodes/s | gen tok/s | mean gen len | peak RSS MB | speed vs TRL | RSS vs TRL "
    "| % gen / reward / score / train | floor fraction | peak MB by phase |"
)


def table_row(case: str, label: str, run: dict[str, Any]) -> str:
    """One markdown row; a failed run (``error``) keeps its place with the reason.

    s/step reads ``median (min–max)`` over the repeats and speed vs TRL ``ratio of the medians (min–max of
    the paired per-repeat ratios)``; with one repeat only the number shows.
    """
    if run.get("error"):
        reason = " ".join(str(run["error"]).split())[:80].replace("|", "/")
        return f"| {case} | {label} | failed: {reason} |" + " |" * (TABLE_HEADER.count(" | ") - 2)
    s = run["summary"]
    vs = run.get("vs_peer") or {}
    several = s.get("repeats", 1) > 1
    seconds = _with_range(s["s_per_step"], s.get("s_per_step_min") if several else None,
                          s.get("s_per_step_max") if several else None, 3, 2 if s["s_per_step"] >= 0.1 else 3)  # fmt: skip
    tried = s.get("repeats_s_per_step") or []
    if None in tried:  # some repeats failed: say over how many the median is
        seconds += f" [{s.get('repeats', 1)} of {len(tried)} repeats]"
    speed = "—"
    if "speed" in vs:
        paired = len(vs.get("speed_per_repeat", ())) > 1
        speed = _with_range(vs["speed"], vs.get("speed_min") if paired else None,
                            vs.get("speed_max") if paired else None, 2, 2, "×")  # fmt: skip
    rss = f"{vs['rss']:.2f}×" if "rss" in vs else "—"
    floor = s.get("floor_fraction")
    cells = [
        case,
        label,
        seconds,
        _num(s.get("warmup_s"), 1),
        _num(s["episodes_per_s"], 1),
        _num(s["gen_tokens_per_s"], 0),
        _num(s["mean_gen_len"], 1),
        _num(s["peak_rss_mb"], 0),
        speed,
        rss,
        _split(s.get("split")),
        "—" if floor is None else f"{100 * floor:.1f}%",
        _phase_peaks(s.get("phase_peak_mb")),
    ]
    return "| " + " | ".join(cells) + " |"


def markdown_table(cases: list[dict[str, Any]]) -> str:
    """The results table: one row per run, cases in order."""
    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|"]
    for case in cases:
        for run in case["runs"]:
            lines.append(table_row(case["name"], run["label"], run))
    return "\n".join(lines) + "\n"


def reusable_models(manifest: dict[str, Any], recipe: dict[str, Any], sizes: dict[str, dict]) -> dict[str, dict]:
    """The model entries of an assets manifest that still match, so adding a size rebuilds no other.

    An entry is kept when the manifest's shared ``recipe`` (prompts) is the same and the entry's own recipe
    (its size's dimensions) equals ``sizes[size]``. A manifest from before per-size recipes (one ``recipe``
    holding every size under ``"sizes"``) lends each entry the dimensions of its size from there.
    """
    built = manifest.get("recipe") or {}
    if {k: v for k, v in built.items() if k != "sizes"} != recipe:
        return {}
    kept = {}
    for size, entry in (manifest.get("models") or {}).items():
        dims = entry.get("recipe", (built.get("sizes") or {}).get(size))
        if size in sizes and dims == sizes[size]:
            kept[size] = {**entry, "recipe": dims}
    return kept


RESULTS_FORMAT = 2
"""``results.json``'s ``format``: 2 = every repeat kept, medians over repeats (format 1, unmarked, kept each
run's fastest round only)."""


def check_results(results: dict[str, Any]) -> None:
    """Raise ValueError unless ``results`` is in the format :func:`markdown_table` renders."""
    if results.get("format") != RESULTS_FORMAT:
        raise ValueError(
            f"results.json is in an older format ({results.get('format', 1)}, each run's fastest round) and "
            f"cannot be rendered as medians over repeats (format {RESULTS_FORMAT}): re-run the benchmark, "
            "`python benchmarks/run.py`"
        )


START_MARKER = "<!-- benchmarks:start -->"
END_MARKER = "<!-- benchmarks:end -->"


def replace_between_markers(text: str, body: str) -> str | None:
    """``text`` with what lies between the benchmark markers replaced by ``body``; None if one is missing."""
    start, end = text.find(START_MARKER), text.find(END_MARKER)
    if start < 0 or end < start:
        return None
    head = text[: start + len(START_MARKER)]
    return f"{head}\n{body.strip()}\n{text[end:]}"
