"""The training doctor's rules: pure functions over a run's metric history that recognise the classic RLHF
failures and name the fix to try. No model code, no torch: a rule reads ``metrics.jsonl`` rows (and the run's
config, for limits such as ``max_new_tokens``) and nothing else.

A rule's ``check(history)`` looks at the history *up to its last row* and returns the evidence (a sentence with
the numbers) when the failure shows there, else None. `Watch` follows the rules row by row and says when each
finding starts and clears; it serves a finished run (`diagnose` replays the rows through one) and a live one
(the trainer hands it each row it logs), so a finding starts and clears at the same steps in both. A row that
holds none of a rule's metrics (an evaluation-only row, say) leaves that rule as it was. Checks look back over
a few rows only and most require the condition for several steps in a row (``patience``) to start, and
``Rule.hold`` quiet rows to clear, so a noisy metric does not make an alarm flap.

Every threshold below is a default with its reason in the rule's ``threshold`` and ``reason`` text, which the
README lists; the values were checked to stay silent on the healthy runs of the demo (tests/doctor/fixtures).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


class History:
    """A run's metric rows (each with ``step``) and its config, with fast per-metric series.

    ``upto(n)`` is the history of the first ``n`` rows, sharing the parsed series (no copy), so replaying a
    run of N steps costs O(N · window) per rule, not O(N²).
    """

    def __init__(
        self, rows: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None = None, end: int | None = None
    ):
        self.rows = list(rows)
        self.config = config or {}
        self.end = len(self.rows) if end is None else end
        self._series: dict[str, tuple[list[int], list[int], list[float]]] = {}
        self._prefixes: dict[tuple[str, str], list[float]] = {}

    def upto(self, end: int) -> History:
        view = History([], self.config, end)
        # the same rows, parsed series and prefix statistics; only the end moves
        view.rows, view._series, view._prefixes = self.rows, self._series, self._prefixes
        return view

    def append(self, row: Mapping[str, Any]) -> None:
        """One more row at the end (a live run's newest step); the parsed series grow with it."""
        index = len(self.rows)
        self.rows.append(row)
        for key, (indices, steps, values) in self._series.items():
            if _finite(row.get(key)):
                indices.append(index)
                steps.append(int(row.get("step", index + 1)))
                values.append(float(row[key]))
        self.end = len(self.rows)

    @property
    def step(self) -> int:
        """The step of the last row (0 for an empty history)."""
        return int(self.rows[self.end - 1].get("step", 0)) if self.end else 0

    def last_row(self) -> Mapping[str, Any]:
        return self.rows[self.end - 1] if self.end else {}

    def values(self, key: str) -> list[float]:
        """The finite values of ``key`` up to the last row, in order."""
        indices, _, values = self._parsed(key)
        return values[: bisect.bisect_left(indices, self.end)]

    def steps(self, key: str) -> list[int]:
        indices, steps, _ = self._parsed(key)
        return steps[: bisect.bisect_left(indices, self.end)]

    def prefix(self, name: str, key: str, fn: Callable[[list[float], int, list[float]], float]) -> list[float]:
        """A statistic of ``key``'s values at each position i, ``fn(values, i, out)`` from ``values[: i + 1]`` and
        the earlier ``out``; computed once per position and kept, so a check over the whole history (a running
        peak, a running minimum) costs O(1) per new row instead of O(rows). Index it below ``len(values(key))``."""
        values = self._parsed(key)[2]
        out = self._prefixes.setdefault((name, key), [])
        for i in range(len(out), len(values)):
            out.append(fn(values, i, out))
        return out

    def current(self, key: str) -> float | None:
        """``key`` in the last row when it holds a finite number, else None."""
        value = self.last_row().get(key)
        return float(value) if _finite(value) else None

    def setting(self, *path: str, default: Any = None) -> Any:
        """A value of the run's config (``setting("sampling", "max_new_tokens")``), or ``default``."""
        node: Any = self.config
        for part in path:
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node

    def _parsed(self, key: str) -> tuple[list[int], list[int], list[float]]:
        if key not in self._series:
            indices, steps, values = [], [], []
            for i, row in enumerate(self.rows):
                value = row.get(key)
                if _finite(value):
                    indices.append(i)
                    steps.append(int(row.get("step", i + 1)))
                    values.append(float(value))
            self._series[key] = (indices, steps, values)
        return self._series[key]


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One classic failure: what it reads, when it fires (``threshold``, and why: ``reason``), how bad it is,
    what it means in plain words and the config fields to change."""

    name: str
    severity: Severity
    metrics: tuple[str, ...]
    threshold: str
    reason: str
    diagnosis: str
    fix: str
    check: Callable[[History], str | None]
    hold: int = 3
    """Rows in a row without the condition before a finding clears: a condition that comes and goes with the
    noise is one finding, not an alarm that flaps. 1 for one-step events (a spike, a jump, a NaN); for a rule
    that needs its condition in each of its last k rows, k + 2, since one dip silences the check for k rows."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """A rule that fired: the steps where it held, grouped into episodes (runs of consecutive logged rows, as
    (first step, last step)), and the evidence at the first and the last of them."""

    rule: Rule
    steps: list[int]
    episodes: list[tuple[int, int]]
    first: str
    last: str

    @property
    def steps_text(self) -> str:
        """The episodes as people read them: ``3, 8–12``."""
        return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in self.episodes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule.name,
            "severity": self.rule.severity,
            "steps": self.episodes,
            "evidence": self.last,
            "first_evidence": self.first,
            "diagnosis": self.rule.diagnosis,
            "fix": self.rule.fix,
            "metrics": list(self.rule.metrics),
        }


def count_text(findings: Sequence[Finding]) -> str:
    """The findings counted by severity, most severe first (``1 critical, 2 warnings``); "" for none."""
    counts = {s: sum(f.rule.severity == s for f in findings) for s in reversed(SEVERITIES)}
    return ", ".join(f"{n} {s}{'s' if n > 1 and s != 'info' else ''}" for s, n in counts.items() if n)


@dataclasses.dataclass(frozen=True)
class Event:
    """A finding starting (``start``) or clearing (``clear``) at ``step``, with the evidence (for a clear, the
    last evidence while it held)."""

    kind: Literal["start", "clear"]
    step: int
    rule: Rule
    evidence: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "event": self.kind,
            "rule": self.rule.name,
            "severity": self.rule.severity,
            "evidence": self.evidence,
            "diagnosis": self.rule.diagnosis,
            "fix": self.rule.fix,
        }

    def message(self) -> str:
        """One line for the console."""
        if self.kind == "clear":
            return f"doctor: step {self.step}: {self.rule.name} cleared"
        return (
            f"doctor: step {self.step}: [{self.rule.severity}] {self.rule.name}: {self.rule.diagnosis} "
            f"({self.evidence}); try: {self.rule.fix}"
        )


class Watch:
    """The rules followed row by row: `observe` takes the next logged row and returns the findings that start
    or clear there; `holding` is what holds now, `findings()` everything that held so far.

    A finding starts at the first row where its check fires and clears once the check has been silent for
    ``rule.hold`` rows in a row; its episodes span from a start to the last row where the check fired.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, rules: Sequence[Rule] | None = None):
        self.history = History([], config)
        self.rules = RULES if rules is None else tuple(rules)
        self.holding: dict[str, str] = {}
        """Rule name → its latest evidence, for the findings that hold at the last row."""
        self._held: dict[str, list[Any]] = {}  # rule name → [steps fired, episodes, first evidence, last evidence]
        self._silent: dict[str, int] = {}  # rule name → rows since its check last fired, while it holds

    def observe(self, row: Mapping[str, Any]) -> list[Event]:
        self.history.append(row)
        step, events = self.history.step, []
        for rule in self.rules:
            if not any(key in row for key in rule.metrics):
                continue  # a row without any of the rule's metrics says nothing new about it
            found, name = rule.check(self.history), rule.name
            if found is None:
                if name in self.holding:
                    self._silent[name] += 1
                    if self._silent[name] >= rule.hold:
                        events.append(Event("clear", step, rule, self.holding.pop(name)))
                continue
            held = self._held.setdefault(name, [[], [], found, found])
            held[0].append(step)
            held[3] = found
            if name in self.holding:
                held[1][-1] = (held[1][-1][0], step)
            else:
                held[1].append((step, step))
                events.append(Event("start", step, rule, found))
            self.holding[name], self._silent[name] = found, 0
        return events

    def now(self) -> list[tuple[Rule, int, str]]:
        """The findings that hold at the last row, most severe first: (rule, the step it started, evidence)."""
        holding = [
            (rule, self._held[rule.name][1][-1][0], self.holding[rule.name])
            for rule in self.rules
            if rule.name in self.holding
        ]
        return sorted(holding, key=lambda h: -SEVERITIES.index(h[0].severity))

    def findings(self) -> list[Finding]:
        """Every rule that held at some row so far, most severe first."""
        found = [
            Finding(rule, list(steps), list(episodes), first, last)
            for rule in self.rules
            if rule.name in self._held
            for steps, episodes, first, last in [self._held[rule.name]]
        ]
        return sorted(found, key=lambda f: -SEVERITIES.index(f.rule.severity))


