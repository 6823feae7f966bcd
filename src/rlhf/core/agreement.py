"""Agreement between labellers, and position bias: the statistics of ``rlhf label --stats``.

Pure Python over category labels (a labeller's verdict on a pair: ``a``, ``b`` or ``tie``); no tensors.

- Percent agreement: of all pairs of labellers who labelled the same item, the fraction that agree.
- Cohen's kappa (two labellers): ``κ = (p_o − p_e) / (1 − p_e)``, ``p_o`` their observed agreement on the items
  both labelled, ``p_e = Σ_k p₁(k)·p₂(k)`` the agreement expected from each one's own label frequencies
  (Cohen 1960).
- Fleiss' kappa (any number of labellers per item): ``κ = (P̄ − P̄_e) / (1 − P̄_e)`` with
  ``P_i = Σ_k n_ik(n_ik − 1) / (n_i(n_i − 1))`` the agreement on item i, ``P̄`` its mean over items,
  ``p_k = Σ_i n_ik / Σ_i n_i`` and ``P̄_e = Σ_k p_k²`` (Fleiss 1971; with n_i varying per item, the usual
  generalisation). Items with fewer than two labels carry no agreement and are left out.

A kappa is None where it is undefined (every label the same category, so ``1 − p_e = 0``, or no overlap).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence


def percent_agreement(items: Sequence[Sequence[str]]) -> float | None:
    """Fraction of agreeing pairs of labels among all pairs of labels given to the same item."""
    agree = total = 0
    for labels in items:
        n = len(labels)
        agree += sum(c * (c - 1) for c in Counter(labels).values())
        total += n * (n - 1)
    return agree / total if total else None


def cohen_kappa(first: Sequence[str], second: Sequence[str]) -> float | None:
    """Cohen's kappa of two labellers' labels of the same items (``first[i]`` and ``second[i]``: item i)."""
    if len(first) != len(second):
        raise ValueError(
            f"cohen_kappa: {len(first)} and {len(second)} labels; give both labellers' labels of the same items"
        )
    n = len(first)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(first, second, strict=True)) / n
    count_1, count_2 = Counter(first), Counter(second)
    expected = sum(count_1[k] * count_2[k] for k in count_1) / (n * n)
    return None if math.isclose(expected, 1.0) else (observed - expected) / (1 - expected)


def fleiss_kappa(items: Sequence[Sequence[str]]) -> float | None:
    """Fleiss' kappa over items with at least two labels each (others are left out)."""
    rated = [Counter(labels) for labels in items if len(labels) >= 2]
    if not rated:
        return None
    per_item = [
        sum(c * (c - 1) for c in counts.values()) / (n * (n - 1)) for counts in rated for n in [sum(counts.values())]
    ]
    p_bar = sum(per_item) / len(per_item)
    totals: Counter[str] = Counter()
    for counts in rated:
        totals.update(counts)
    all_labels = sum(totals.values())
    p_e = sum((c / all_labels) ** 2 for c in totals.values())
    return None if math.isclose(p_e, 1.0) else (p_bar - p_e) / (1 - p_e)


def pairwise_cohen(labels: Mapping[str, Mapping[str, str]]) -> dict[tuple[str, str], tuple[int, float | None]]:
    """Cohen's kappa of every two labellers over the items both labelled: ``{(x, y): (overlap, kappa)}``. ``labels`` is
    labeller → item → label; pairs of labellers with no shared item are left out."""
    names = sorted(labels)
    out: dict[tuple[str, str], tuple[int, float | None]] = {}
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            shared = sorted(set(labels[x]) & set(labels[y]))
            if shared:
                out[(x, y)] = (len(shared), cohen_kappa([labels[x][k] for k in shared], [labels[y][k] for k in shared]))
    return out


def wilson_interval(successes: float, n: int, z: float = 1.959963984540054) -> tuple[float, float] | None:
    """95 % (by default) Wilson score interval of a proportion ``successes / n``; None when n = 0. ``successes``
    may be fractional (a win rate that counts ties as half a win)."""
    if n == 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
