"""The demo's ``report.html`` (its sections: the README, after the demo's results), read from the demo directory alone
(``summary.json`` and the stages' own files), so ``rlhf report runs/demo`` rebuilds the same page."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlhf.report import charts
from rlhf.report import pages as r
from rlhf.report.runs import Run, load_run, read_jsonl

# (stage, what it does, why it is there) — the order of `rlhf.demo.pipeline.STAGES`
STAGE_NOTES = (
    ("pretrain", "BPE tokenizer + tiny Llama, next-token loss on text of every quality",
     "a base LM that can write, but has no reason to prefer good answers"),
    ("sft", "fine-tune on demonstrations (mixed quality, as crowd data is)",
     "puts the model in the answer format; becomes the frozen reference"),
    ("sample", "k answers per prompt from the SFT model, temperature 1",
     "the comparisons must be about what this policy actually writes"),
    ("label", "gold judge compares pairs with Bradley–Terry noise",
     "stands in for human raters; the only place the gold rule is used for training data"),
    ("rm", "reward models: LM + scalar head, −log σ(r_chosen − r_rejected), an ensemble differing by seed",
     "a learned, imperfect proxy of the raters, cheap to query; member 0 is the reward model of every later stage"),
    ("dpo", "DPO from the SFT model on the same labelled pairs",
     "the offline alternative: the same labels, no reward model, no sampling"),
    ("ppo", "PPO against the reward model, KL penalty to the SFT model",
     "climbs the proxy while the KL leash keeps it near text the proxy understands"),
    ("ppo_no_kl", "the same PPO with β = 0: no KL penalty",
     "shows what the leash prevents: far from the reference the gold score falls while the proxy does not"),
    ("ppo_no_kl_ensemble", "β = 0 again, against the ensemble, optimised conservatively",
     "where the members disagree the policy is paid less: the other defence against over-optimisation"),
    ("grpo", "GRPO against the same reward model: G answers per prompt, no critic",
     "the critic-free alternative, same reward, same leash"),
    ("eval", "held-out prompts, gold judge decides best-of-N, DPO, PPO, GRPO vs SFT",
     "the truth the proxy was meant to track, and what each method bought for its KL and time"),
)  # fmt: skip


UNLEASHED = (("ppo_no_kl", "PPO, β = 0"), ("ppo_no_kl_ensemble", "PPO, β = 0, ensemble"))
"""The β = 0 stages (a demo from before one was added lacks it) and their names in the curves."""


def demo_report(out: Path, max_samples: int = 12) -> str:
    summary = json.loads((out / "summary.json").read_text())
    unleashed = [
        load_run(out / stage, label) for stage, label in UNLEASHED if (out / stage / "metrics.jsonl").is_file()
    ]
    runs = [load_run(out / "ppo", "PPO"), *unleashed, load_run(out / "grpo", "GRPO")]
    body = [
        "<h1>rlhf demo report</h1>",
        f'<p class="muted">{r.esc(out.resolve())} · {r.fmt_seconds(summary.get("seconds"))} on this machine · every '
        "number below is read from the stages' own output files</p>",
        *_pipeline(out, summary),
        *_methods(summary, runs[0]),
        *_results(summary),
        *r.health_section(runs),
        *r.curves_section(runs),
        *r.gain_section(runs),
        *_answers(out, max_samples),
        *_configs(out, summary),
    ]
    return r.page("rlhf demo report", body)


def _pipeline(out: Path, summary: dict[str, Any]) -> list[str]:
    numbers = _stage_numbers(out, summary)
    boxes = [
        f'<div class="stage"><b>{r.esc(name)}</b>{r.esc(what)}<br>'
        f'<span class="muted">{numbers.get(name, "")}{" · " if numbers.get(name) else ""}'
        f"{r.fmt_seconds(summary.get(f'time/{name}_s'))}</span></div>"
        for name, what, _ in STAGE_NOTES
    ]
    why = "".join(f"<li><b>{r.esc(name)}</b>: {r.esc(reason)}</li>" for name, _, reason in STAGE_NOTES)
    return [
        "<h2>Pipeline</h2>",
        '<div class="pipeline">' + '<span class="arrow">→</span>'.join(boxes) + "</div>",
        f"<p>Why each stage is there:</p><ul>{why}</ul>",
    ]


def _stage_numbers(out: Path, summary: dict[str, Any]) -> dict[str, str]:
    """One line of numbers per stage, from its files."""
    numbers: dict[str, str] = {}
    if pretrain := _logged(out, "pretrain", "train/loss"):
        numbers["pretrain"] = "loss {} → {}".format(*map(r.fmt, charts.first_last(pretrain)))
    if sft := _logged(out, "sft", "eval/loss"):
        numbers["sft"] = f"eval loss {r.fmt(sft[0])} → {r.fmt(sft[-1])}"
    if candidates := _rows(out / "sample" / "candidates.jsonl"):
        numbers["sample"] = f"{len(candidates)} prompts × {len(candidates[0]['completions'])}"
    if "label/train_pairs" in summary:
        agreement = summary.get("label/train_gold_agreement", float("nan"))
        rankings = summary.get("label/train_rankings") or 0
        of = f"{rankings} rankings: " if rankings else ""
        numbers["label"] = f"{of}{summary['label/train_pairs']} pairs, {r.fmt(100 * agreement)}% agree with gold"
    numbers["rm"] = f"held-out accuracy {r.fmt(summary.get('rm/accuracy'))}"
    if dpo := _logged(out, "dpo", "eval/rewards/accuracies"):
        numbers["dpo"] = f"held-out accuracy {r.fmt(dpo[-1])}"
    numbers["ppo"] = f"reward {r.fmt(summary.get('ppo/reward_first'))} → {r.fmt(summary.get('ppo/reward_last'))}"
    for stage, _ in UNLEASHED:
        if f"{stage}/kl_last" in summary:
            numbers[stage] = (
                f"held-out rm {r.fmt(summary.get(f'{stage}/held_out_rm_last'))}, gold "
                f"{r.fmt(summary.get(f'{stage}/held_out_gold_last'))}, KL {r.fmt(summary[f'{stage}/kl_last'])}"
            )
    numbers["grpo"] = f"reward {r.fmt(summary.get('grpo/reward_first'))} → {r.fmt(summary.get('grpo/reward_last'))}"
    numbers["eval"] = f"win rate PPO {r.fmt(summary.get('gold/win_rate_vs_sft'))}"
    return numbers


RESULT_ROWS = (
    ("gold/sft_mean", "gold score of the SFT model (held-out prompts)"),
    ("gold/ppo_mean", "gold score after PPO"),
    ("gold/grpo_mean", "gold score after GRPO"),
    ("gold/win_rate_vs_sft", "PPO's win rate against SFT, the gold judge deciding (ties count ½)"),
    ("gold/grpo_win_rate_vs_sft", "GRPO's win rate against SFT"),
    ("gold/dpo_mean", "gold score after DPO"),
    ("gold/dpo_win_rate_vs_sft", "DPO's win rate against SFT"),
    ("gold/best_of_n_mean", "gold score of best-of-N (the SFT model's best of N samples under the reward model)"),
    ("gold/best_of_n_win_rate_vs_sft", "best-of-N's win rate against SFT"),
    ("rm/sft_mean", "reward-model score of the SFT answers (the proxy)"),
    ("rm/ppo_mean", "reward-model score of the PPO answers"),
    ("rm/grpo_mean", "reward-model score of the GRPO answers"),
    ("rm/accuracy", "reward model's accuracy on held-out pairs ordered by the noiseless gold rule"),
    ("rm/ensemble_accuracy_mean", "… the ensemble's, by the mean of its members"),
    ("rm/ensemble_accuracy_wco", "… and by their minimum"),
    ("kl/final", "PPO's KL to the SFT reference at the last step (nats per answer)"),
    ("ppo/held_out_gold_last", "PPO's gold score on the held-out prompts at its last step"),
    ("ppo/held_out_rm_last", "… and its reward-model score"),
    ("ppo_no_kl/held_out_gold_last", "the same for PPO without the KL penalty (β = 0): gold score …"),
    ("ppo_no_kl/held_out_rm_last", "… its reward-model score"),
    ("ppo_no_kl/kl_last", "… and its KL to the reference at the last step"),
    ("ppo_no_kl_ensemble/held_out_gold_last", "the same against the ensemble, optimised conservatively: gold …"),
    ("ppo_no_kl_ensemble/held_out_rm_last", "… its ensemble score"),
    ("ppo_no_kl_ensemble/kl_last", "… and its KL"),
    ("seconds", "wall time of the whole demo"),
)


def _results(summary: dict[str, Any]) -> list[str]:
    rows = [
        [r.td(f"<code>{r.esc(key)}</code>"), r.td(r.fmt(summary.get(key)), "num"), r.td(r.esc(meaning))]
        for key, meaning in RESULT_ROWS
    ]
    return ["<h2>Results</h2>", r.table(["summary.json", "value", "meaning"], rows)]


METHOD_LABELS = {"sft": "SFT", "best_of_n": "best-of-N", "dpo": "DPO", "ppo": "PPO", "grpo": "GRPO"}


def _methods(summary: dict[str, Any], ppo: Run) -> list[str]:
    """The methods on equal labels: one table and one plot, from ``summary["methods"]``; the plot also draws
    PPO's path, its held-out gold score against its KL at each evaluation (`gold_path`)."""
    methods = summary.get("methods")
    if not methods:
        return []  # a demo from before the comparison
    rows, points = [], []
    for name, m in methods.items():
        label = METHOD_LABELS.get(name, name) + (f" (N = {m['n']})" if "n" in m else "")
        win = "— (the baseline)" if m.get("win_rate") is None else _fixed(m["win_rate"])
        if m.get("win_rate") is not None and (interval := m.get("win_rate_ci95")):
            win += f" [{_fixed(interval[0])}, {_fixed(interval[1])}]"
        kl = ("≤ " if m.get("kl_is_bound") else "") + _fixed(m.get("kl"))
        cost = r.fmt_seconds(m.get("seconds")) + (f", {m['samples']} samples" if "samples" in m else "")
        rows.append(
            [
                r.td(r.esc(label)),
                r.td(f"{_fixed(m.get('gold_mean'))} ± {_fixed(m.get('gold_ci95'))}", "num"),
                r.td(win, "num"),
                r.td(kl, "num"),
                r.td(r.esc(cost), "num"),
                r.td(r.esc(m.get("needs", ""))),
            ]
        )
        kl_score_ci = (_number(m.get(key)) for key in ("kl", "gold_mean", "gold_ci95"))
        points.append(charts.MethodPoint(label, *kl_score_ci, bool(m.get("kl_is_bound"))))
    header = ["method", "gold score ± 95 % CI", "win rate vs SFT [95 % CI]", "KL to SFT", "own wall time", "needs"]
    chart = charts.methods_chart(points, "gold score (held-out mean)", paths=[gold_path(ppo, "PPO over its steps")])
    return [
        "<h2>Methods on equal labels</h2>",
        '<p class="muted">The same held-out prompts, one answer per prompt and method, the gold judge scoring and '
        "deciding each comparison with SFT (ties count ½). Every method starts from the SFT model and uses the "
        "same labelled pairs: DPO trains on them directly, best-of-N, PPO and GRPO through the reward model "
        "trained on them. KL: mean Σ log π/π_SFT over the answers (best-of-N: the log N − (N−1)/N bound). "
        "Wall time: the method's own stage (best-of-N: sampling N answers per prompt and scoring them), "
        "beside the shared ones above.</p>",
        r.table(header, rows),
        *([f'<div class="grid">{chart}</div>'] if chart else []),
    ]


