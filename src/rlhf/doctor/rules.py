"""The training doctor's rules: pure functions over a run's metric history that recognise the classic RLHF failures and
name the fix to try. No model code, no torch: a rule reads ``metrics.jsonl`` rows (and the run's config, for limits such
as ``max_new_tokens``) and nothing else; how a rule is declared: `rlhf.doctor.checks`.

A rule's ``check(history)`` looks at the history *up to its last row* and returns the evidence (a sentence with the
numbers) when the failure shows there, else None; `rlhf.doctor.watch` follows the rules row by row, live and
afterwards alike, and a row without any of a rule's metrics leaves that rule as it was. The table of rules,
and why most wait several rows to start and to clear (``Rule.hold``): the README's 'Training doctor'."""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlhf.doctor.checks import Limit, RuleBook, each, started_at, tail
from rlhf.doctor.history import SEVERITIES, Event, Finding, History, Rule, Severity, count_text, finite

__all__ = ["RULES", "SEVERITIES", "Event", "Finding", "History", "Rule", "Severity", "count_text"]


# The rules, in the order of the README's table (`rlhf.doctor.checks`: how a rule is declared)

_BOOK = RuleBook()
critical = functools.partial(_BOOK.check, "critical")
warning = functools.partial(_BOOK.check, "warning")
info = functools.partial(_BOOK.check, "info")


def _algorithm(h: History) -> Mapping[str, Any]:
    """The run's ``ppo`` or ``grpo`` section ({} for other runs)."""
    ppo, grpo = h.setting("ppo"), h.setting("grpo")
    return ppo if isinstance(ppo, Mapping) else grpo if isinstance(grpo, Mapping) else {}


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
    bad = [key for key in NON_FINITE_KEYS if key in row and not finite(row[key])]
    if "reward/mean" in bad and row.get("reward/unscored"):
        bad.remove("reward/mean")  # no sample could be scored: the step was skipped, which is reported elsewhere
    return f"{', '.join(f'{k} = {row[k]}' for k in bad)} at step {h.step}" if bad else None


@critical(
    ("policy/first_ratio_max_dev",),
    threshold="> {limit:e}",
    reason="before the first update the policy is the one that sampled: the ratio must be exactly 1",
    diagnosis="the log-probs of the update do not match those of the rollout — a bug, not a tuning problem",
    fix="check dropout (must be off), sampling.temperature versus the scoring temperature, padding and "
    "position ids; report it with the run's config",
    hold=1,
)
def first_ratio_not_one(h: History, limit: float = 1e-3) -> str | None:
    dev = h.current("policy/first_ratio_max_dev")
    if dev and dev > limit:
        return f"max |ratio − 1| on the first minibatch = {dev:.3g} at step {h.step} (must be 0)"
    return None


def _drift(h: History, key: str, window: int, first: int = 3) -> tuple[float, list[float]]:
    """(where ``key`` started, the median of its ``first`` values; its last ``window`` values) once it has both
    and the last row holds it, else (nan, []): what the rules about a metric drifting from its start compare."""
    values = h.values(key)
    if len(values) < first + window or h.current(key) is None:
        return math.nan, []
    return started_at(values, first), values[-window:]


def _from_start(h: History, key: str, n: int, moved: Callable[[float, float], bool]) -> str | None:
    """The evidence when ``moved(start, now)``: the median of ``key``'s first ``n`` values against the mean of
    its last ``n``."""
    start, last = _drift(h, key, n, first=n)
    if last and moved(start, now := statistics.fmean(last)):
        return f"{key} {now:.3g} nats per token (mean of the last {n} steps), started at {start:.3g}"
    return None


@warning(
    ("rollout/logprob_diff_mean",),
    threshold="mean of the last {n} steps > {floor} nats per token and > {factor}× where it started (median of the "
    "first {n}), at sampling.max_staleness 0",
    reason="the engine that samples and the trainer compute the same policy; rounding keeps them a steady small "
    "distance apart, so a gap that grows means the engine's weights or numerics drift from the trainer's, and "
    "every update is off-policy by that much",
    diagnosis="the sampler's log-probs drift away from the trainer's: each rollout is more off-policy than the last",
    fix="with sampling.engine vllm: check that the weights reach it (a server's version, docs/vllm.md), sample in "
    "the trainer's dtype (model.dtype), and turn on sampling.is_correction: token; with rlhf's own engines it is a "
    "bug: report it with the run's config",
)
def mismatch_growing(h: History, n: int = 3, floor: float = 0.05, factor: float = 3) -> str | None:
    if _stale(h):  # the gap is then behaviour against proximal policy, and grows with staleness by design
        return None  # how far is too far: stale_samples_hurt
    return _from_start(h, "rollout/logprob_diff_mean", n, lambda start, now: now > floor and now > factor * start)


