"""The report pages' HTML pieces (tables, cards, escaping, sections), the demo's page's too, and the page of one
ppo or grpo run (`run_report`)."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from rlhf.doctor.rules import RULES, count_text
from rlhf.report.charts import CHARTS, curve_chart, first_last, gain_chart, source_charts, time_charts
from rlhf.report.runs import Run

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


def fmt(value: Any) -> str:
    """A number for a table cell: 3 significant digits, '—' for missing or NaN."""
    if isinstance(value, float):
        return f"{value:.3g}" if math.isfinite(value) else "—"
    return "—" if value is None else esc(value)


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
    return page(f"rlhf {run.command} — {run.path}", body)
