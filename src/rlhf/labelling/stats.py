"""``rlhf label --stats PREFS.jsonl [MORE.jsonl …]``: what the labels say about the labellers.

Over the live labels of one or more labels files (a pair's id is the same in each, so a judge can be measured against
people): counts per labeller, tie and skip rates, position bias (only labels that record the side shown) and agreement
(`rlhf.core.agreement`), as docs/labelling.md ("Statistics") describes them."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from rlhf.core.agreement import fleiss_kappa, pairwise_cohen, percent_agreement, wilson_interval
from rlhf.data.files import DataError, read_records
from rlhf.data.labels import is_label_file, live_labels


def label_stats(paths: Sequence[str]) -> dict[str, Any]:
    """The statistics of the labels files ``paths`` as one JSON-ready dict (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        records = read_records(path)
        if not is_label_file(records):
            raise DataError(
                [f'{path}: not a labels file (no line has a "kind"); --stats reads what `rlhf label` writes']
            )
        rows += [r.data for r in live_labels(records)]
    per: dict[str, Counter[str]] = defaultdict(Counter)
    seconds: dict[str, list[float]] = defaultdict(list)
    decisions: dict[str, dict[str, str]] = defaultdict(dict)  # labeller → pair → decision
    left_won: dict[str, list[bool]] = defaultdict(list)  # labeller → whether the left answer won, per decision
    for row in rows:
        who, kind = str(row.get("labeller", row.get("source", "?"))), row["kind"]
        per[who][kind] += 1
        if isinstance(row.get("seconds"), int | float):
            seconds[who].append(float(row["seconds"]))
        if kind != "skip":
            decisions[who][str(row.get("pair"))] = decision(row)
        if kind == "preference" and row.get("left") in ("chosen", "rejected"):
            left_won[who].append(row["left"] == "chosen")
    labellers = {
        who: {
            "labels": sum(counts.values()),
            "preferences": counts["preference"],
            "ties": counts["tie"],
            "skips": counts["skip"],
            "seconds_per_label": sum(seconds[who]) / len(seconds[who]) if seconds[who] else None,
            "left_wins": _share(left_won[who]),
        }
        for who, counts in sorted(per.items())
    }
    total = sum(per.values(), Counter[str]())
    n = sum(total.values())
    items = defaultdict(list)
    for by_pair in decisions.values():
        for pair, verdict in by_pair.items():
            items[pair].append(verdict)
    overlapping = [labels for labels in items.values() if len(labels) >= 2]
    cohen = pairwise_cohen(decisions)
    return {
        "files": list(paths),
        "labels": n,
        "pairs": len({str(row.get("pair")) for row in rows}),
        "labellers": labellers,
        "tie_rate": total["tie"] / n if n else None,
        "skip_rate": total["skip"] / n if n else None,
        "position_bias": _share([won for wins in left_won.values() for won in wins]),
        "agreement": {
            "pairs": len(overlapping),
            "percent": percent_agreement(overlapping),
            "fleiss_kappa": fleiss_kappa(overlapping),
            "cohen_kappa": [
                {"labellers": [x, y], "pairs": shared, "kappa": kappa} for (x, y), (shared, kappa) in cohen.items()
            ],
        },
    }


def decision(row: dict[str, Any]) -> str:
    """A label as a verdict comparable across labellers: ``tie``, or which of the pair's two texts won (``first`` /
    ``second`` in sorted order of the texts, since people saw them in different orders)."""
    if row["kind"] == "tie":
        return "tie"
    chosen, rejected = _text(row["chosen"]), _text(row["rejected"])
    return "first" if chosen < rejected else "second"


def _text(answer: Any) -> str:
    if isinstance(answer, list):  # chat form: the assistant messages
        return "\n".join(str(m.get("content", "")) for m in answer if isinstance(m, dict))
    return str(answer)


def _share(won: list[bool]) -> dict[str, Any] | None:
    if not won:
        return None
    low, high = wilson_interval(sum(won), len(won))  # type: ignore[misc]
    return {"rate": sum(won) / len(won), "n": len(won), "ci95": [low, high]}


def format_stats(stats: dict[str, Any]) -> str:
    """The statistics as a few aligned lines for the console."""
    lines = [f"{stats['labels']} live labels of {stats['pairs']} pairs in {', '.join(stats['files'])}"]
    if stats["labels"]:
        lines.append(f"tie rate {_pct(stats['tie_rate'])}, skip rate {_pct(stats['skip_rate'])}")
    bias = stats["position_bias"]
    if bias:
        lines.append(
            f"position bias: the left answer won {_pct(bias['rate'])} of {bias['n']} decisions "
            f"(95% CI {_pct(bias['ci95'][0])}–{_pct(bias['ci95'][1])}; 50% = no bias)"
        )
    lines += [
        "",
        f"{'labeller':<24} {'labels':>7} {'prefs':>6} {'ties':>5} {'skips':>6} {'s/label':>8} {'left won':>9}",
    ]
    for who, row in stats["labellers"].items():
        spl = f"{row['seconds_per_label']:.1f}" if row["seconds_per_label"] is not None else "–"
        left = _pct(row["left_wins"]["rate"]) if row["left_wins"] else "–"
        lines.append(
            f"{who[:24]:<24} {row['labels']:>7} {row['preferences']:>6} {row['ties']:>5} {row['skips']:>6} {spl:>8} {left:>9}"
        )
    agreement = stats["agreement"]
    lines.append("")
    if not agreement["pairs"]:
        lines.append("agreement: no pair was decided by two labellers (set --labels_per_pair 2 or more to measure it)")
        return "\n".join(lines)
    lines.append(
        f"agreement on {agreement['pairs']} pairs decided by ≥ 2 labellers: {_pct(agreement['percent'])}, "
        f"Fleiss' kappa {_num(agreement['fleiss_kappa'])}"
    )
    for entry in agreement["cohen_kappa"]:
        x, y = entry["labellers"]
        lines.append(f"  Cohen's kappa {x} vs {y}: {_num(entry['kappa'])} over {entry['pairs']} shared pairs")
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "undefined (every label the same)" if value is None else f"{value:.3f}"