def _stale(h: History) -> bool:
    """The run samples asynchronously: ``sampling.max_staleness`` > 0 (docs/async.md)."""
    k = h.setting("sampling", "max_staleness", default=0)
    return finite(k) and k > 0


@warning(
    ("rollout/is_capped_frac", "rollout/logprob_diff_mean"),
    threshold="median of the last {n} steps at sampling.max_staleness > 0: rollout/is_capped_frac > {capped:%} of "
    "the tokens, or rollout/logprob_diff_mean > {gap} nats per token",
    reason="a stale token's loss is weighted by π_prox/π_behav, capped at sampling.is_cap. Under the sampler "
    "these weights average 1, so on average at most 1/is_cap of them can reach the cap (a third at the default "
    "3; a share like one half never shows): 5 % capped is a heavy tail of tokens the policy has moved far "
    "towards. A mean gap of 0.5 nats puts a typical token's probability 1.6× off (ten times mismatch_growing's "
    "rounding floor): the weights' spread, more than the advantages, then sets each token's step. The gap grows "
    "with staleness by design, so it is held to a bound, not to where it started",
    diagnosis="the batches are too stale for the importance weights to correct: the policy that sampled them is "
    "far from the one learning from them",
    fix="lower sampling.max_staleness (1 already overlaps a whole step; more only absorbs steps of uneven "
    "length), make each update move less (optim.learning_rate, ppo.epochs / grpo.num_iterations), or, when "
    "rollout/is_capped_frac is what fired, raise sampling.is_cap (less bias, more variance)",
)
def stale_samples_hurt(h: History, n: int = 5, capped: float = 0.05, gap: float = 0.5) -> str | None:
    if not _stale(h):
        return None
    found = []
    for key, bound, fmt in (("rollout/is_capped_frac", capped, ".1%"), ("rollout/logprob_diff_mean", gap, ".3g")):
        last = tail(h.values(key), n)
        if last and h.current(key) is not None and (median := statistics.median(last)) > bound:
            found.append(f"{key} {median:{fmt}}")
    if not found:
        return None
    k = h.setting("sampling", "max_staleness")
    return f"{' and '.join(found)} (median of the last {n} steps; sampling.max_staleness {k})"


ASYNC_TIMES = ("time/rollout_s", "time/producer_idle_s", "time/step_s")


@info(
    ASYNC_TIMES,
    threshold="median of the last {n} steps after step {after} at sampling.max_staleness > 0: the trainer's wait "
    "for its batch (time/rollout_s) or the worker's for its weights (time/producer_idle_s) > {share:%} of "
    "time/step_s",
    reason="the overlap hides the shorter of sampling and updating: balanced, both waits are near 0 and a step "
    "takes the longer phase alone. A wait over half the step means one phase takes over twice the other, so "
    "the overlap saves at most a third of a synchronous step (less, as the worker samples on fewer cores) "
    "while the waiting side's cores sit idle over half the time. Step 1 is always waited for: nothing ran "
    "before it",
    diagnosis="the asynchronous pipeline is unbalanced: one side mostly waits for the other, so the overlap "
    "hides little",
    fix="when the trainer waits (time/rollout_s): give the worker more cores (sampling.worker_threads), or make "
    "its work cheaper (it scores too: time/score_s is its scoring; sampling.max_new_tokens); when the worker idles "
    "(time/producer_idle_s): give the trainer its cores back (a lower sampling.worker_threads), or sample "
    "in the trainer (sampling.max_staleness: 0)",
)
def async_does_not_pay(h: History, n: int = 5, share: float = 0.5, after: int = 1) -> str | None:
    found = _last_rows(h, ASYNC_TIMES, n)
    if not _stale(h) or found is None or found[0][0] <= after:
        return None
    _, (waits, idles, steps) = found
    waiting, idle = (statistics.median(v / max(s, 1e-9) for v, s in zip(x, steps, strict=True)) for x in (waits, idles))
    if waiting > share:
        return (
            f"the trainer waited for its batch {waiting:.0%} of each step (time/rollout_s over time/step_s, "
            f"median of the last {n} steps): sampling is the bottleneck"
        )
    if idle > share:
        return (
            f"the worker waited for its weights {idle:.0%} of each step (time/producer_idle_s over time/step_s, "
            f"median of the last {n} steps): the update is the bottleneck"
        )
    return None