def diagnose(history: History, rules: Sequence[Rule] | None = None) -> list[Finding]:
    """Every rule replayed over the history, row by row (as a live `Watch` sees it): the findings, most severe
    first."""
    watch = Watch(history.config, rules)
    for row in history.rows[: history.end]:
        watch.observe(row)
    return watch.findings()


# ---------------------------------------------------------------------------------------------------------------
# Helpers of the checks
# ---------------------------------------------------------------------------------------------------------------


def _tail(values: Sequence[float], n: int) -> list[float] | None:
    """The last ``n`` values, or None when there are fewer."""
    return list(values[-n:]) if len(values) >= n else None


def _start(values: Sequence[float], n: int = 3) -> float:
    """The median of the first ``n`` values: where a metric started, robust to one odd first step."""
    return statistics.median(values[:n])


def _all_above(h: History, key: str, limit: float, patience: int) -> list[float] | None:
    last = _tail(h.values(key), patience)
    if last is None or h.current(key) is None:  # the last row must hold the metric: it is about now
        return None
    return last if all(v > limit for v in last) else None


# ---------------------------------------------------------------------------------------------------------------
# The checks, one per rule (evidence or None)
# ---------------------------------------------------------------------------------------------------------------

NON_FINITE_KEYS = ("policy/loss", "value/loss", "train/loss", "grad/norm", "reward/mean", "kl/mean")


