"""The report's plots: the math behind them (pure) and each chart as an embedded PNG figure."""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import itertools
import math
import re
from collections.abc import Sequence
from typing import Any

from rlhf.report.runs import Run, finite_rows

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
SEVERITY_COLORS = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#7f7f7f"}


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Centred moving average (shorter windows at the ends), so noisy per-step metrics show their trend."""
    half = window // 2
    parts = [values[max(0, i - half) : i + half + 1] for i in range(len(values))]
    return [sum(part) / len(part) for part in parts]


def smoothing_window(n: int) -> int:
    """About a fifteenth of the run, odd, at least 1: enough to see trends without hiding turns."""
    return max(1, n // 15) | 1  # an even window grows by one


def reward_gain(means: Sequence[float], first_std: float) -> list[float]:
    """Gain of a reward's batch mean over the first step's, ``(m_t − m_1) / s_1``: sources with different scales
    (a reward model's logits, a 0–10 judge) become comparable — one unit is "one standard deviation of the
    initial policy's answers". A zero or missing std falls back to 1 (the gain is then in the reward's units)."""
    scale = first_std if math.isfinite(first_std) and first_std > 0 else 1.0
    return [(m - means[0]) / scale for m in means]


def binned_means(xs: Sequence[float], ys: Sequence[float], bins: int) -> tuple[list[float], list[float]]:
    """Sort the points by x, cut them into ``bins`` groups of (nearly) equal count, return each group's means.
    The first ``len % bins`` groups take one extra point; empty groups (fewer points than bins) are skipped."""
    points = sorted(zip(xs, ys, strict=True))
    size, extra = divmod(len(points), bins)
    bx, by, start = [], [], 0
    for b in range(bins):
        group = points[start : start + size + (b < extra)]
        start += len(group)
        if group:
            bx.append(sum(x for x, _ in group) / len(group))
            by.append(sum(y for _, y in group) / len(group))
    return bx, by


def first_last(values: Sequence[float], k: int = 5) -> tuple[float, float]:
    """Means of the first and the last ``k`` values (the start and the end of a run, less noisy than 1 step)."""
    k = max(1, min(k, len(values) // 2 or 1))
    return sum(values[:k]) / k, sum(values[-k:]) / k


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Any, Any]:
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    fig = Figure(figsize=(5.2, 3.1), dpi=96, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    return fig, ax


def _figure_html(fig: Any, alt: str, caption: str) -> str:
    """The figure as an embedded PNG (a data URI: the page needs no other file), with its caption."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    png = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{png}"><figcaption>{html.escape(caption)}</figcaption></figure>'


def _plot_trend(ax: Any, xs: Sequence[float], ys: Sequence[float], label: str, color: str, **style: Any) -> None:
    """Raw values as a faint line, their moving average on top (when there are enough points to smooth)."""
    window = smoothing_window(len(ys))
    if window > 1:
        ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(xs, rolling_mean(ys, window), color=color, label=label, linewidth=1.6, **style)
    else:
        ax.plot(xs, ys, color=color, label=label, linewidth=1.4, marker="." if len(ys) < 30 else None, **style)


@dataclasses.dataclass(frozen=True)
class Chart:
    """One training-curve plot: the metric keys it draws (the first a run has is used) and its caption."""

    title: str
    keys: tuple[str, ...]
    ylabel: str
    caption: str


CHARTS = (
    Chart("Reward (training batch)", ("reward/mean",), "reward", "Combined reward of each step's rollouts."),
    Chart("Held-out reward", ("eval/reward/mean",), "reward", "Same sampler on the held-out prompts, every eval step."),
    Chart("KL to the reference", ("kl/mean",), "nats per sequence", "Σ log π/π_ref over the response, averaged."),
    Chart("KL coefficient β", ("kl/coef",), "β", "After each step's controller update (adaptive KL moves it)."),
    Chart("Entropy", ("policy/entropy",), "nats per token", "Falling entropy: the policy grows more certain."),
    Chart(
        "Clip fraction",
        ("policy/clipfrac", "clip_ratio/region"),
        "fraction of tokens",
        "Tokens whose ratio left the clip range (the update was cut there).",
    ),
    Chart("Value loss", ("value/loss",), "loss", "Clipped value loss of the critic (ppo)."),
    Chart("Response length", ("response/length_mean",), "tokens", "Mean sampled response length, stop token included."),
    Chart("Gradient norm", ("grad/norm",), "‖g‖ before clipping", "Mean over the step's updates."),
    Chart("|Advantage|", ("advantages/abs_mean",), "mean |A|", "After whitening / group normalisation."),
)