def _last_rows(h: History, keys: Sequence[str], n: int) -> tuple[list[int], list[list[float]]] | None:
    """The steps of the last ``n`` rows that log ``keys`` (together, as a step's row does) and each key's values
    there, when the last row holds them all; else None."""
    if any(h.current(key) is None for key in keys):
        return None
    steps = [h.steps(key)[-n:] for key in keys]
    if len(steps[0]) < n or any(s != steps[0] for s in steps):
        return None
    return steps[0], [h.values(key)[-n:] for key in keys]


@critical(
    ("kl/mean",),
    threshold="> {factor}× the largest of the previous (up to) {n} steps, and up by > {jump} nats per response token",
    reason="the KL grows smoothly once the policy has left the reference; tripling in one step by more than half a "
    "nat per token means one update moved the policy far (a first rise from near 0 to the run's level is a few "
    "tenths per token at most in the demo's healthy runs)",
    diagnosis="the KL to the reference jumped in one step: the policy moved far in a single update",
    fix="lower optim.learning_rate or ppo.epochs / grpo.num_iterations, raise kl.coef, or let the adaptive "
    "controller hold it (kl.control: adaptive, kl.target)",
    hold=1,
)
def kl_blowup(h: History, factor: float = 3, n: int = 3, jump: float = 0.5) -> str | None:
    kls, now = h.values("kl/mean"), h.current("kl/mean")
    if now is None or len(kls) < 2:  # from the second row: a first update that wrecks the policy shows at step 2
        return None
    before = max(kls[-n - 1 : -1])  # the largest of the (up to) n steps before: steady growth never triples in one
    # kl/mean sums over the response: per token, one threshold fits 20-token and 500-token answers (per sequence
    # when no length is logged)
    tokens = max((h.values("response/length_mean") or [1.0])[-1], 1.0)
    if now > factor * max(before, 0.0) and (now - before) / tokens > jump:
        return (
            f"kl/mean {now:.3g} at step {h.step}, {now / max(before, 1e-9):.1f}× the steps before (at most "
            f"{before:.3g}): {(now - before) / tokens:.2f} nats more per token ({tokens:.3g} tokens per response)"
        )
    return None


@warning(
    ("kl/mean", "kl/coef"),
    threshold="> {factor} × kl.target for {window} steps (adaptive control)",
    reason="the adaptive controller moves β by at most 20 % per batch·horizon; twice the target for 5 steps is "
    "more than it is catching up",
    diagnosis="the KL stays far above the target the controller is steering to",
    fix="raise kl.coef (the starting β) or lower kl.horizon so β reacts faster; lower optim.learning_rate",
)
def kl_above_target(h: History, factor: float = 2, window: int = 5) -> str | None:
    target = h.setting("kl", "target")
    if h.setting("kl", "control") != "adaptive" or not finite(target):
        return None
    last = each(h, "kl/mean", window, lambda v: v > factor * target)
    return f"kl/mean {last[-1]:.3g} > {factor} × kl.target {target:g} for the last {window} steps" if last else None


@warning(
    ("policy/entropy",),
    threshold="< {share:%} of its start, or < {floor} nats per token",
    reason="a policy this certain stops exploring: every sample is the same answer",
    diagnosis="the policy's entropy collapsed: it samples nearly the same tokens every time",
    fix="raise the entropy bonus (ppo.entropy_coef / grpo.entropy_coef), raise kl.coef, lower "
    "optim.learning_rate, or sample at a higher sampling.temperature",
)
def entropy_collapse(h: History, share: float = 0.1, floor: float = 0.05) -> str | None:
    return _from_start(h, "policy/entropy", 3, lambda start, now: now < floor or (start > 0 and now < share * start))