def non_finite(h: History) -> str | None:
    row = h.last_row()
    bad = [key for key in NON_FINITE_KEYS if key in row and not _finite(row[key])]
    if "reward/mean" in bad and row.get("reward/unscored"):
        bad.remove("reward/mean")  # no sample could be scored: the step was skipped, which is reported elsewhere
    return f"{', '.join(f'{k} = {row[k]}' for k in bad)} at step {h.step}" if bad else None


def first_ratio(h: History) -> str | None:
    dev = h.current("policy/first_ratio_max_dev")
    return (
        f"max |ratio − 1| on the first minibatch = {dev:.3g} at step {h.step} (must be 0)"
        if dev and dev > 1e-3
        else None
    )


def kl_blowup(h: History) -> str | None:
    kls = h.values("kl/mean")
    now = h.current("kl/mean")
    if now is None or len(kls) < 2:  # from the second row: a first update that wrecks the policy shows at step 2
        return None
    before = max(kls[-4:-1])  # the largest of the (up to) 3 steps before: steady growth never triples in one step
    if now > 3 * max(before, 0.0) and now - before > 2.0:
        return f"kl/mean {now:.3g} at step {h.step}, {now / max(before, 1e-9):.1f}× the steps before (at most {before:.3g})"
    return None


def kl_above_target(h: History) -> str | None:
    target = h.setting("kl", "target")
    if h.setting("kl", "control") != "adaptive" or not _finite(target):
        return None
    last = _all_above(h, "kl/mean", 2 * target, 5)
    return f"kl/mean {last[-1]:.3g} > 2 × kl.target {target:g} for the last 5 steps" if last else None


