"""``rlhf label --stats PREFS.jsonl [MORE.jsonl …]``: what the labels say about the labellers.

Over the live labels of one or more labels files (a pair's id is the same in each, so a judge can be measured against
people): counts per labeller, tie and skip rates, position bias (only labels that record the side shown) and agreement
(`rlhf.core.agreement`), as docs/labelling.md ("Statistics") describes them. A ranking counts as the k(k−1)/2 pairs it
implies, each under its `rlhf.data.labels.pair_id`: a person's ranking and another's label of two of its answers are
two labels of one pair."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from rlhf.core.agreement import fleiss_kappa, pairwise_cohen, percent_agreement, wilson_interval
from rlhf.data.files import DataError, Record, read_records
from rlhf.data.labels import is_label_file, live_labels, pair_id
from rlhf.labelling.session import Refused, check_ranking


def label_stats(paths: Sequence[str]) -> dict[str, Any]:
    """The statistics of the labels files ``paths`` as one JSON-ready dict (see the module docstring)."""
    records: list[Record] = []
    for path in paths:
        file_records = read_records(path)
        if not is_label_file(file_records):
            raise DataError(
                [f'{path}: not a labels file (no line has a "kind"); --stats reads what `rlhf label` writes']
            )
        records += live_labels(file_records)
    per: dict[str, Counter[str]] = defaultdict(Counter)  # labeller → rows per kind, and pair judgements
    seconds: dict[str, list[float]] = defaultdict(list)
    decisions: dict[str, dict[str, str]] = defaultdict(dict)  # labeller → pair → decision
    left_won: dict[str, list[bool]] = defaultdict(list)  # labeller → whether the answer shown first won, per decision
    for record in records:
        row = record.data
        who, kind = str(row.get("labeller", row.get("source", "?"))), row["kind"]
        per[who][kind] += 1
        if isinstance(row.get("seconds"), int | float):
            seconds[who].append(float(row["seconds"]))
        if kind == "ranking":
            judged = implied_pairs(record)
        elif "completions" in row:  # a tie or skip of k answers to rank (the LLM judge's listwise rows)
            judged = unranked_pairs(row)
        else:
            judged = [(str(row.get("pair")), *_pair_judgement(row))]
        for pair, verdict, first_won in judged:
            per[who]["judged " + ("skip" if verdict is None else "tie" if verdict == "tie" else "preference")] += 1
            per[who]["implied"] += kind == "ranking"
            if verdict is not None:
                decisions[who][pair] = verdict
            if first_won is not None:
                left_won[who].append(first_won)
    labellers = {
        who: {
            "labels": sum(counts[kind] for kind in ("preference", "ranking", "tie", "skip")),
            "rankings": counts["ranking"],
            "preferences": counts["judged preference"],
            "ties": counts["judged tie"],
            "skips": counts["skip"],
            "seconds_per_label": sum(seconds[who]) / len(seconds[who]) if seconds[who] else None,
            "left_wins": _share(left_won[who]),
        }
        for who, counts in sorted(per.items())
    }
    total = sum(per.values(), Counter[str]())
    n = sum(row["labels"] for row in labellers.values())
    judged = total["judged preference"] + total["judged tie"] + total["judged skip"]
    items = defaultdict(list)
    for by_pair in decisions.values():
        for pair, verdict in by_pair.items():
            items[pair].append(verdict)
    overlapping = [labels for labels in items.values() if len(labels) >= 2]
    cohen = pairwise_cohen(decisions)
    return {
        "files": list(paths),
        "labels": n,
        "rankings": total["ranking"],
        "ranking_pairs": total["implied"],
        "pairs": len(
            {pair for by_pair in decisions.values() for pair in by_pair}
            | {str(r.data["pair"]) for r in records if "pair" in r.data}
        ),  # fmt: skip
        "labellers": labellers,
        "tie_rate": total["judged tie"] / judged if judged else None,
        "skip_rate": total["judged skip"] / judged if judged else None,
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


def _pair_judgement(row: dict[str, Any]) -> tuple[str | None, bool | None]:
    """(decision, or None for a skip; whether the answer shown on the left won, when the row records it and one
    answer won) of a pair label."""
    if row["kind"] == "skip":
        return None, None
    first_won = (
        row["left"] == "chosen" if row["kind"] == "preference" and row.get("left") in ("chosen", "rejected") else None
    )
    return decision(row), first_won


def implied_pairs(record: Record) -> list[tuple[str, str, bool | None]]:
    """The k(k−1)/2 pairs a ranking row implies: (their `pair_id`, the decision — which text won, or ``tie`` for two
    answers tied —, whether the answer shown earlier won: None for a tie, or when the row has no ``shown``).
    `DataError` (``file:line``) when the ranking does not rank each of its completions once."""
    row = record.data
    texts = [_text(c) for c in row.get("completions") or []]
    try:
        tiers = [e if isinstance(e, list) else [e] for e in check_ranking(row.get("ranking"), k=len(texts))]
    except Refused as error:
        raise DataError([f"{record.where}: {error}"]) from None
    place = {i: t for t, tier in enumerate(tiers) for i in tier}
    shown = row.get("shown")
    position = {index: p for p, index in enumerate(shown)} if isinstance(shown, list) else None
    pairs = []
    for i, j in itertools.combinations(range(len(texts)), 2):
        pid = pair_id(row.get("prompt"), texts[i], texts[j])
        if place[i] == place[j]:
            pairs.append((pid, "tie", None))
            continue
        won, lost = (i, j) if place[i] < place[j] else (j, i)
        first_won = None if position is None else position[won] < position[lost]
        pairs.append((pid, "first" if texts[won] < texts[lost] else "second", first_won))
    return pairs


def unranked_pairs(row: dict[str, Any]) -> list[tuple[str, str | None, None]]:
    """The k(k−1)/2 pairs of a tie or skip row over k answers: each a tie, or each skipped (None)."""
    texts = [_text(c) for c in row.get("completions") or []]
    verdict = "tie" if row["kind"] == "tie" else None
    return [(pair_id(row.get("prompt"), a, b), verdict, None) for a, b in itertools.combinations(texts, 2)]


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
    rankings = f" ({stats['rankings']} rankings, implying {stats['ranking_pairs']} pairs)" if stats["rankings"] else ""
    lines = [f"{stats['labels']} live labels{rankings} of {stats['pairs']} pairs in {', '.join(stats['files'])}"]
    if stats["labels"]:
        per = " (of pair judgements; a ranking is its pairs)" if stats["rankings"] else ""
        lines.append(f"tie rate {_pct(stats['tie_rate'])}, skip rate {_pct(stats['skip_rate'])}{per}")
    bias = stats["position_bias"]
    if bias:
        lines.append(
            f"position bias: the answer shown first (left, or earlier in a ranking) won {_pct(bias['rate'])} of "
            f"{bias['n']} decisions "
            f"(95% CI {_pct(bias['ci95'][0])}–{_pct(bias['ci95'][1])}; 50% = no bias)"
        )
    lines += [
        "",
        f"{'labeller':<24} {'labels':>7} {'ranks':>6} {'prefs':>6} {'ties':>5} {'skips':>6} {'s/label':>8} "
        f"{'first won':>9}",
    ]
    for who, row in stats["labellers"].items():
        spl = f"{row['seconds_per_label']:.1f}" if row["seconds_per_label"] is not None else "–"
        left = _pct(row["left_wins"]["rate"]) if row["left_wins"] else "–"
        lines.append(
            f"{who[:24]:<24} {row['labels']:>7} {row['rankings']:>6} {row['preferences']:>6} {row['ties']:>5} "
            f"{row['skips']:>6} {spl:>8} {left:>9}"
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