def curve_chart(runs: Sequence[Run], chart: Chart) -> str | None:
    """The chart for the runs that logged one of its keys, or None when none did."""
    drawn = [(run, next(key for key in chart.keys if run.has(key))) for run in runs if any(map(run.has, chart.keys))]
    if not drawn or all(len(set(run.series(key)[1])) <= 1 for run, key in drawn):
        return None  # every run's values are one number (a fixed β, a length always at max_new_tokens): flat lines
    fig, ax = _figure(chart.title, "step", chart.ylabel)
    for (run, key), color in zip(drawn, itertools.cycle(COLORS)):
        _plot_trend(ax, *run.series(key), run.label, color)
        if (clipped := run.clipped_from) is not None:  # the end of the vanilla policy-gradient warm-up
            ax.axvline(
                clipped, color=color, linestyle=":", linewidth=1.0, label=f"{run.label}: clipped from step {clipped}"
            )
    marked = _mark_findings(ax, drawn, multiple=len(runs) > 1)
    if len(runs) > 1 or marked or any(run.clipped_from is not None for run, _ in drawn):
        ax.legend(fontsize=7)
    return _figure_html(fig, chart.title, chart.caption)


def _matches(metric: str, key: str) -> bool:
    """A rule's metric names a key: itself, or a pattern such as ``reward/<monitor>/mean`` (``<…>``: one name)."""
    return re.fullmatch(re.sub(r"<[^>]*>", "[^/]+", re.escape(metric)), key) is not None


def _mark_findings(ax: Any, drawn: Sequence[tuple[Run, str]], multiple: bool) -> bool:
    """Shade the steps where a doctor finding about this chart's metric held (the Health section lists them)."""
    marked = False
    for run, key in drawn:
        for finding in run.findings:
            if not any(_matches(metric, key) for metric in finding.rule.metrics):
                continue
            color = SEVERITY_COLORS[finding.rule.severity]
            label = f"{run.label}: {finding.rule.name}" if multiple else f"doctor: {finding.rule.name}"
            for n, (first, last) in enumerate(finding.episodes):
                ax.axvspan(first - 0.5, last + 0.5, color=color, alpha=0.15, linewidth=0, label=None if n else label)
            marked = True
    return marked


def source_charts(runs: Sequence[Run]) -> list[str]:
    """One chart per reward source of a reward list (``reward/<name>/mean``), all runs overlaid."""
    blocks = []
    for name in dict.fromkeys(source for run in runs for source in run.reward_weights()):
        key = f"reward/{name}/mean"
        present = [run for run in runs if run.has(key)]
        if not present:
            continue
        title = f"Reward source '{name}'"
        fig, ax = _figure(title, "step", "batch mean")
        for run, color in zip(present, itertools.cycle(COLORS)):
            _plot_trend(ax, *run.series(key), run.label, color)
            eval_steps, eval_values = run.series(f"eval/reward/{name}/mean")
            if eval_steps:
                ax.plot(eval_steps, eval_values, "o", color=color, markersize=4, label=f"{run.label} (held-out)")
        _mark_findings(ax, [(run, key) for run in present], multiple=len(runs) > 1)
        ax.legend(fontsize=7)
        weights = {run.reward_weights().get(name, 1.0) for run in present}
        role = "a monitor (weight 0): logged, never optimised" if weights == {0.0} else "optimised"
        blocks.append(_figure_html(fig, title, f"Batch mean (line) and held-out mean (dots); {role}."))
        if disagreement := _disagreement_chart(runs, name):
            blocks.append(disagreement)
    return blocks


def _disagreement_chart(runs: Sequence[Run], name: str) -> str | None:
    """The members' disagreement of a source that is a reward-model ensemble (``reward/<name>/ensemble_std``)."""
    key = f"reward/{name}/ensemble_std"
    present = [run for run in runs if run.has(key)]
    if not present:
        return None
    title = f"Disagreement of the ensemble '{name}'"
    fig, ax = _figure(title, "step", "members' std, batch mean")
    for run, color in zip(present, itertools.cycle(COLORS)):
        _plot_trend(ax, *run.series(key), run.label, color)
    _mark_findings(ax, [(run, key) for run in present], multiple=len(runs) > 1)
    ax.legend(fontsize=7)
    caption = "The standard deviation of the members' normalised scores of each sample, averaged over the batch."
    return _figure_html(fig, title, caption)


def time_charts(runs: Sequence[Run]) -> list[str]:
    """Where each step's time went, as stacked areas: one chart per run."""
    parts = ("rollout", "score", "logprobs", "train")  # time/<part>_s
    blocks = []
    for run in runs:
        rows = [row for row in run.rows if "time/step_s" in row]
        if not rows:
            continue
        title = f"Seconds per step — {run.label}"
        fig, ax = _figure(title, "step", "seconds")
        stacks = [[float(row.get(f"time/{part}_s", 0.0)) for row in rows] for part in parts]
        ax.stackplot([int(row["step"]) for row in rows], stacks, colors=COLORS[: len(parts)], alpha=0.8, labels=parts)
        ax.legend(fontsize=7, loc="upper right")
        caption = (
            "Rollout (sampling), score (rewards), logprobs (reference and old log-probs; in PPO with one "
            "micro-batch, the first update's forward), train (the updates)."
        )
        blocks.append(_figure_html(fig, title, caption))
    return blocks


