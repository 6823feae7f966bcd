"""The pieces of the report pages (plots, tables, cards, escaping) and the page of one ppo or grpo run
(:func:`run_report`); the demo's page (`rlhf.report.demo`) is built from the same pieces. See `rlhf.report`."""

from __future__ import annotations

import base64
import dataclasses
import functools
import html
import io
import itertools
import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from rlhf.config import ConfigError
from rlhf.doctor.rules import RULES, Finding, History, count_text, diagnose

RL_COMMANDS = ("ppo", "grpo")
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
SEVERITY_COLORS = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#7f7f7f"}


# Reading a run


@dataclasses.dataclass(frozen=True)
class Run:
    """What a ppo/grpo run directory holds: its config, its metric rows and its held-out samples."""

    path: Path
    label: str
    command: str
    config_text: str
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    samples: dict[int, list[dict[str, Any]]]
    """Step → the rows of ``samples/step_NNNNNN.jsonl``."""

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the rows that logged ``key`` with a finite value."""
        rows = _finite_rows(self.rows, key)
        return [int(row["step"]) for row in rows], [float(row[key]) for row in rows]

    def has(self, key: str) -> bool:
        return bool(self.series(key)[0])

    @property
    def clipped_from(self) -> int | None:
        """The step at which the clipped objective took over from the vanilla policy-gradient warm-up
        (``warmup_pg_steps``; ``policy/clipped`` goes from 0 to 1), or None for a run without a warm-up."""
        steps, values = self.series("policy/clipped")
        if not values or values[0] != 0.0:
            return None
        return next((step for step, value in zip(steps, values, strict=True) if value == 1.0), None)

    @property
    def policy(self) -> str:
        """The model the run started from (``model.name``; ``policy`` in a run recorded by rlhf 0.1)."""
        model = self.config.get("model")
        return str(model.get("name", "?") if isinstance(model, dict) else self.config.get("policy", "?"))

    @functools.cached_property
    def findings(self) -> list[Finding]:
        """The training doctor's findings on this run: what ``rlhf doctor RUN_DIR`` (and the live alarms) name."""
        return diagnose(History(self.rows, self.config))

    def reward_weights(self) -> dict[str, float]:
        """Reward source name → weight, for a reward list; empty for a single source."""
        reward = self.config.get("reward")
        if isinstance(reward, dict):  # the reward section (a run recorded by rlhf 0.1 holds the list itself)
            reward = reward.get("source")
        if not isinstance(reward, list):
            return {}
        return {str(entry["name"]): float(entry.get("weight", 1.0)) for entry in reward}