def gold_path(run: Run, label: str) -> charts.MethodPath:
    """A run's held-out gold score against its KL to the reference at each evaluation: step 0 (before training,
    KL 0 by definition: the policy is the reference) and every row holding both ``eval/reward/gold/mean`` and
    the step's ``kl/mean`` (the same Σ log π/π_ref per answer as the methods' KL, on that step's batch)."""
    kls, golds, steps = [], [], []
    for row in run.rows:
        gold, kl = row.get("eval/reward/gold/mean"), row.get("kl/mean", 0.0 if row.get("step") == 0 else None)
        if isinstance(gold, int | float) and isinstance(kl, int | float):
            kls.append(float(kl))
            golds.append(float(gold))
            steps.append(int(row["step"]))
    return charts.MethodPath(label, tuple(kls), tuple(golds), tuple(steps))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else float("nan")


def _fixed(value: Any) -> str:
    """Two decimals, so a column of scores lines up; — for a missing number."""
    number = _number(value)
    return f"{number:.2f}" if math.isfinite(number) else "—"


def _answers(out: Path, limit: int) -> list[str]:
    """The same held-out prompts answered by SFT (the eval baseline) and by each method that was evaluated, with
    gold and proxy scores."""
    columns = {name: _rows(out / "eval" / f"{name}_samples.jsonl") for name in METHOD_LABELS if name != "sft"}
    columns = {name: {row["prompt"]: row for row in rows} for name, rows in columns.items() if rows}
    if not columns:
        return []
    first = next(iter(columns.values()))
    rows = [
        [
            r.td(f'<span class="answer">{r.esc(prompt)}</span>'),
            _answer_cell(row, "baseline_"),  # SFT's answer, in every method's file
            *(_answer_cell(answers.get(prompt, {})) for answers in columns.values()),
        ]
        for prompt, row in list(first.items())[:limit]
    ]
    names = ["SFT", *(METHOD_LABELS[name] for name in columns)]
    return [
        f"<h2>Held-out answers: {', '.join(names)}</h2>",
        '<p class="muted">One sample each from the same seed; under each answer its gold score and the reward '
        "model's (proxy) score.</p>",
        r.table(["prompt", *names], rows),
    ]


