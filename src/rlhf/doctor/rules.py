"""The training doctor's rules: pure functions over a run's metric history that recognise the classic RLHF
failures and name the fix to try. No model code, no torch: a rule reads ``metrics.jsonl`` rows (and the run's
config, for limits such as ``max_new_tokens``) and nothing else.

A rule's ``check(history)`` looks at the history *up to its last row* and returns the evidence (a sentence with
the numbers) when the failure shows there, else None. `Watch` follows the rules row by row for a finished run
(`diagnose` replays the rows through one) and a live one (the trainer hands it each row it logs) alike, so a
finding starts and clears at the same steps in both; a row without any of a rule's metrics leaves that rule as
it was. Each threshold's reason is in its rule's texts; the table of rules, and why most wait several rows to
start and to clear (``Rule.hold``): the README's 'Training doctor'.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


class History:
    """A run's metric rows (each with ``step``) and its config, with per-metric series parsed once and kept, so
    following a run of N rows costs O(N · window) per rule, not O(N²)."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None = None):
        self.rows = list(rows)
        self.config = config or {}
        self._series: dict[str, tuple[list[int], list[float]]] = {}
        self._prefixes: dict[tuple[str, str], list[float]] = {}

    def append(self, row: Mapping[str, Any]) -> None:
        """One more row at the end (a live run's newest step); the parsed series grow with it."""
        self.rows.append(row)
        for key in self._series:
            self._parse(key, len(self.rows) - 1)

    @property
    def step(self) -> int:
        return int(self.rows[-1].get("step", 0)) if self.rows else 0

    def last_row(self) -> Mapping[str, Any]:
        return self.rows[-1] if self.rows else {}

    def values(self, key: str) -> list[float]:
        """The finite values of ``key``, in order (the history's own list: read it, do not change it)."""
        return self._parsed(key)[1]

    def steps(self, key: str) -> list[int]:
        return self._parsed(key)[0]

    def prefix(self, name: str, key: str, fn: Callable[[list[float], int, list[float]], float]) -> list[float]:
        """A statistic of ``key``'s values at each position i, ``fn(values, i, out)`` from ``values[: i + 1]`` and
        the earlier ``out``; computed once per position and kept, so a check over the whole history (a running
        peak, a running minimum) costs O(1) per new row instead of O(rows)."""
        values = self.values(key)
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

    def _parsed(self, key: str) -> tuple[list[int], list[float]]:
        if key not in self._series:
            self._series[key] = ([], [])
            for i in range(len(self.rows)):
                self._parse(key, i)
        return self._series[key]

    def _parse(self, key: str, i: int) -> None:
        """Row ``i`` into ``key``'s series (steps, values) when it holds a finite ``key``."""
        value = self.rows[i].get(key)
        if _finite(value):
            steps, values = self._series[key]
            steps.append(int(self.rows[i].get("step", i + 1)))
            values.append(float(value))


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
    or clear there; `holding` is what holds now, `findings()` everything that held so far. A finding starts at
    the first row where its check fires and clears once the check has been silent for ``rule.hold`` rows in a
    row; its episodes span from a start to the last row where the check fired."""

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
    for row in history.rows:
        watch.observe(row)
    return watch.findings()


# The rules: each check (evidence or None) under the texts of its rule, in the order of the README's table

Check = Callable[[History], str | None]
_RULES: list[Rule] = []


def _rule(severity: Severity, metrics: tuple[str, ...], **texts: Any) -> Callable[[Check], Check]:
    """Add the decorated check to RULES as the rule of its name, with ``texts`` (threshold, reason, diagnosis,
    fix) and ``hold``; ``@critical(metrics, …)``, ``@warning(…)`` and ``@info(…)`` give the severity."""

    def add(check: Check) -> Check:
        _RULES.append(Rule(check.__name__, severity, metrics, check=check, **texts))
        return check

    return add


critical = functools.partial(_rule, "critical")
warning = functools.partial(_rule, "warning")
info = functools.partial(_rule, "info")


def _tail(values: Sequence[float], n: int) -> list[float] | None:
    return list(values[-n:]) if len(values) >= n else None


def _start(values: Sequence[float], n: int = 3) -> float:
    """The median of the first ``n`` values: where a metric started, robust to one odd first step."""
    return statistics.median(values[:n])


def _each(h: History, key: str, n: int, holds: Callable[[float], bool]) -> list[float] | None:
    """The last ``n`` values of ``key`` when each ``holds`` and the last row holds the metric (it is about now)."""
    last = _tail(h.values(key), n)
    return last if last and h.current(key) is not None and all(map(holds, last)) else None


NON_FINITE_KEYS = ("policy/loss", "value/loss", "train/loss", "grad/norm", "reward/mean", "kl/mean")


@critical(
    NON_FINITE_KEYS,
    threshold="any of them NaN or ±inf",
    reason="a non-finite loss or gradient poisons every weight it touches",
    diagnosis="a loss, gradient norm, reward or KL is not a finite number",
    fix="lower optim.learning_rate, keep optim.max_grad_norm set, check the reward function for inf/NaN, and "
    "use float32 (model.dtype) if it happened in half precision",
    hold=1,
)
def non_finite(h: History) -> str | None:
    row = h.last_row()
    bad = [key for key in NON_FINITE_KEYS if key in row and not _finite(row[key])]
    if "reward/mean" in bad and row.get("reward/unscored"):
        bad.remove("reward/mean")  # no sample could be scored: the step was skipped, which is reported elsewhere
    return f"{', '.join(f'{k} = {row[k]}' for k in bad)} at step {h.step}" if bad else None


@critical(
    ("policy/first_ratio_max_dev",),
    threshold="> 1e-3",
    reason="before the first update the policy is the one that sampled: the ratio must be exactly 1",
    diagnosis="the log-probs of the update do not match those of the rollout — a bug, not a tuning problem",
    fix="check dropout (must be off), sampling.temperature versus the scoring temperature, padding and "
    "position ids; report it with the run's config",
    hold=1,
)
def first_ratio_not_one(h: History) -> str | None:
    dev = h.current("policy/first_ratio_max_dev")
    if dev and dev > 1e-3:
        return f"max |ratio − 1| on the first minibatch = {dev:.3g} at step {h.step} (must be 0)"
    return None


@warning(
    ("rollout/logprob_diff_mean",),
    threshold="mean of the last 3 steps > 0.05 nats per token and > 3× where it started (median of the first 3)",
    reason="the engine that samples and the trainer compute the same policy; rounding keeps them a steady small "
    "distance apart, so a gap that grows means the engine's weights or numerics drift from the trainer's, and "
    "every update is off-policy by that much",
    diagnosis="the sampler's log-probs drift away from the trainer's: each rollout is more off-policy than the last",
    fix="with sampling.engine vllm: check that the weights reach it (a server's version, docs/vllm.md), sample in "
    "the trainer's dtype (model.dtype), and turn on sampling.is_correction: token; with rlhf's own engines it is a "
    "bug: report it with the run's config",
)
def mismatch_growing(h: History) -> str | None:
    values = h.values("rollout/logprob_diff_mean")
    if len(values) < 6 or h.current("rollout/logprob_diff_mean") is None:
        return None
    start, now = _start(values), statistics.fmean(values[-3:])
    if now > 0.05 and now > 3 * start:
        return f"rollout/logprob_diff_mean {now:.3g} nats per token (mean of the last 3 steps), started at {start:.3g}"
    return None


@critical(
    ("kl/mean",),
    threshold="> 3× the largest of the previous (up to) 3 steps, and up by > 2 nats",
    reason="the KL grows smoothly (at most ~1.5× a step in healthy runs); tripling in one step means one update "
    "moved the policy far",
    diagnosis="the KL to the reference jumped in one step: the policy moved far in a single update",
    fix="lower optim.learning_rate or ppo.epochs / grpo.num_iterations, raise kl.coef, or let the adaptive "
    "controller hold it (kl.control: adaptive, kl.target)",
    hold=1,
)
def kl_blowup(h: History) -> str | None:
    kls, now = h.values("kl/mean"), h.current("kl/mean")
    if now is None or len(kls) < 2:  # from the second row: a first update that wrecks the policy shows at step 2
        return None
    before = max(kls[-4:-1])  # the largest of the (up to) 3 steps before: steady growth never triples in one step
    if now > 3 * max(before, 0.0) and now - before > 2.0:
        return f"kl/mean {now:.3g} at step {h.step}, {now / max(before, 1e-9):.1f}× the steps before (at most {before:.3g})"
    return None


@warning(
    ("kl/mean", "kl/coef"),
    threshold="> 2 × kl.target for 5 steps (adaptive control)",
    reason="the adaptive controller moves β by at most 20 % per batch·horizon; twice the target for 5 steps is "
    "more than it is catching up",
    diagnosis="the KL stays far above the target the controller is steering to",
    fix="raise kl.coef (the starting β) or lower kl.horizon so β reacts faster; lower optim.learning_rate",
    hold=7,
)
def kl_above_target(h: History) -> str | None:
    target = h.setting("kl", "target")
    if h.setting("kl", "control") != "adaptive" or not _finite(target):
        return None
    last = _each(h, "kl/mean", 5, lambda v: v > 2 * target)
    return f"kl/mean {last[-1]:.3g} > 2 × kl.target {target:g} for the last 5 steps" if last else None


@warning(
    ("policy/entropy",),
    threshold="< 10 % of its start, or < 0.05 nats per token",
    reason="a policy this certain stops exploring: every sample is the same answer",
    diagnosis="the policy's entropy collapsed: it samples nearly the same tokens every time",
    fix="raise the entropy bonus (ppo.entropy_coef / grpo.entropy_coef), raise kl.coef, lower "
    "optim.learning_rate, or sample at a higher sampling.temperature",
)
def entropy_collapse(h: History) -> str | None:
    values = h.values("policy/entropy")
    if len(values) < 6 or h.current("policy/entropy") is None:
        return None
    start, now = _start(values), statistics.fmean(values[-3:])
    if now < 0.05 or (start > 0 and now < 0.1 * start):
        return f"policy/entropy {now:.3g} nats per token (mean of the last 3 steps), started at {start:.3g}"
    return None


@warning(
    ("value/explained_variance",),
    threshold="< 0 for 10 steps after step 10",
    reason="explained variance < 0 means predicting the mean return would be better than the critic",
    diagnosis="the critic predicts the returns worse than a constant: GAE advantages are mostly noise",
    fix="raise ppo.vf_coef or optim.learning_rate for the critic, use ppo.critic: separate (initialised from the "
    "reward model), or turn on ppo.whiten_rewards",
    hold=12,
)
def critic_worse_than_mean(h: History) -> str | None:
    if h.step <= 10:
        return None  # the value head starts at 0: a young critic predicts worse than the mean
    last = _each(h, "value/explained_variance", 10, lambda v: v < 0)
    return f"value/explained_variance < 0 for the last 10 steps (now {last[-1]:.3g})" if last else None


@warning(
    ("value/loss",),
    threshold="median of 5 steps > 5× its lowest, and rising",
    reason="a value loss that climbs back up means the critic is diverging from the returns",
    diagnosis="the critic is diverging: its loss keeps rising",
    fix="lower optim.learning_rate, lower ppo.vf_coef, keep ppo.value_clip_range at 0.2, or whiten rewards "
    "(ppo.whiten_rewards)",
)
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


@warning(
    ("value/clipfrac",),
    threshold="> 0.9 for 5 steps",
    reason="when nearly every value is clipped the critic can hardly move",
    diagnosis="almost every value prediction is clipped: the critic is stuck far from the returns",
    fix="raise ppo.value_clip_range, or rescale the rewards (ppo.whiten_rewards, a normalised reward model)",
    hold=7,
)
def value_clip_saturated(h: History) -> str | None:
    last = _each(h, "value/clipfrac", 5, lambda v: v > 0.9)
    return f"value/clipfrac {last[-1]:.2f} (> 0.9 for the last 5 steps)" if last else None


@warning(
    ("policy/clipfrac",),
    threshold="> 0.3 for 5 steps (not under loss_type cispo, which cuts no gradient)",
    reason="PPO's clip is a brake; hitting it on a third of the tokens means each update tries to go too far",
    diagnosis="the updates are too large: the clip cuts a large share of the tokens",
    fix="lower optim.learning_rate, ppo.epochs / grpo.num_iterations, or raise num_minibatches",
    hold=7,
)
def clipfrac_high(h: History) -> str | None:
    # CISPO caps a token's importance weight and keeps its gradient: its clipfrac counts capped weights, no
    # gradient is cut, and ratios far past the cap show in approx_kl_high instead
    if _algorithm(h).get("loss_type") == "cispo":
        return None
    last = _each(h, "policy/clipfrac", 5, lambda v: v > 0.3)
    return f"policy/clipfrac {last[-1]:.2f} (> 0.3 for the last 5 steps)" if last else None


@warning(
    ("policy/off_policy_masked",),
    threshold="> 0.3 for 3 steps",
    reason="the off-policy mask is a guard for a few stale sequences; when it leaves out a third of the tokens the "
    "later updates mostly learn from the positive half of the batch",
    diagnosis="many sequences have drifted past off_policy_mask_threshold from the policy that sampled them",
    fix="lower optim.learning_rate or num_iterations / ppo.epochs; if the sampler's log-probs differ from the "
    "trainer's (rollout/logprob_diff_mean), raise off_policy_mask_threshold",
    hold=5,
)
def off_policy_masked_high(h: History) -> str | None:
    last = _each(h, "policy/off_policy_masked", 3, lambda v: v > 0.3)
    return f"policy/off_policy_masked {last[-1]:.2f} (> 0.3 for the last 3 steps)" if last else None


@warning(
    ("episode/truncated",),
    threshold="> 0.5 for 5 steps",
    reason="a truncated episode ends before it is over (at rollout.max_turns, the token budget, or a turn cut at "
    "max_new_tokens), so its reward scores an unfinished conversation",
    diagnosis="most multi-turn episodes are cut off before the environment says done",
    fix="raise rollout.max_turns or rollout.max_episode_tokens (sampling.max_new_tokens when turns are cut); "
    "check that the environment's step returns done=True when the episode is over",
    hold=7,
)
def episodes_truncated(h: History) -> str | None:
    last = _each(h, "episode/truncated", 5, lambda v: v > 0.5)
    return f"episode/truncated {last[-1]:.2f} (> 0.5 for the last 5 steps)" if last else None


@warning(
    ("episode/tool_errors",),
    threshold="> 0.5 failed calls per episode for 5 steps",
    reason="a failed tool call (unparsable, an unknown tool, bad arguments, an exception or the time limit) "
    "costs a turn and tells the model only an error",
    diagnosis="the policy's tool calls keep failing",
    fix="read the tool messages in samples/ (episode turns): fix the tool or its docstring (the schema the model "
    "sees), raise rollout.tool_timeout, or SFT on well-formed calls first",
    hold=7,
)
def tool_errors_high(h: History) -> str | None:
    last = _each(h, "episode/tool_errors", 5, lambda v: v > 0.5)
    return f"episode/tool_errors {last[-1]:.2f} per episode (> 0.5 for the last 5 steps)" if last else None


@warning(
    ("policy/approx_kl",),
    threshold="> 0.1 for 3 steps",
    reason="per-update KL of 0.01–0.05 is typical; above 0.1 the old log-probs no longer describe the policy",
    diagnosis="each update moves the policy far from the one that sampled the batch",
    fix="lower optim.learning_rate or ppo.epochs / grpo.num_iterations; raise num_minibatches",
    hold=5,
)
def approx_kl_high(h: History) -> str | None:
    last = _each(h, "policy/approx_kl", 3, lambda v: v > 0.1)
    return f"policy/approx_kl {last[-1]:.3g} (> 0.1 for the last 3 steps)" if last else None


@warning(
    ("policy/clipfrac", "policy/approx_kl"),
    threshold="clipfrac < 1e-4 and approx-KL < 1e-8 for 10 steps (several updates per rollout)",
    reason="with several updates per rollout the later ones must see a moved policy",
    diagnosis="the policy does not change between updates: nothing is being learnt",
    fix="raise optim.learning_rate, check that the rewards vary (reward/std) and that the advantages are not 0 "
    "(advantages/abs_mean)",
    hold=12,
)
def nothing_moves(h: History) -> str | None:
    # optimizer steps per sampled batch; with one the ratio is exactly 1: clipfrac and approx-KL are 0 by design
    section = _algorithm(h)
    passes = section.get("epochs", section.get("num_iterations", 1))
    if int(passes) * int(section.get("num_minibatches", 1)) <= 1:
        return None
    clip, kl = _tail(h.values("policy/clipfrac"), 10), _each(h, "policy/approx_kl", 10, lambda v: v < 1e-8)
    if clip and kl and max(clip) < 1e-4:
        return f"policy/clipfrac ≤ {max(clip):.2g} and policy/approx_kl ≤ {max(kl):.2g} for the last 10 steps"
    return None


def _algorithm(h: History) -> Mapping[str, Any]:
    """The run's ``ppo`` or ``grpo`` section ({} for other runs)."""
    ppo, grpo = h.setting("ppo"), h.setting("grpo")
    return ppo if isinstance(ppo, Mapping) else grpo if isinstance(grpo, Mapping) else {}