_BOOK.limit(
    "critic_worse_than_mean",
    "warning",
    # the value head starts at 0: a young critic predicts worse than the mean
    Limit("value/explained_variance", "<", 0, window=10, fmt=".3g", after=10),
    reason="explained variance < 0 means predicting the mean return would be better than the critic",
    diagnosis="the critic predicts the returns worse than a constant: GAE advantages are mostly noise",
    fix="raise ppo.vf_coef or optim.learning_rate for the critic, use ppo.critic: separate (initialised from the "
    "reward model), or turn on ppo.whiten_rewards",
)


@warning(
    ("value/loss",),
    threshold="median of {n} steps > {factor}× its lowest, and rising",
    reason="a value loss that climbs back up means the critic is diverging from the returns",
    diagnosis="the critic is diverging: its loss keeps rising",
    fix="lower optim.learning_rate, lower ppo.vf_coef, keep ppo.value_clip_range at 0.2, or whiten rewards "
    "(ppo.whiten_rewards)",
)
def value_loss_rising(h: History, n: int = 5, factor: float = 5) -> str | None:
    values = h.values("value/loss")
    if len(values) < 15 or h.current("value/loss") is None:
        return None
    recent = statistics.median(values[-n:])
    # the lowest median of n consecutive steps before the last n: a running minimum, kept by the history
    lowest = h.prefix(
        f"min_median{n}",
        "value/loss",
        lambda v, i, out: math.inf if i < n - 1 else min(out[i - 1], statistics.median(v[i - n + 1 : i + 1])),
    )
    best = lowest[len(values) - 2]
    if recent > factor * best and all(b > a for a, b in zip(values[-4:-1], values[-3:], strict=True)):
        ratio = recent / best if best else math.inf  # a critic that once fitted the returns exactly (loss 0)
        return f"value/loss {values[-1]:.3g}, median of the last {n} steps {recent:.3g} = {ratio:.1f}× its lowest ({best:.3g})"
    return None


_BOOK.limit(
    "value_clip_saturated",
    "warning",
    Limit("value/clipfrac", ">", 0.9, window=5),
    reason="when nearly every value is clipped the critic can hardly move",
    diagnosis="almost every value prediction is clipped: the critic is stuck far from the returns",
    fix="raise ppo.value_clip_range, or rescale the rewards (ppo.whiten_rewards, a normalised reward model)",
)
_BOOK.limit(
    "clipfrac_high",
    "warning",
    # CISPO caps a token's importance weight and keeps its gradient: its clipfrac counts capped weights, no
    # gradient is cut, and ratios far past the cap show in approx_kl_high instead
    Limit(
        "policy/clipfrac",
        ">",
        0.3,
        window=5,
        text="{op} {limit} for {window} steps (not under loss_type cispo, which cuts no gradient)",
        unless=lambda h: _algorithm(h).get("loss_type") == "cispo",
    ),
    reason="PPO's clip is a brake; hitting it on a third of the tokens means each update tries to go too far",
    diagnosis="the updates are too large: the clip cuts a large share of the tokens",
    fix="lower optim.learning_rate, ppo.epochs / grpo.num_iterations, or raise num_minibatches",
)
_BOOK.limit(
    "off_policy_masked_high",
    "warning",
    Limit("policy/off_policy_masked", ">", 0.3, window=3),
    reason="the off-policy mask is a guard for a few stale sequences; when it leaves out a third of the tokens the "
    "later updates mostly learn from the positive half of the batch",
    diagnosis="many sequences have drifted past off_policy_mask_threshold from the policy that sampled them",
    fix="lower optim.learning_rate or num_iterations / ppo.epochs; if the sampler's log-probs differ from the "
    "trainer's (rollout/logprob_diff_mean), raise off_policy_mask_threshold",
)
_BOOK.limit(
    "episodes_truncated",
    "warning",
    Limit("episode/truncated", ">", 0.5, window=5),
    reason="a truncated episode ends before it is over (at rollout.max_turns, the token budget, or a turn cut at "
    "max_new_tokens), so its reward scores an unfinished conversation",
    diagnosis="most multi-turn episodes are cut off before the environment says done",
    fix="raise rollout.max_turns or rollout.max_episode_tokens (sampling.max_new_tokens when turns are cut); "
    "check that the environment's step returns done=True when the episode is over",
)
_BOOK.limit(
    "tool_errors_high",
    "warning",
    Limit("episode/tool_errors", ">", 0.5, window=5, unit=" failed calls per episode"),
    reason="a failed tool call (unparsable, an unknown tool, bad arguments, an exception or the time limit) "
    "costs a turn and tells the model only an error",
    diagnosis="the policy's tool calls keep failing",
    fix="read the tool messages in samples/ (episode turns): fix the tool or its docstring (the schema the model "
    "sees), raise rollout.tool_timeout, or SFT on well-formed calls first",
)
_BOOK.limit(
    "approx_kl_high",
    "warning",
    Limit("policy/approx_kl", ">", 0.1, window=3, fmt=".3g"),
    reason="per-update KL of 0.01–0.05 is typical; above 0.1 the old log-probs no longer describe the policy",
    diagnosis="each update moves the policy far from the one that sampled the batch",
    fix="lower optim.learning_rate or ppo.epochs / grpo.num_iterations; raise num_minibatches",
)