def entropy_collapse(h: History) -> str | None:
    values = h.values("policy/entropy")
    if len(values) < 6 or h.current("policy/entropy") is None:
        return None
    start, now = _start(values), statistics.fmean(values[-3:])
    if now < 0.05 or (start > 0 and now < 0.1 * start):
        return f"policy/entropy {now:.3g} nats per token (mean of the last 3 steps), started at {start:.3g}"
    return None


def critic_worse_than_mean(h: History) -> str | None:
    if h.step <= 10:
        return None  # the value head starts at 0: a young critic predicts worse than the mean
    last = _tail(h.values("value/explained_variance"), 10)
    if last is None or h.current("value/explained_variance") is None or not all(v < 0 for v in last):
        return None
    return f"value/explained_variance < 0 for the last 10 steps (now {last[-1]:.3g})"


def value_loss_rising(h: History) -> str | None:
    values = h.values("value/loss")
    if len(values) < 15 or h.current("value/loss") is None:
        return None
    recent = statistics.median(values[-5:])
    # the lowest median of 5 consecutive steps before the last five: a running minimum, kept by the history
    lowest = h.prefix(
        "min_median5",
        "value/loss",
        lambda v, i, out: math.inf if i < 4 else min(out[i - 1], statistics.median(v[i - 4 : i + 1])),
    )
    best = lowest[len(values) - 2]
    if recent > 5 * best and all(b > a for a, b in zip(values[-4:-1], values[-3:], strict=True)):
        return f"value/loss {values[-1]:.3g}, median of the last 5 steps {recent:.3g} = {recent / best:.1f}× its lowest ({best:.3g})"
    return None


def value_clip_saturated(h: History) -> str | None:
    last = _all_above(h, "value/clipfrac", 0.9, 5)
    return f"value/clipfrac {last[-1]:.2f} (> 0.9 for the last 5 steps)" if last else None


def clipfrac_high(h: History) -> str | None:
    last = _all_above(h, "policy/clipfrac", 0.3, 5)
    return f"policy/clipfrac {last[-1]:.2f} (> 0.3 for the last 5 steps)" if last else None


def approx_kl_high(h: History) -> str | None:
    last = _all_above(h, "policy/approx_kl", 0.1, 3)
    return f"policy/approx_kl {last[-1]:.3g} (> 0.1 for the last 3 steps)" if last else None


def _updates_per_rollout(h: History) -> int:
    """Optimizer steps per sampled batch from the config (1: the ratio is 1 by construction)."""
    ppo, grpo = h.setting("ppo"), h.setting("grpo")
    section = ppo if isinstance(ppo, Mapping) else grpo if isinstance(grpo, Mapping) else {}
    passes = section.get("epochs", section.get("num_iterations", 1))
    return int(passes) * int(section.get("num_minibatches", 1))


def nothing_moves(h: History) -> str | None:
    if _updates_per_rollout(h) <= 1:
        return None  # one update per rollout: the ratio is exactly 1, clipfrac and approx-KL are 0 by design
    clip, kl = _tail(h.values("policy/clipfrac"), 10), _tail(h.values("policy/approx_kl"), 10)
    if clip is None or kl is None or h.current("policy/approx_kl") is None:
        return None
    if max(clip) < 1e-4 and max(kl) < 1e-8:
        return f"policy/clipfrac ≤ {max(clip):.2g} and policy/approx_kl ≤ {max(kl):.2g} for the last 10 steps"
    return None


def _drift(h: History, key: str) -> tuple[float, list[float]] | None:
    """(where ``key`` started, its last 5 values) once it has 8 values and the last row holds it, else None: what
    the rules about a metric drifting away from its start compare."""
    values = h.values(key)
    if len(values) < 8 or h.current(key) is None:
        return None
    return _start(values), values[-5:]


def length_to_max(h: History) -> str | None:
    limit = h.setting("sampling", "max_new_tokens")
    drift = _drift(h, "response/length_mean")
    if not _finite(limit) or drift is None:
        return None
    start, last = drift
    # the mean, not every step: on a small batch one answer that still ends early pulls a step below the limit
    if start < 0.8 * limit and statistics.fmean(last) >= 0.93 * limit:
        return f"response/length_mean {last[-1]:.3g} of max_new_tokens {limit}, started at {start:.3g}"
    return None