def _drift(h: History, key: str) -> tuple[float, list[float]]:
    """(where ``key`` started, its last 5 values) once it has 8 values and the last row holds it, else (nan, []):
    what the rules about a metric drifting away from its start compare."""
    values = h.values(key)
    if len(values) < 8 or h.current(key) is None:
        return math.nan, []
    return _start(values), values[-5:]


@warning(
    ("response/length_mean",),
    threshold="mean of the last 5 steps ≥ 93 % of max_new_tokens, from < 80 %",
    reason="responses that all run to the limit usually game a reward that pays for length",
    diagnosis="the responses grow to max_new_tokens: the reward may be paying for length",
    fix="add a length penalty or a missing-EOS penalty (reward.missing_eos_penalty), raise kl.coef, or check the "
    "reward model's bias for long answers",
    hold=7,
)
def length_to_max(h: History) -> str | None:
    limit = h.setting("sampling", "max_new_tokens")
    start, last = _drift(h, "response/length_mean")
    # the mean, not every step: on a small batch one answer that still ends early pulls a step below the limit
    if _finite(limit) and last and start < 0.8 * limit and statistics.fmean(last) >= 0.93 * limit:
        return f"response/length_mean {last[-1]:.3g} of max_new_tokens {limit}, started at {start:.3g}"
    return None