@warning(
    ("policy/clipfrac", "policy/approx_kl"),
    threshold="clipfrac < {clip:e} and approx-KL < {kl:e} for {window} steps (several updates per rollout)",
    reason="with several updates per rollout the later ones must see a moved policy",
    diagnosis="the policy does not change between updates: nothing is being learnt",
    fix="raise optim.learning_rate, check that the rewards vary (reward/std) and that the advantages are not 0 "
    "(advantages/abs_mean)",
)
def nothing_moves(h: History, clip: float = 1e-4, kl: float = 1e-8, window: int = 10) -> str | None:
    # optimizer steps per sampled batch; with one the ratio is exactly 1: clipfrac and approx-KL are 0 by design
    section = _algorithm(h)
    passes = section.get("epochs", section.get("num_iterations", 1))
    if int(passes) * int(section.get("num_minibatches", 1)) <= 1:
        return None
    clips, kls = tail(h.values("policy/clipfrac"), window), each(h, "policy/approx_kl", window, lambda v: v < kl)
    if clips and kls and max(clips) < clip:
        return f"policy/clipfrac ≤ {max(clips):.2g} and policy/approx_kl ≤ {max(kls):.2g} for the last {window} steps"
    return None


@warning(
    ("response/length_mean",),
    threshold="mean of the last {window} steps ≥ {high:%} of max_new_tokens, from < {low:%}",
    reason="responses that all run to the limit usually game a reward that pays for length",
    diagnosis="the responses grow to max_new_tokens: the reward may be paying for length",
    fix="add a length penalty or a missing-EOS penalty (reward.missing_eos_penalty), raise kl.coef, or check the "
    "reward model's bias for long answers",
)
def length_to_max(h: History, window: int = 5, high: float = 0.93, low: float = 0.8) -> str | None:
    limit = h.setting("sampling", "max_new_tokens")
    start, last = _drift(h, "response/length_mean", window)
    # the mean, not every step: on a small batch one answer that still ends early pulls a step below the limit
    if finite(limit) and last and start < low * limit and statistics.fmean(last) >= high * limit:
        return f"response/length_mean {last[-1]:.3g} of max_new_tokens {limit}, started at {start:.3g}"
    return None


@warning(
    ("response/length_mean",),
    threshold="≤ {limit} tokens for {window} steps, from > {floor}",
    reason="an empty answer that scores well means the reward favours saying nothing",
    diagnosis="the responses shrank to (almost) nothing",
    fix="check the reward for short or empty answers (a floor, a missing-EOS penalty that is too large), raise kl.coef",
)
def length_to_one(h: History, limit: float = 1.5, window: int = 5, floor: float = 3) -> str | None:
    start, last = _drift(h, "response/length_mean", window)
    if last and start > floor and all(v <= limit for v in last):
        return f"response/length_mean {last[-1]:.3g} tokens, started at {start:.3g}"
    return None