def _answer_cell(row: dict[str, Any], prefix: str = "") -> str:
    """The answer in ``row`` (its ``{prefix}completion``) with its gold and proxy scores."""
    text, scores = row.get(f"{prefix}completion"), row.get(f"{prefix}rewards") or {}
    if text is None:
        return r.td("—")
    line = " · ".join(f"{name} {r.fmt(scores.get(name))}" for name in ("gold", "rm") if name in scores)
    return r.td(f'<span class="answer">{r.esc(text)}</span><br><span class="muted">{line}</span>')


def _configs(out: Path, summary: dict[str, Any]) -> list[str]:
    # the stage configs (a run's config.yaml is its resolved copy of the one shown here)
    files = [p for p in sorted(out.glob("*/*.yaml")) + sorted(out.glob("*/*/*.yaml")) if p.name != "config.yaml"]
    return [
        "<h2>Configs</h2>",
        '<p class="muted">Each stage ran `rlhf &lt;command&gt; --config` on these.</p>',
        r.config_block("summary.json", json.dumps(summary, indent=2)),
        *(r.config_block(str(path.relative_to(out)), path.read_text()) for path in files),
    ]


def _rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a stage's JSONL file, none when the stage did not write it."""
    return read_jsonl(path) if path.is_file() else []


def _logged(out: Path, stage: str, key: str) -> list[Any]:
    return [row[key] for row in _rows(out / stage / "metrics.jsonl") if key in row]