@warning(
    ("response/length_mean",),
    threshold="≤ 1.5 tokens for 5 steps, from > 3",
    reason="an empty answer that scores well means the reward favours saying nothing",
    diagnosis="the responses shrank to (almost) nothing",
    fix="check the reward for short or empty answers (a floor, a missing-EOS penalty that is too large), raise kl.coef",
    hold=7,
)
def length_to_one(h: History) -> str | None:
    start, last = _drift(h, "response/length_mean")
    if last and start > 3 and all(v <= 1.5 for v in last):
        return f"response/length_mean {last[-1]:.3g} tokens, started at {start:.3g}"
    return None


@warning(
    ("response/eos_rate",),
    threshold="< half its start (and < 0.5) for 5 steps",
    reason="a policy that stops ending its answers is usually being paid for length, or cut at the limit",
    diagnosis="the end-of-sequence token stopped appearing",
    fix="set reward.missing_eos_penalty, raise kl.coef, or raise sampling.max_new_tokens if answers are cut",
    hold=7,
)
def eos_vanishing(h: History) -> str | None:
    start, last = _drift(h, "response/eos_rate")
    if last and start >= 0.5 and all(v < min(0.5, 0.5 * start) for v in last):
        return f"response/eos_rate {last[-1]:.2f} (under half its start, {start:.2f}, for the last 5 steps)"
    return None


