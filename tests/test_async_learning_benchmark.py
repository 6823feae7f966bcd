"""benchmarks/async_learning.py: the comparison of k = 1 against k = 0 on hand-computed runs (nothing is trained)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "async_learning.py"
_spec = importlib.util.spec_from_file_location("benchmarks_async_learning", _PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)


def run(kernel: str, seed: int, k: int, value: float) -> dict:
    return {"task": "digits", "algo": "grpo", "kernel": kernel, "seed": seed, "k": k, "numbers": {"r": value}}


def test_comparison_by_hand():
    # k = 0: 1, 3 (mean 2, sd √2); k = 1: 0, 1 (mean 0.5, sd √0.5); a failed run and a NaN are left out
    runs = [run("default", 0, 0, 1.0), run("avx2", 0, 0, 3.0), run("default", 0, 1, 0.0), run("avx2", 0, 1, 1.0)]
    runs += [run("default", 1, 1, math.nan), {**run("avx2", 1, 1, 9.0), "error": "crashed"}]
    c = bench.comparison(runs, "digits", "grpo", "r", higher_is_better=True)
    assert (c["k0"]["mean"], c["k1"]["mean"], c["delta"]) == (2.0, 0.5, -1.5)
    assert c["k0"]["sd"] == pytest.approx(math.sqrt(2)) and c["k1"]["sd"] == pytest.approx(math.sqrt(0.5))
    # |−1.5| > √2: not within the spread; −1.5 / √2 = −1.06 sd
    assert not c["within_spread"] and c["delta_over_sd"] == pytest.approx(-1.5 / math.sqrt(2))
    # paired by (kernel, seed): 0 − 1 and 1 − 3
    assert c["paired"]["mean"] == -1.5 and c["paired"]["n"] == 2
    # Welch: −1.5 / √(2/2 + 0.5/2)
    assert c["welch_t"] == pytest.approx(-1.5 / math.sqrt(1.25))
    assert c["worst"] == {"k0": 1.0, "k1": 0.0} and c["k1_inside_k0_range"] == 1  # 1.0 is inside [1, 3]
    assert c["kernels_agree"] == {"pairs": 2, "same": 0}
    assert c["per_kernel"] == {"default": {0: 1.0, 1: 0.0}, "avx2": {0: 3.0, 1: 1.0}}