def length_to_one(h: History) -> str | None:
    drift = _drift(h, "response/length_mean")
    if drift is None:
        return None
    start, last = drift
    if start > 3 and all(v <= 1.5 for v in last):
        return f"response/length_mean {last[-1]:.3g} tokens, started at {start:.3g}"
    return None


def eos_vanishing(h: History) -> str | None:
    drift = _drift(h, "response/eos_rate")
    if drift is None:
        return None
    start, last = drift
    if start >= 0.5 and all(v < min(0.5, 0.5 * start) for v in last):
        return f"response/eos_rate {last[-1]:.2f} (under half its start, {start:.2f}, for the last 5 steps)"
    return None


def no_group_signal(h: History) -> str | None:
    last = _all_above(h, "reward/zero_std_groups", 0.9 - 1e-9, 5)
    return f"{last[-1]:.0%} of the groups had equal rewards for each of the last 5 steps" if last else None


def grad_spike(h: History) -> str | None:
    norms = h.values("grad/norm")
    now = h.current("grad/norm")
    if now is None or len(norms) < 11:
        return None
    median = statistics.median(norms[-21:-1])
    if median > 0 and now > 10 * median:
        return f"grad/norm {now:.3g} at step {h.step}, {now / median:.0f}× the median of the 20 steps before ({median:.3g})"
    return None


def _monitors(h: History) -> list[str]:
    """The reward sources with weight 0 (logged, not optimised: the truth to compare the proxy with)."""
    source = h.setting("reward", "source")
    if not isinstance(source, list):
        return []
    return [str(s["name"]) for s in source if isinstance(s, Mapping) and s.get("weight") == 0 and "name" in s]


def over_optimisation(h: History) -> str | None:
    """The truth (a monitor reward, held-out or on the training batches, else the held-out reward) gave back
    more than half of what it had gained — by more than its noise — while the optimised reward kept at or
    above where it was at the truth's best."""
    monitors = _monitors(h)
    candidates = [(f"eval/reward/{m}/mean", 2) for m in monitors] + [(f"reward/{m}/mean", 5) for m in monitors]
    candidates += [("eval/reward/mean", 2)]
    # the longest series: a batch monitor logged every step outweighs a held-out one logged every eval_every
    usable = [(len(h.values(k)), -i, k, w) for i, (k, w) in enumerate(candidates) if len(h.values(k)) >= 2 * w + 2]
    _, _, truth, window = max(usable, default=(0, 0, None, 0))
    if truth is None:  # a held-out truth is logged every eval_every steps: its last value stands until the next
        return None
    steps = h.steps(truth)
    n = len(steps)
    # running statistics kept by the history (O(1) per new row): the window mean, where it peaked so far, and the
    # sums of the step-to-step differences and of their squares
    smooth = h.prefix(f"mean{window}", truth, lambda v, i, out: statistics.fmean(v[max(0, i - window + 1) : i + 1]))
    peaks = h.prefix(
        f"peak{window}", truth, lambda v, i, out: i if i == 0 or smooth[i] > smooth[int(out[i - 1])] else out[i - 1]
    )
    diff_sum = h.prefix("diff_sum", truth, lambda v, i, out: 0.0 if i == 0 else out[i - 1] + v[i] - v[i - 1])
    diff_sq = h.prefix("diff_sq", truth, lambda v, i, out: 0.0 if i == 0 else out[i - 1] + (v[i] - v[i - 1]) ** 2)
    peak = int(peaks[n - 1])
    gain, drop = smooth[peak] - smooth[0], smooth[peak] - smooth[n - 1]
    mean_diff = diff_sum[n - 1] / (n - 1)
    spread = math.sqrt(max(diff_sq[n - 1] / (n - 1) - mean_diff**2, 0.0))  # population std of the differences
    noise = spread / math.sqrt(2 * window)  # the noise of a window mean, trend removed
    proxy_now, proxy_then = _mean_near(h, "reward/mean", steps[-1]), _mean_near(h, "reward/mean", steps[peak])
    if (
        gain > 0
        and drop > 0.5 * gain
        and drop > 2 * noise
        and proxy_now is not None
        and proxy_then is not None
        and proxy_now >= proxy_then
    ):
        return (
            f"{truth} fell from {smooth[peak]:.3g} (step {steps[peak]}) to {smooth[-1]:.3g}, more than half of "
            f"its gain since step {steps[0]}, while reward/mean went from {proxy_then:.3g} to {proxy_now:.3g}"
        )
    return None