def _finite_rows(rows: Iterable[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    return [row for row in rows if all(isinstance(row.get(k), int | float) and math.isfinite(row[k]) for k in keys)]


def load_run(path: str | Path, label: str | None = None) -> Run:
    """Read a ppo/grpo output directory; FileNotFoundError / ConfigError say what is missing or wrong."""
    path = Path(path)
    for name in ("metrics.jsonl", "config.yaml"):
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"{path / name} does not exist: RUN_DIR must be the output_dir of a ppo or grpo run"
            )
    config_text = (path / "config.yaml").read_text()
    command = _command_of(config_text)
    if command not in RL_COMMANDS:
        raise ConfigError(f"{path} is the output of `rlhf {command}`; rlhf report reads ppo and grpo runs")
    rows = [row for row in read_jsonl(path / "metrics.jsonl") if "step" in row]
    samples = {
        int(file.stem.removeprefix("step_")): read_jsonl(file)
        for file in sorted((path / "samples").glob("step_*.jsonl"))
    }
    config = yaml.safe_load(config_text) or {}
    return Run(path, label or command, command, config_text, config, rows, samples)


def _command_of(config_text: str) -> str:
    """The command from the first line every run writes: ``# rlhf <command>: resolved config …``."""
    first = config_text.splitlines()[0] if config_text else ""
    if first.startswith("# rlhf ") and ":" in first:
        return first.removeprefix("# rlhf ").split(":", 1)[0].strip()
    return "unknown"


# Math of the plots (pure)


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Centred moving average (shorter windows at the ends), so noisy per-step metrics show their trend."""
    half = window // 2
    parts = [values[max(0, i - half) : i + half + 1] for i in range(len(values))]
    return [sum(part) / len(part) for part in parts]


def smoothing_window(n: int) -> int:
    """About a fifteenth of the run, odd, at least 1: enough to see trends without hiding turns."""
    window = max(1, n // 15)
    return window if window % 2 else window + 1


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


# Plots


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
    return f'<figure><img alt="{esc(alt)}" src="data:image/png;base64,{png}"><figcaption>{esc(caption)}</figcaption></figure>'


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
        clipped = run.clipped_from
        _plot_trend(ax, *run.series(key), run.label, color)
        if clipped is not None:  # the end of the vanilla policy-gradient warm-up
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
    return blocks


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
            rows = _finite_rows(run.rows, "kl/mean", f"{prefix}/mean")  # the steps that logged both
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


# HTML

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 2em auto; max-width: 1180px;
       color: #222; line-height: 1.45; padding: 0 1em; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 2em; }
.muted { color: #666; font-size: 0.9em; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 1em; }
figure { margin: 0; } figcaption { color: #555; font-size: 0.82em; }
img { max-width: 100%; }
table { border-collapse: collapse; font-size: 0.88em; width: 100%; }
th, td { border: 1px solid #ddd; padding: 0.35em 0.5em; vertical-align: top; text-align: left; }
th { background: #f5f5f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8em; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.5em 0.9em; min-width: 9em; }
.card b { display: block; font-size: 1.3em; }
.sev-critical { color: #b71c1c; font-weight: bold; } .sev-warning { color: #c25e00; font-weight: bold; }
.sev-info { color: #555; }
.pipeline { display: flex; flex-wrap: wrap; align-items: stretch; gap: 0.3em; }
.stage { border: 1px solid #9ab; border-radius: 6px; background: #f4f8fb; padding: 0.4em 0.5em; width: 7.6em;
         font-size: 0.76em; }
.stage b { display: block; font-size: 1.1em; } .arrow { align-self: center; color: #789; font-size: 1.3em; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.82em; }
.answer { white-space: pre-wrap; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value))


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a table cell: 3 significant digits, '—' for missing or NaN."""
    if value is None:
        return "—"
    if isinstance(value, int):  # and bool
        return str(value)
    if isinstance(value, float):
        return "—" if not math.isfinite(value) else f"{value:.{digits}g}"
    return esc(value)


def fmt_seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def page(title: str, body: Iterable[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def cards(items: Sequence[tuple[str, str]]) -> str:
    inner = "".join(f'<div class="card"><span class="muted">{esc(k)}</span><b>{v}</b></div>' for k, v in items)
    return f'<div class="cards">{inner}</div>'


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """An HTML table: ``header`` texts (HTML) and rows of `td` cells."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def td(text: Any, cls: str = "") -> str:
    return f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>"


def config_block(title: str, text: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{esc(title)}</summary><pre>{esc(text)}</pre></details>"


def headline(run: Run) -> str:
    """Cards: steps, wall time, reward and KL at the start and end, held-out reward at first and last eval."""
    items = [("steps", str(len(run.rows))), ("training time", f"{sum(run.series('time/step_s')[1]):.0f} s")]
    for key, name in (
        ("reward/mean", "reward"),
        ("eval/reward/mean", "held-out reward"),
        ("kl/mean", "KL"),
        ("policy/entropy", "entropy"),
    ):
        values = run.series(key)[1]
        if values:
            start, end = (values[0], values[-1]) if key.startswith("eval/") else first_last(values)
            items.append((name, f"{fmt(start)} → {fmt(end)}"))
    if run.clipped_from is not None:
        items.append(("objective", f"vanilla PG to step {run.clipped_from - 1}, clipped from {run.clipped_from}"))
    items.append(("health", count_text(run.findings) or "healthy"))
    return cards(items)


def health_section(runs: Sequence[Run]) -> list[str]:
    """What the training doctor finds in each run (as ``rlhf doctor``): the rule, when it held, the evidence at
    the last of those steps and the fix to try; the steps are shaded on the curves of the rule's metrics."""
    rows = [
        [
            td(esc(run.label)),
            td(f'<span class="sev-{f.rule.severity}">{f.rule.severity}</span>'),
            td(f"<code>{esc(f.rule.name)}</code><br>{esc(f.rule.diagnosis)}"),
            td(esc(f.steps_text)),
            td(esc(f.last)),
            td(esc(f.rule.fix)),
        ]
        for run in runs
        for f in run.findings
    ]
    intro = (
        f'<p class="muted">The training doctor\'s {len(RULES)} rules replayed over the metrics, as '
        "<code>rlhf doctor RUN_DIR</code> and the live alarms (doctor.jsonl) read them; the steps where a finding "
        "held are shaded on the curves of its metrics.</p>"
    )
    if not rows:
        names = ", ".join(esc(run.label) for run in runs)
        return ["<h2>Health</h2>", intro, f"<p>Healthy: none of the rules fired ({names}).</p>"]
    header = ["run", "severity", "finding", "steps", "evidence (last step)", "fix to try"]
    return ["<h2>Health</h2>", intro, table(header, rows)]


def curves_section(runs: Sequence[Run]) -> list[str]:
    blocks = [block for chart in CHARTS if (block := curve_chart(runs, chart))]
    blocks[1:1] = source_charts(runs)
    blocks += time_charts(runs)
    return ["<h2>Training curves</h2>", '<div class="grid">', *blocks, "</div>"]


def gain_section(runs: Sequence[Run]) -> list[str]:
    block = gain_chart(runs)
    return [] if block is None else ["<h2>Reward against KL</h2>", '<div class="grid">', block, "</div>"]


def samples_section(run: Run, limit: int) -> list[str]:
    """Held-out prompts answered at the first and the last eval step, side by side with their rewards."""
    if not run.samples:
        return ["<h2>Held-out samples</h2>", '<p class="muted">No samples/ in this run (run.eval_every: 0).</p>']
    first, last = min(run.samples), max(run.samples)
    before = {row["prompt"]: row for row in run.samples[first]}
    rows = [
        [
            td(f'<span class="answer">{esc(row["prompt"])}</span>'),
            td(_answer(old)),
            td(_scores(old), "num"),
            td(_answer(row)),
            td(_scores(row), "num"),
        ]
        for row in run.samples[last][:limit]
        for old in [before.get(row["prompt"], {})]
    ]
    header = ["prompt", f"step {first}", "reward", f"step {last}", "reward"]
    return [f"<h2>Held-out samples (step {first} and step {last})</h2>", table(header, rows)]


def _answer(row: dict[str, Any]) -> str:
    """A sample's answer: its completion, or a multi-turn episode's every turn, role by role (tool calls as
    ``→ name(arguments)``)."""
    episode = row.get("episode")
    if episode is None:
        return f'<span class="answer">{esc(row.get("completion", ""))}</span>'
    lines = []
    for turn in episode["turns"]:
        calls = [call["function"] for call in turn.get("tool_calls") or []]
        text = turn["content"] + "".join(f" → {c['name']}({json.dumps(c['arguments'])})" for c in calls)
        lines.append(f"<b>{esc(turn['role'])}</b>: {esc(text)}")
    ended = f'<br><span class="muted">ended: {esc(episode["ended"])}</span>'
    return f'<span class="answer">{"<br>".join(lines)}{ended}</span>'


def _scores(row: dict[str, Any]) -> str:
    if not row:
        return "—"
    if "rewards" in row:
        return "<br>".join(f"{esc(k)} {fmt(v)}" for k, v in row["rewards"].items())
    return fmt(row.get("reward"))


def run_report(run: Run, max_samples: int) -> str:
    title = f"rlhf {run.command} — {run.path}"
    body = [
        f"<h1>rlhf {esc(run.command)} report</h1>",
        f'<p class="muted">{esc(run.path.resolve())} · policy {esc(run.policy)}</p>',
        headline(run),
        *health_section([run]),
        *curves_section([run]),
        *gain_section([run]),
        *samples_section(run, max_samples),
        "<h2>Config</h2>",
        config_block("config.yaml", run.config_text, open_=True),
    ]
    return page(title, body)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file. A cut-off last line (a run still writing, or killed mid-write) is left out,
    so a report can be made of a run in progress; a broken line before it is an error naming file:line."""
    lines = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    rows = []
    for n, line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == lines[-1][0]:
                break
            from rlhf.data.files import DataError  # `rlhf report` shows it as one clean error line

            raise DataError([f"{path}:{n}: not a JSON line ({e.msg})"]) from None
    return rows