@warning(
    ("reward/zero_std_groups",),
    threshold="≥ 90 % of the groups for 5 steps",
    reason="GRPO learns from differences within a group; equal rewards give zero advantages",
    diagnosis="almost every group's samples score the same: there is no learning signal",
    fix="raise grpo.group_size or sampling.temperature, use a finer-grained reward, or turn on grpo.dynamic_sampling",
    hold=7,
)
def no_group_signal(h: History) -> str | None:
    last = _each(h, "reward/zero_std_groups", 5, lambda v: v > 0.9 - 1e-9)
    return f"{last[-1]:.0%} of the groups had equal rewards for each of the last 5 steps" if last else None


@info(
    ("grad/norm",),
    threshold="> 10× the median of the previous 20 steps",
    reason="an isolated spike is clipped by optim.max_grad_norm; repeated ones precede divergence",
    diagnosis="the gradient norm spiked",
    fix="keep optim.max_grad_norm set (1.0); if spikes repeat, lower optim.learning_rate",
    hold=1,
)
def grad_spike(h: History) -> str | None:
    norms, now = h.values("grad/norm"), h.current("grad/norm")
    if now is None or len(norms) < 11:
        return None
    median = statistics.median(norms[-21:-1])
    if median > 0 and now > 10 * median:
        return f"grad/norm {now:.3g} at step {h.step}, {now / median:.0f}× the median of the 20 steps before ({median:.3g})"
    return None