def _mean_near(h: History, key: str, step: int, width: int = 3) -> float | None:
    """The mean of ``key`` over the logged steps within ``width`` of ``step`` (a noisy batch metric)."""
    steps = h.steps(key)
    lo, hi = bisect.bisect_left(steps, step - width), bisect.bisect_right(steps, step + width)
    return statistics.fmean(h.values(key)[lo:hi]) if hi > lo else None


def accuracy_at_chance(h: History) -> str | None:
    key = next((k for k in ("rewards/accuracies", "train/accuracy") if h.values(k)), None)
    if key is None or h.step < 20 or h.current(key) is None:
        return None
    last = _tail(h.values(key), 10)
    if last is not None and abs(statistics.fmean(last) - 0.5) < 0.05:
        return f"{key} {statistics.fmean(last):.2f} over the last 10 steps (chance is 0.5)"
    return None


def eval_loss_rising(h: History) -> str | None:
    evals, train = h.values("eval/loss"), h.values("train/loss")
    if len(evals) < 4 or len(train) < 10:  # the last evaluation stands until the next one
        return None
    last = evals[-4:]
    falling = statistics.fmean(train[-5:]) < statistics.fmean(train[-10:-5])
    if all(b > a for a, b in zip(last, last[1:], strict=False)) and falling:
        return f"eval/loss rose for 3 evaluations in a row ({last[0]:.4g} → {last[-1]:.4g}) while train/loss fell"
    return None


# ---------------------------------------------------------------------------------------------------------------
# The rule set
# ---------------------------------------------------------------------------------------------------------------