def gain_chart(runs: Sequence[Run]) -> str | None:
    """Every reward source's gain (`reward_gain`) against KL to the reference, all runs on one plot. Steps are
    points; the line joins the means of equal-count KL bins (`binned_means`), so it reads as a function of KL
    even when KL goes up and down during the run."""
    fig, ax = _figure(
        "Reward gained as the policy moves away from the reference",
        "√KL to the reference (√nats)",
        "gain over step 1 (step-1 std)",
    )
    drawn = 0
    for run, color in zip(runs, itertools.cycle(COLORS)):
        for name, weight in (run.reward_weights() or {"": 1.0}).items():
            prefix = f"reward/{name}" if name else "reward"
            rows = finite_rows(run.rows, "kl/mean", f"{prefix}/mean")  # the steps that logged both
            kls = [float(row["kl/mean"]) for row in rows]
            if len(kls) < 2 or max(kls) <= 0:
                continue
            first_std = float(rows[0].get(f"{prefix}/std", math.nan) or math.nan)
            gains = reward_gain([float(row[f"{prefix}/mean"]) for row in rows], first_std)
            monitor = weight == 0
            kls = [math.sqrt(max(kl, 0.0)) for kl in kls]  # √KL spreads small and large KL (Gao et al., 2022)
            ax.plot(kls, gains, "x" if monitor else ".", color=color, alpha=0.3, markersize=4)
            bx, by = binned_means(kls, gains, bins=min(8, max(2, len(kls) // 6)))
            label = f"{run.label}: {name or 'reward'}" + (" (monitor)" if monitor else "")
            ax.plot(bx, by, color=color, linestyle="--" if monitor else "-", marker="o", markersize=3, label=label)
            drawn += 1
    if not drawn:
        return None
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.legend(fontsize=7)
    caption = (
        "Each reward's batch mean as its gain over step 1, in units of step 1's std, against √KL: points are "
        "steps, lines the means of KL bins. Solid: optimised rewards; dashed: monitors (weight 0). A proxy "
        "that keeps climbing while the monitor stalls or falls is being over-optimised — the failure the KL "
        "penalty is there to hold back."
    )
    return _figure_html(fig, "Reward against KL", caption)


@dataclasses.dataclass(frozen=True)
class MethodPoint:
    """One method of a comparison: its KL to the reference (``kl_is_bound``: an upper bound), its mean score
    and the half-width of that mean's 95 % interval."""

    label: str
    kl: float
    score: float
    ci95: float
    kl_is_bound: bool = False


@dataclasses.dataclass(frozen=True)
class MethodPath:
    """One run's way to its point: its score against its KL at each of ``steps`` (Gao et al. 2022 draw the
    gold score against KL this way: it rises, peaks, and falls once the proxy is over-optimised)."""

    label: str
    kls: tuple[float, ...]
    scores: tuple[float, ...]
    steps: tuple[int, ...]


def methods_chart(points: Sequence[MethodPoint], ylabel: str, paths: Sequence[MethodPath] = ()) -> str | None:
    """Mean score ± its 95 % interval against KL to the reference, one point per method: what each method
    bought and how far it moved the policy for it. A KL that is only a bound is drawn hollow. ``paths``: runs
    drawn as lines through their evaluations, each labelled with its steps."""
    drawn = [p for p in points if math.isfinite(p.kl) and math.isfinite(p.score)]
    if not drawn:
        return None
    fig, ax = _figure("Methods on the same held-out prompts", "KL to the reference (nats per answer)", ylabel)
    for path in paths:
        if len(path.kls) < 2:
            continue
        ax.plot(path.kls, path.scores, "-", color="#999999", linewidth=1, marker=".", markersize=4, label=path.label)
        for kl, score, step in zip(path.kls, path.scores, path.steps, strict=True):
            ax.annotate(str(step), (kl, score), fontsize=6, color="#777777", xytext=(2, 2), textcoords="offset points")
    for point, color in zip(drawn, itertools.cycle(COLORS)):
        ci = point.ci95 if math.isfinite(point.ci95) else 0.0
        ax.errorbar(
            [point.kl],
            [point.score],
            yerr=[ci],
            fmt="o",
            color=color,
            capsize=3,
            markersize=6,
            markerfacecolor="white" if point.kl_is_bound else color,
            label=point.label + (" (KL ≤)" if point.kl_is_bound else ""),
        )
    ax.legend(fontsize=7)
    caption = (
        "Each method's mean score on the held-out prompts with its 95 % interval, against the KL of its "
        "answers from the reference. Up is better; right is further from the model the labels were "
        "collected on. A hollow marker's KL is an upper bound (best-of-N)."
    )
    if any(len(p.kls) >= 2 for p in paths):
        caption += (
            " The grey line is PPO's path: its held-out score at each evaluation (the step beside each dot) "
            "against its KL then — the curve of Gao et al. (2022), which turns down once the policy "
            "over-optimises the reward model."
        )
    return _figure_html(fig, "Methods compared", caption)