@warning(
    ("response/eos_rate",),
    threshold="< half its start (and < {limit}) for {window} steps",
    reason="a policy that stops ending its answers is usually being paid for length, or cut at the limit",
    diagnosis="the end-of-sequence token stopped appearing",
    fix="set reward.missing_eos_penalty, raise kl.coef, or raise sampling.max_new_tokens if answers are cut",
)
def eos_vanishing(h: History, limit: float = 0.5, window: int = 5) -> str | None:
    start, last = _drift(h, "response/eos_rate", window)
    if last and start >= limit and all(v < min(limit, 0.5 * start) for v in last):
        return f"response/eos_rate {last[-1]:.2f} (under half its start, {start:.2f}, for the last {window} steps)"
    return None


_BOOK.limit(
    "no_group_signal",
    "warning",
    Limit(
        "reward/zero_std_groups",
        "≥",
        0.9,
        window=5,
        fmt=".0%",
        text="{op} {limit:%} of the groups for {window} steps",
        evidence="{value} of the groups had equal rewards for each of the last {window} steps",
    ),
    reason="GRPO learns from differences within a group; equal rewards give zero advantages",
    diagnosis="almost every group's samples score the same: there is no learning signal",
    fix="raise grpo.group_size or sampling.temperature, use a finer-grained reward, or turn on grpo.dynamic_sampling",
)


@info(
    ("grad/norm",),
    threshold="> {factor}× the median of the previous {n} steps",
    reason="an isolated spike is clipped by optim.max_grad_norm; repeated ones precede divergence",
    diagnosis="the gradient norm spiked",
    fix="keep optim.max_grad_norm set (1.0); if spikes repeat, lower optim.learning_rate",
    hold=1,
)
def grad_spike(h: History, factor: float = 10, n: int = 20) -> str | None:
    norms, now = h.values("grad/norm"), h.current("grad/norm")
    if now is None or len(norms) < 11:
        return None
    median = statistics.median(norms[-n - 1 : -1])
    if median > 0 and now > factor * median:
        return f"grad/norm {now:.3g} at step {h.step}, {now / median:.0f}× the median of the {n} steps before ({median:.3g})"
    return None


_BOOK.limit(
    "updates_vanishing",
    "critical",
    Limit("update/changed_frac", "<", 0.5, window=3, fmt=".1%"),
    reason="in pure bfloat16 an optimizer step smaller than a weight's spacing (1.2e-4 near 0.02) rounds back to "
    "the same weight: the loss and the gradients look normal while the model does not move",
    diagnosis="the updates vanish: most weights with a gradient were not changed by the optimizer step",
    fix="train in mixed precision, float32 weights with bfloat16 compute (model.dtype float32, model.bf16 true), "
    "or raise optim.learning_rate",
    hold=3,
)


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
    peak = int(peaks[n - 1])
    gain, drop = smooth[peak] - smooth[0], smooth[peak] - smooth[n - 1]
    noise = _step_spread(h, truth) / math.sqrt(2 * window)  # the noise of a window mean, trend removed
    proxy_now, proxy_then = _mean_near(h, "reward/mean", steps[-1]), _mean_near(h, "reward/mean", steps[peak])
    fell = gain > 0 and drop > 0.5 * gain and drop > 2 * noise
    if fell and proxy_now is not None and proxy_then is not None and proxy_now >= proxy_then:
        return (
            f"{truth} fell from {smooth[peak]:.3g} (step {steps[peak]}) to {smooth[-1]:.3g}, more than half of "
            f"its gain since step {steps[0]}, while reward/mean went from {proxy_then:.3g} to {proxy_now:.3g}"
        )
    return None


def _step_spread(h: History, key: str) -> float:
    """The population standard deviation of ``key``'s step-to-step differences, their mean (the trend) removed:
    √2 × the noise of one value, for a series whose values scatter independently around a slow trend. Kept as
    running sums (O(1) per new row)."""
    diff_sum = h.prefix("diff_sum", key, lambda v, i, out: 0.0 if i == 0 else out[i - 1] + v[i] - v[i - 1])
    diff_sq = h.prefix("diff_sq", key, lambda v, i, out: 0.0 if i == 0 else out[i - 1] + (v[i] - v[i - 1]) ** 2)
    n = len(diff_sum)
    if n < 2:
        return 0.0
    mean_diff = diff_sum[n - 1] / (n - 1)
    return math.sqrt(max(diff_sq[n - 1] / (n - 1) - mean_diff**2, 0.0))