@critical(
    ("update/changed_frac",),
    threshold="< 0.5 for 3 steps",
    reason="in pure bfloat16 an optimizer step smaller than a weight's spacing (1.2e-4 near 0.02) rounds back to "
    "the same weight: the loss and the gradients look normal while the model does not move",
    diagnosis="the updates vanish: most weights with a gradient were not changed by the optimizer step",
    fix="train in mixed precision, float32 weights with bfloat16 compute (model.dtype float32, model.bf16 true), "
    "or raise optim.learning_rate",
    hold=3,
)
def updates_vanishing(h: History) -> str | None:
    last = _each(h, "update/changed_frac", 3, lambda v: v < 0.5)
    if last is None:
        return None
    return f"update/changed_frac {last[-1]:.1%} at step {h.step} (under half for each of the last 3 steps)"


def _monitors(h: History) -> list[str]:
    """The reward sources with weight 0 (logged, not optimised: the truth to compare the proxy with)."""
    source = h.setting("reward", "source")
    if not isinstance(source, list):
        return []
    return [str(s["name"]) for s in source if isinstance(s, Mapping) and s.get("weight") == 0 and "name" in s]


@warning(
    ("reward/mean", "eval/reward/mean", "reward/<monitor>/mean"),
    threshold="the truth (smoothed) gave back > ½ of its gain over the start, by > 2× its noise, while the proxy "
    "stayed at or above its level at the truth's best",
    reason="Gao et al. (2022): past some KL, a proxy reward keeps rising while the true score falls",
    diagnosis="reward hacking: the optimised reward keeps rising while the held-out (or monitor) reward falls",
    fix="raise kl.coef or use kl.control: adaptive with a kl.target, stop earlier (use the checkpoint at the "
    "best held-out step), or improve the reward model with more labels",
)
def over_optimisation(h: History) -> str | None:
    """The truth: a monitor reward (held-out or on the training batches), else the held-out reward."""
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