RULES: tuple[Rule, ...] = (
    Rule(
        name="non_finite",
        severity="critical",
        metrics=NON_FINITE_KEYS,
        threshold="any of them NaN or ±inf",
        reason="a non-finite loss or gradient poisons every weight it touches",
        diagnosis="a loss, gradient norm, reward or KL is not a finite number",
        fix="lower optim.learning_rate, keep optim.max_grad_norm set, check the reward function for inf/NaN, and "
        "use float32 (model.dtype) if it happened in half precision",
        check=non_finite,
        hold=1,
    ),
    Rule(
        name="first_ratio_not_one",
        severity="critical",
        metrics=("policy/first_ratio_max_dev",),
        threshold="> 1e-3",
        reason="before the first update the policy is the one that sampled: the ratio must be exactly 1",
        diagnosis="the log-probs of the update do not match those of the rollout — a bug, not a tuning problem",
        fix="check dropout (must be off), sampling.temperature versus the scoring temperature, padding and "
        "position ids; report it with the run's config",
        check=first_ratio,
        hold=1,
    ),
    Rule(
        name="kl_blowup",
        severity="critical",
        metrics=("kl/mean",),
        threshold="> 3× the largest of the previous (up to) 3 steps, and up by > 2 nats",
        reason="the KL grows smoothly (at most ~1.5× a step in healthy runs); tripling in one step means one update "
        "moved the policy far",
        diagnosis="the KL to the reference jumped in one step: the policy moved far in a single update",
        fix="lower optim.learning_rate or ppo.epochs / grpo.num_iterations, raise kl.coef, or let the adaptive "
        "controller hold it (kl.control: adaptive, kl.target)",
        check=kl_blowup,
        hold=1,
    ),
    Rule(
        name="kl_above_target",
        severity="warning",
        metrics=("kl/mean", "kl/coef"),
        threshold="> 2 × kl.target for 5 steps (adaptive control)",
        reason="the adaptive controller moves β by at most 20 % per batch·horizon; twice the target for 5 steps is "
        "more than it is catching up",
        diagnosis="the KL stays far above the target the controller is steering to",
        fix="raise kl.coef (the starting β) or lower kl.horizon so β reacts faster; lower optim.learning_rate",
        check=kl_above_target,
        hold=7,
    ),
    Rule(
        name="entropy_collapse",
        severity="warning",
        metrics=("policy/entropy",),
        threshold="< 10 % of its start, or < 0.05 nats per token",
        reason="a policy this certain stops exploring: every sample is the same answer",
        diagnosis="the policy's entropy collapsed: it samples nearly the same tokens every time",
        fix="raise the entropy bonus (ppo.entropy_coef / grpo.entropy_coef), raise kl.coef, lower "
        "optim.learning_rate, or sample at a higher sampling.temperature",
        check=entropy_collapse,
    ),
    Rule(
        name="critic_worse_than_mean",
        severity="warning",
        metrics=("value/explained_variance",),
        threshold="< 0 for 10 steps after step 10",
        reason="explained variance < 0 means predicting the mean return would be better than the critic",
        diagnosis="the critic predicts the returns worse than a constant: GAE advantages are mostly noise",
        fix="raise ppo.vf_coef or optim.learning_rate for the critic, use ppo.critic: separate (initialised from the "
        "reward model), or turn on ppo.whiten_rewards",
        check=critic_worse_than_mean,
        hold=12,
    ),
    Rule(
        name="value_loss_rising",
        severity="warning",
        metrics=("value/loss",),
        threshold="median of 5 steps > 5× its lowest, and rising",
        reason="a value loss that climbs back up means the critic is diverging from the returns",
        diagnosis="the critic is diverging: its loss keeps rising",
        fix="lower optim.learning_rate, lower ppo.vf_coef, keep ppo.value_clip_range at 0.2, or whiten rewards "
        "(ppo.whiten_rewards)",
        check=value_loss_rising,
    ),
    Rule(
        name="value_clip_saturated",
        severity="warning",
        metrics=("value/clipfrac",),
        threshold="> 0.9 for 5 steps",
        reason="when nearly every value is clipped the critic can hardly move",
        diagnosis="almost every value prediction is clipped: the critic is stuck far from the returns",
        fix="raise ppo.value_clip_range, or rescale the rewards (ppo.whiten_rewards, a normalised reward model)",
        check=value_clip_saturated,
        hold=7,
    ),
    Rule(
        name="clipfrac_high",
        severity="warning",
        metrics=("policy/clipfrac",),
        threshold="> 0.3 for 5 steps",
        reason="PPO's clip is a brake; hitting it on a third of the tokens means each update tries to go too far",
        diagnosis="the updates are too large: the clip cuts a large share of the tokens",
        fix="lower optim.learning_rate, ppo.epochs / grpo.num_iterations, or raise num_minibatches",
        check=clipfrac_high,
        hold=7,
    ),
    Rule(
        name="approx_kl_high",
        severity="warning",
        metrics=("policy/approx_kl",),
        threshold="> 0.1 for 3 steps",
        reason="per-update KL of 0.01–0.05 is typical; above 0.1 the old log-probs no longer describe the policy",
        diagnosis="each update moves the policy far from the one that sampled the batch",
        fix="lower optim.learning_rate or ppo.epochs / grpo.num_iterations; raise num_minibatches",
        check=approx_kl_high,
        hold=5,
    ),
    Rule(
        name="nothing_moves",
        severity="warning",
        metrics=("policy/clipfrac", "policy/approx_kl"),
        threshold="clipfrac < 1e-4 and approx-KL < 1e-8 for 10 steps (several updates per rollout)",
        reason="with several updates per rollout the later ones must see a moved policy",
        diagnosis="the policy does not change between updates: nothing is being learnt",
        fix="raise optim.learning_rate, check that the rewards vary (reward/std) and that the advantages are not 0 "
        "(advantages/abs_mean)",
        check=nothing_moves,
        hold=12,
    ),
    Rule(
        name="length_to_max",
        severity="warning",
        metrics=("response/length_mean",),
        threshold="mean of the last 5 steps ≥ 93 % of max_new_tokens, from < 80 %",
        reason="responses that all run to the limit usually game a reward that pays for length",
        diagnosis="the responses grow to max_new_tokens: the reward may be paying for length",
        fix="add a length penalty or a missing-EOS penalty (reward.missing_eos_penalty), raise kl.coef, or check the "
        "reward model's bias for long answers",
        check=length_to_max,
        hold=7,
    ),
    Rule(
        name="length_to_one",
        severity="warning",
        metrics=("response/length_mean",),
        threshold="≤ 1.5 tokens for 5 steps, from > 3",
        reason="an empty answer that scores well means the reward favours saying nothing",
        diagnosis="the responses shrank to (almost) nothing",
        fix="check the reward for short or empty answers (a floor, a missing-EOS penalty that is too large), raise kl.coef",
        check=length_to_one,
        hold=7,
    ),
    Rule(
        name="eos_vanishing",
        severity="warning",
        metrics=("response/eos_rate",),
        threshold="< half its start (and < 0.5) for 5 steps",
        reason="a policy that stops ending its answers is usually being paid for length, or cut at the limit",
        diagnosis="the end-of-sequence token stopped appearing",
        fix="set reward.missing_eos_penalty, raise kl.coef, or raise sampling.max_new_tokens if answers are cut",
        check=eos_vanishing,
        hold=7,
    ),
    Rule(
        name="no_group_signal",
        severity="warning",
        metrics=("reward/zero_std_groups",),
        threshold="≥ 90 % of the groups for 5 steps",
        reason="GRPO learns from differences within a group; equal rewards give zero advantages",
        diagnosis="almost every group's samples score the same: there is no learning signal",
        fix="raise grpo.group_size or sampling.temperature, use a finer-grained reward, or turn on grpo.dynamic_sampling",
        check=no_group_signal,
        hold=7,
    ),
    Rule(
        name="grad_spike",
        severity="info",
        metrics=("grad/norm",),
        threshold="> 10× the median of the previous 20 steps",
        reason="an isolated spike is clipped by optim.max_grad_norm; repeated ones precede divergence",
        diagnosis="the gradient norm spiked",
        fix="keep optim.max_grad_norm set (1.0); if spikes repeat, lower optim.learning_rate",
        check=grad_spike,
        hold=1,
    ),
    Rule(
        name="over_optimisation",
        severity="warning",
        metrics=("reward/mean", "eval/reward/mean", "reward/<monitor>/mean"),
        threshold="the truth (smoothed) gave back > ½ of its gain over the start, by > 2× its noise, while the proxy "
        "stayed at or above its level at the truth's best",
        reason="Gao et al. (2022): past some KL, a proxy reward keeps rising while the true score falls",
        diagnosis="reward hacking: the optimised reward keeps rising while the held-out (or monitor) reward falls",
        fix="raise kl.coef or use kl.control: adaptive with a kl.target, stop earlier (use the checkpoint at the "
        "best held-out step), or improve the reward model with more labels",
        check=over_optimisation,
    ),
    Rule(
        name="accuracy_at_chance",
        severity="warning",
        metrics=("rewards/accuracies", "train/accuracy"),
        threshold="|mean of 10 steps − 0.5| < 0.05 after step 20",
        reason="a preference model (or DPO policy) at 50 % has learnt nothing from the pairs",
        diagnosis="preference accuracy stays at chance",
        fix="check the labels (chosen and rejected not swapped, not random), raise optim.learning_rate, or for dpo "
        "raise dpo.beta",
        check=accuracy_at_chance,
    ),
    Rule(
        name="eval_loss_rising",
        severity="warning",
        metrics=("eval/loss", "train/loss"),
        threshold="3 rises in a row while train/loss falls",
        reason="the model fits the training set better and the held-out set worse: overfitting",
        diagnosis="the held-out loss rises while the training loss falls (overfitting)",
        fix="train fewer epochs, lower optim.learning_rate, add data or use the checkpoint before the rise",
        check=eval_loss_rising,
    ),
)
"""Every rule, in the order they are listed (the README's table)."""