def _mean_near(h: History, key: str, step: int, width: int = 3) -> float | None:
    """The mean of ``key`` over the logged steps within ``width`` of ``step`` (a noisy batch metric)."""
    steps = h.steps(key)
    lo, hi = bisect.bisect_left(steps, step - width), bisect.bisect_right(steps, step + width)
    return statistics.fmean(h.values(key)[lo:hi]) if hi > lo else None


@warning(
    ("reward/mean", "reward/<ensemble>/ensemble_std"),
    threshold="the members' disagreement (mean of the last {window} steps) > {factor}× where it started (median of "
    "the first {window}) and above it by > {z}× the noise of that difference, while reward/mean is above its start",
    reason="reward models trained alike agree where their pairs taught them; samples they disagree about more and "
    "more are where the policy has gone beyond what they learned, the ground over-optimisation grows on (Coste "
    "et al. 2024); a label-free warning, no gold needed",
    diagnosis="the ensemble's reward models disagree more and more about the policy's samples while the reward rises",
    fix="raise kl.coef (or kl.control: adaptive with a kl.target), optimise the ensemble conservatively "
    "(reward.ensemble.objective: wco or uwo), use an earlier checkpoint, or label the policy's current samples and "
    "retrain the reward models",
)
def ensemble_disagreement_rising(h: History, window: int = 5, factor: float = 1.6, z: float = 3.0) -> str | None:
    row, reward = h.last_row(), h.values("reward/mean")
    spreads = [key for key in row if key.startswith("reward/") and key.endswith("/ensemble_std")]
    if len(reward) < 2 * window or not spreads:
        return None
    for key in spreads:
        values = h.values(key)
        if len(values) < 2 * window:
            continue
        start, now = started_at(values, window), statistics.fmean(values[-window:])
        # the noise floor: a batch's disagreement scatters step to step (a batch of 32 answers), and the difference
        # of two window means has about 2/window of one value's variance, that is _step_spread² / window
        noise = _step_spread(h, key) / math.sqrt(window)
        rising = now > factor * start and now - start > z * noise
        if rising and statistics.fmean(reward[-window:]) > started_at(reward, window):
            return (
                f"{key} {now:.3g} (mean of the last {window} steps), {now / start:.2f}× its start {start:.3g}, "
                f"{(now - start) / noise if noise else math.inf:.1f}× the noise"
            )
    return None


@warning(
    ("rewards/accuracies", "train/accuracy"),
    threshold="|mean of {n} steps − {chance}| < {margin} after step {after}",
    reason="a preference model (or DPO policy) at 50 % has learnt nothing from the pairs",
    diagnosis="preference accuracy stays at chance",
    fix="check the labels (chosen and rejected not swapped, not random), raise optim.learning_rate, or for dpo "
    "raise dpo.beta",
)
def accuracy_at_chance(
    h: History, n: int = 10, chance: float = 0.5, margin: float = 0.05, after: int = 20
) -> str | None:
    key = next((k for k in ("rewards/accuracies", "train/accuracy") if h.values(k)), None)
    if key is None or h.step < after or h.current(key) is None:
        return None
    last = tail(h.values(key), n)
    if last is not None and abs(statistics.fmean(last) - chance) < margin:
        return f"{key} {statistics.fmean(last):.2f} over the last {n} steps (chance is {chance})"
    return None


@warning(
    ("eval/loss", "train/loss"),
    threshold="{n} rises in a row while train/loss falls",
    reason="the model fits the training set better and the held-out set worse: overfitting",
    diagnosis="the held-out loss rises while the training loss falls (overfitting)",
    fix="train fewer epochs, lower optim.learning_rate, add data or use the checkpoint before the rise",
)
def eval_loss_rising(h: History, n: int = 3) -> str | None:
    evals, train = h.values("eval/loss"), h.values("train/loss")
    if len(evals) < n + 1 or len(train) < 10:  # the last evaluation stands until the next one
        return None
    last = evals[-n - 1 :]
    falling = statistics.fmean(train[-5:]) < statistics.fmean(train[-10:-5])
    if all(b > a for a, b in zip(last, last[1:], strict=False)) and falling:
        return f"eval/loss rose for {n} evaluations in a row ({last[0]:.4g} → {last[-1]:.4g}) while train/loss fell"
    return None


RULES: tuple[Rule, ...] = tuple(_BOOK.rules)
"""Every rule, in the order they are defined (the README's table)."""