@warning(
    ("rewards/accuracies", "train/accuracy"),
    threshold="|mean of 10 steps − 0.5| < 0.05 after step 20",
    reason="a preference model (or DPO policy) at 50 % has learnt nothing from the pairs",
    diagnosis="preference accuracy stays at chance",
    fix="check the labels (chosen and rejected not swapped, not random), raise optim.learning_rate, or for dpo "
    "raise dpo.beta",
)
def accuracy_at_chance(h: History) -> str | None:
    key = next((k for k in ("rewards/accuracies", "train/accuracy") if h.values(k)), None)
    if key is None or h.step < 20 or h.current(key) is None:
        return None
    last = _tail(h.values(key), 10)
    if last is not None and abs(statistics.fmean(last) - 0.5) < 0.05:
        return f"{key} {statistics.fmean(last):.2f} over the last 10 steps (chance is 0.5)"
    return None


@warning(
    ("eval/loss", "train/loss"),
    threshold="3 rises in a row while train/loss falls",
    reason="the model fits the training set better and the held-out set worse: overfitting",
    diagnosis="the held-out loss rises while the training loss falls (overfitting)",
    fix="train fewer epochs, lower optim.learning_rate, add data or use the checkpoint before the rise",
)
def eval_loss_rising(h: History) -> str | None:
    evals, train = h.values("eval/loss"), h.values("train/loss")
    if len(evals) < 4 or len(train) < 10:  # the last evaluation stands until the next one
        return None
    last = evals[-4:]
    falling = statistics.fmean(train[-5:]) < statistics.fmean(train[-10:-5])
    if all(b > a for a, b in zip(last, last[1:], strict=False)) and falling:
        return f"eval/loss rose for 3 evaluations in a row ({last[0]:.4g} → {last[-1]:.4g}) while train/loss fell"
    return None


RULES: tuple[Rule, ...] = tuple(_RULES)
"""Every rule, in the order they are defined (the README's table)."""
