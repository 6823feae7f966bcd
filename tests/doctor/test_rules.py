"""The doctor's rules: silent on healthy runs of this project (fixtures: the demo's runs), firing on each
classic failure in synthetic metric streams, and not flapping on noise."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest
import yaml

from rlhf.doctor.rules import RULES, History
from rlhf.doctor.watch import Watch, diagnose

RULES_BY_NAME = {rule.name: rule for rule in RULES}

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HEALTHY = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and "no_kl" not in p.name)


def fixture(name: str) -> History:
    rows = [json.loads(line) for line in (FIXTURES / name / "metrics.jsonl").read_text().splitlines()]
    return History(rows, yaml.safe_load((FIXTURES / name / "config.yaml").read_text()))


@pytest.mark.parametrize("name", HEALTHY)
def test_silent_on_the_healthy_demo_runs(name):
    assert diagnose(fixture(name)) == [], name


def test_ppo_without_the_kl_penalty_is_reward_hacking():
    # the demo's PPO with β = 0: the reward model's score climbs while the gold monitor falls back to SFT's level
    findings = {f.rule.name: f for f in diagnose(fixture("seed0_ppo_no_kl"))}
    assert "over_optimisation" in findings
    found = findings["over_optimisation"]
    assert found.steps[0] > 15 and found.episodes[-1][1] == 60  # after the gold score peaked, to the end
    assert "reward/gold/mean fell from" in found.last


def test_the_ensembles_disagreement_warns_before_the_gold_falls_in_the_demo():
    """The demo's β = 0 PPO (seed 0, AVX-512 kernels; tools/demo_figures.py's base default_seed_0) with its
    four-member ensemble, normalised together, logged beside the one reward model it optimises: the members'
    disagreement passes 1.6× its start at step 28 (1.68×, 7.4 noises), when the batch's gold score has fallen from
    its peak (1.91, 5-step mean at step 18) to 1.33, 10 steps before the gold-based over_optimisation names the fall.
    The same seed's leashed PPO and GRPO (ensemble_seed0_ppo, ensemble_seed0_grpo) draw nothing:
    test_silent_on_the_healthy_demo_runs."""
    findings = {f.rule.name: f for f in diagnose(fixture("ensemble_seed0_ppo_no_kl"))}
    disagreement = findings["ensemble_disagreement_rising"]
    assert disagreement.steps[0] == 28 and findings["over_optimisation"].steps[0] == 38
    assert disagreement.last.startswith("reward/ensemble/ensemble_std")


# ---------------------------------------------------------------------------------------------------------------
# Synthetic streams: each rule fires on its failure, and stays silent on noise around a healthy trend
# ---------------------------------------------------------------------------------------------------------------

PPO_CONFIG = {"ppo": {"epochs": 4, "num_minibatches": 2}, "sampling": {"max_new_tokens": 32},
              "kl": {"control": "adaptive", "target": 6.0},
              "reward": {"source": [{"source": "rm", "name": "rm", "weight": 1.0},
                                    {"source": "gold", "name": "gold", "weight": 0.0}]}}  # fmt: skip


def stream(n: int, seed: int = 0, **series) -> list[dict]:
    """``n`` rows; each keyword is a function of (step, rng) giving that metric."""
    rng = random.Random(seed)
    return [{"step": s, **{key.replace("__", "/"): fn(s, rng) for key, fn in series.items()}} for s in range(1, n + 1)]


def healthy(s, rng):
    """A base row of a healthy PPO step, with noise."""
    return {
        "reward/mean": 0.05 * s + rng.gauss(0, 0.3), "reward/gold/mean": 0.04 * s + rng.gauss(0, 0.3),
        "kl/mean": 0.1 * s + rng.uniform(0, 0.3), "policy/entropy": 0.5 + rng.gauss(0, 0.03),
        "value/explained_variance": 0.2 + rng.gauss(0, 0.15), "value/loss": 0.5 + rng.uniform(0, 0.2),
        "value/clipfrac": rng.uniform(0, 0.2), "policy/clipfrac": rng.uniform(0.01, 0.1),
        "policy/approx_kl": rng.uniform(0.001, 0.03), "response/length_mean": 15 + rng.gauss(0, 2),
        "response/eos_rate": 0.8 + rng.uniform(-0.1, 0.1), "grad/norm": 0.5 + rng.uniform(0, 0.5),
        "policy/loss": rng.gauss(0, 0.1), "policy/first_ratio_max_dev": 0.0,
        "rollout/logprob_diff_mean": 0.02 + 0.005 * math.sin(s),  # no draw: the other metrics keep their noise
        "reward/rm/ensemble_std": 0.3 + 0.03 * math.sin(s),  # the same
    }  # fmt: skip


def run(n: int, seed: int = 0, config=PPO_CONFIG, change=lambda s, row: None) -> History:
    rng = random.Random(seed)
    rows = []
    for s in range(1, n + 1):
        row = {"step": s, **healthy(s, rng)}
        change(s, row)
        rows.append(row)
    return History(rows, config)


def fired(history: History) -> dict[str, list[tuple[int, int]]]:
    return {f.rule.name: f.episodes for f in diagnose(history)}


@pytest.mark.parametrize("seed", range(5))
def test_noise_around_a_healthy_trend_raises_nothing(seed):
    assert fired(run(80, seed)) == {}


def setter(key, fn):
    def change(s, row):
        value = fn(s, row)
        if value is not None:
            row[key] = value

    return change


FAILURES = {
    # rule: (what goes wrong from step 41 on, the first step the rule may fire)
    "non_finite": (setter("policy/loss", lambda s, r: math.nan if s == 50 else None), 50),
    "first_ratio_not_one": (setter("policy/first_ratio_max_dev", lambda s, r: 0.3 if s >= 41 else None), 41),
    "kl_blowup": (setter("kl/mean", lambda s, r: 40.0 if s == 45 else None), 45),
    "mismatch_growing": (setter("rollout/logprob_diff_mean", lambda s, r: 0.025 * 1.1 ** (s - 40) if s > 40 else None), 41),
    "kl_above_target": (setter("kl/mean", lambda s, r: 4.0 + 0.5 * (s - 40) if s > 40 else None), 60),
    "entropy_collapse": (setter("policy/entropy", lambda s, r: 0.5 * 0.8 ** (s - 40) if s > 40 else None), 41),
    "critic_worse_than_mean": (setter("value/explained_variance", lambda s, r: -0.3 if s >= 41 else None), 50),
    "value_loss_rising": (setter("value/loss", lambda s, r: 0.6 * 1.3 ** (s - 40) if s > 40 else None), 41),
    "value_clip_saturated": (setter("value/clipfrac", lambda s, r: 0.97 if s >= 41 else None), 45),
    "clipfrac_high": (setter("policy/clipfrac", lambda s, r: 0.45 if s >= 41 else None), 45),
    "approx_kl_high": (setter("policy/approx_kl", lambda s, r: 0.4 if s >= 41 else None), 43),
    "nothing_moves": (lambda s, r: r.update({"policy/clipfrac": 0.0, "policy/approx_kl": 0.0}) if s >= 41 else None, 50),
    "length_to_max": (setter("response/length_mean", lambda s, r: 31.8 if s >= 41 else None), 45),
    "length_to_one": (setter("response/length_mean", lambda s, r: 1.0 if s >= 41 else None), 45),
    "eos_vanishing": (setter("response/eos_rate", lambda s, r: 0.05 if s >= 41 else None), 45),
    "grad_spike": (setter("grad/norm", lambda s, r: 40.0 if s == 60 else None), 60),
    "off_policy_masked_high": (setter("policy/off_policy_masked", lambda s, r: 0.5 if s >= 41 else 0.02), 43),
    "episodes_truncated": (setter("episode/truncated", lambda s, r: 0.8 if s >= 41 else 0.1), 45),
    "tool_errors_high": (setter("episode/tool_errors", lambda s, r: 1.5 if s >= 41 else 0.1), 45),
    "ensemble_disagreement_rising": (setter("reward/rm/ensemble_std", lambda s, r: 0.3 * 1.03 ** (s - 40) if s > 40 else None), 41),
    "over_optimisation": (lambda s, r: r.update({"reward/gold/mean": 1.6 - 0.05 * (s - 40) + r["reward/gold/mean"] - 0.04 * s,
                                                 "reward/mean": 2.0 + 0.05 * (s - 40)}) if s > 40 else None, 41),
}  # fmt: skip


@pytest.mark.parametrize("rule", list(FAILURES))
def test_each_failure_is_named_by_its_rule(rule):
    change, earliest = FAILURES[rule]
    found = fired(run(80, 1, change=change))
    assert rule in found, found
    assert found[rule][0][0] >= earliest  # not before the failure began
    assert list(found) == [rule], found  # and no other rule: a flood of alarms would hide the cause


def test_no_group_signal_and_grpo_on_policy_updates():
    grpo = {"grpo": {"num_iterations": 1, "num_minibatches": 1}}
    rows = stream(
        30,
        reward__zero_std_groups=lambda s, rng: 1.0 if s > 10 else 0.25,
        policy__clipfrac=lambda s, rng: 0.0,
        policy__approx_kl=lambda s, rng: 0.0,
    )
    found = fired(History(rows, grpo))
    assert found == {"no_group_signal": [(15, 30)]}  # on-policy: a zero clipfrac is by design, not "nothing moves"


def test_no_clipfrac_alarm_under_cispo_where_no_gradient_is_cut():
    # the same high clip fraction that names clipfrac_high under PPO's clip counts capped weights under CISPO
    change = setter("policy/clipfrac", lambda s, r: 0.45 if s >= 41 else None)
    assert "clipfrac_high" in fired(run(80, 1, change=change))
    cispo = PPO_CONFIG | {"ppo": PPO_CONFIG["ppo"] | {"loss_type": "cispo"}}
    assert fired(run(80, 1, config=cispo, change=change)) == {}


def test_supervised_rules():
    at_chance = stream(
        60,
        train__loss=lambda s, rng: 0.69 + rng.gauss(0, 0.01),
        train__accuracy=lambda s, rng: 0.5 + rng.gauss(0, 0.02),
    )
    assert "accuracy_at_chance" in fired(History(at_chance))
    overfit = stream(
        60,
        train__loss=lambda s, rng: 2.0 - 0.02 * s,
        eval__loss=lambda s, rng: (1.5 + max(0, s - 30) * 0.01) if s % 5 == 0 else None,
    )
    overfit = [{k: v for k, v in row.items() if v is not None} for row in overfit]
    found = fired(History(overfit))
    assert list(found) == ["eval_loss_rising"] and found["eval_loss_rising"][0][0] >= 45


def test_every_rule_documents_itself():
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert rule.severity in ("info", "warning", "critical")
        assert rule.metrics and rule.threshold and rule.reason and rule.diagnosis and rule.fix, rule.name


def test_episodes_join_consecutive_logged_rows():
    # logged every 5 steps (run.log_every: 5): NaN rows 10-20 are one episode, 35 another
    rows = [{"step": s, "policy/loss": math.nan if s in (10, 15, 20, 35) else 0.1} for s in range(5, 45, 5)]
    (finding,) = diagnose(History(rows))
    assert finding.rule.name == "non_finite"
    assert finding.episodes == [(10, 20), (35, 35)] and finding.steps == [10, 15, 20, 35]


def test_a_row_without_a_rules_metrics_leaves_it_as_it_was():
    # an SFT run's evaluation-only rows (eval/loss) between its training rows (train/loss): the NaN training loss
    # holds through them, one episode, no start/clear at every evaluation
    rows = []
    for s in range(1, 13):
        rows.append({"step": s, "train/loss": math.nan if s >= 5 else 1.0})
        if s % 2 == 0:
            rows.append({"step": s, "eval/loss": 1.0})
    watch = Watch()
    events = [(e.kind, e.step, e.rule.name) for row in rows for e in watch.observe(row)]
    assert events == [("start", 5, "non_finite")]
    assert watch.findings()[0].episodes == [(5, 12)] and "non_finite" in watch.holding


def test_the_live_watch_starts_and_clears_where_diagnose_finds_the_episodes():
    history = fixture("seed0_ppo_no_kl")
    watch = Watch(history.config)
    events = [event for row in history.rows for event in watch.observe(row)]
    for finding in diagnose(history):
        starts = [e.step for e in events if e.rule.name == finding.rule.name and e.kind == "start"]
        clears = [e.step for e in events if e.rule.name == finding.rule.name and e.kind == "clear"]
        assert starts == [first for first, _ in finding.episodes]
        # a clear comes at the row after an episode ends; an episode reaching the last row never clears
        ends = [last for _, last in finding.episodes if last != history.step]
        assert len(clears) == len(ends) and all(c > e for c, e in zip(clears, ends, strict=True))
    assert {e.rule.name for e in events} == {f.rule.name for f in diagnose(history)} != set()


def test_the_readme_lists_every_rule_with_its_threshold_and_fix():
    # the table is written by tools/doctor_rules.py from RULES: rerun it when a rule changes
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tools"))
    try:
        import doctor_rules
    finally:
        sys.path.pop(0)
    readme = (root / "README.md").read_text()
    block = readme.split("<!-- doctor-rules:start -->")[1].split("<!-- doctor-rules:end -->")[0]
    assert block.strip() == doctor_rules.table(), "README's rules table is stale: python tools/doctor_rules.py"
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    assert len(rows) == len(RULES)
    for rule, row in zip(RULES, rows, strict=True):
        assert row.startswith(f"| `{rule.name}` | {rule.severity} |") and rule.fix in row


def test_over_optimisation_against_a_held_out_reward_logged_every_few_steps():
    # no monitor source: the truth is eval/reward/mean, logged every 5 steps (run.eval_every); it rises to step 40
    # then falls while the proxy keeps rising. The finding holds between evaluations too: one episode, no flapping.
    def change(s, row):
        row.pop("reward/gold/mean")  # the proxy, reward/mean, keeps its healthy rising trend
        if s % 5 == 0:
            row["eval/reward/mean"] = 0.05 * s if s <= 40 else 2.0 - 0.08 * (s - 40)

    config = {key: value for key, value in PPO_CONFIG.items() if key != "reward"}
    found = fired(run(80, 2, config=config, change=change))
    assert list(found) == ["over_optimisation"]
    ((first, last),) = found["over_optimisation"]
    assert 50 <= first <= 70 and last == 80


def test_a_condition_that_comes_and_goes_with_the_noise_is_one_finding():
    # clip fraction over 0.3 from step 41 to 60, dipping under it at 50-51 and 58: one episode (each dip silences
    # the 5-row check for 5 rows); it clears after 7 quiet rows (Rule.hold), at step 64
    dips = {50, 51, 58}

    def change(s, row):
        if 41 <= s <= 60:
            row["policy/clipfrac"] = 0.2 if s in dips else 0.45

    history = run(80, 3, change=change)
    watch = Watch(history.config)
    events = [(e.kind, e.step) for row in history.rows for e in watch.observe(row) if e.rule.name == "clipfrac_high"]
    assert events == [("start", 45), ("clear", 64)]
    assert fired(history)["clipfrac_high"] == [(45, 57)]


@pytest.mark.parametrize("name", ["seed0_ppo_no_kl", "seed0_rm"])
def test_running_statistics_give_what_a_fresh_history_gives(name):
    # History.prefix keeps running peaks, minima and sums as rows arrive; each check on the growing history must
    # say exactly what it says on a fresh history of the same rows (computed from scratch). The evidence strings
    # print 3 significant digits; the running sums of differences agree with a fresh sum to ~1e-15 relative
    history = fixture(name)
    growing = History([], history.config)
    for end, row in enumerate(history.rows, 1):
        growing.append(row)
        fresh = History(history.rows[:end], history.config)
        for rule in RULES:
            assert rule.check(growing) == rule.check(fresh), (rule.name, end)


def test_value_loss_rising_from_a_lowest_median_of_zero():
    # a critic that once fitted the returns exactly: the lowest 5-step median is 0, the ratio to it infinite
    rows = stream(20, value__loss=lambda s, rng: 0.0 if s <= 10 else 0.1 * 1.5 ** (s - 10))
    found = {f.rule.name: f for f in diagnose(History(rows))}
    assert found["value_loss_rising"].first.endswith("= inf× its lowest (0)")


def test_kl_blowup_is_measured_per_response_token():
    """A healthy demo PPO run (seed 5, avx2 kernels) whose KL rose from 0.94 to 3.81 nats in one step as the policy
    left the reference, then stayed near 4 with a held-out gold score of 2.1-2.7: 2.87 more nats over 22.9-token
    answers is 0.125 per token, under the rule's 0.5. The same jump over 4-token answers (0.72 per token) fires."""
    kls = [0.0, 0.02, 0.28, 0.06, 0.64, 0.94, 3.81, 5.0, 3.23, 4.87, 2.61, 3.44]

    def history(length):
        return History([{"step": s, "kl/mean": kl, "response/length_mean": length} for s, kl in enumerate(kls, 1)])

    assert "kl_blowup" not in fired(history(22.9))
    assert fired(history(4.0))["kl_blowup"] == [(7, 7)]


def test_ensemble_disagreement_rising_compares_the_last_window_with_the_start():
    """Start: the median of the first 5 values of reward/rm/ensemble_std (0.40); now: the mean of the last 5. The
    reward rises throughout (0.1 per step). At 0.64 = 1.6× the start it is silent (not above), at 0.66 it fires;
    with the reward back at its start it is silent again. The noise at 0.66, by hand: the 14 step-to-step
    differences are 0.02, 0.05, −0.10, 0.07, −0.02, four 0, 0.26, four 0: mean 0.28/14 = 0.02, mean square
    0.0858/14, so their spread √(0.0858/14 − 0.02²) = 0.0757 and the noise of the rise 0.0757/√5 = 0.0338: the
    rise 0.26 is 7.7 of it."""
    spreads = [0.38, 0.40, 0.45, 0.35, 0.42] + [0.40] * 5

    def evidence(last, reward_now=None):
        rows = [{"step": s, "reward/mean": 0.1 * s, "reward/rm/ensemble_std": v}
                for s, v in enumerate(spreads + [last] * 5, 1)]  # fmt: skip
        if reward_now is not None:
            for row in rows[-5:]:
                row["reward/mean"] = reward_now
        return RULES_BY_NAME["ensemble_disagreement_rising"].check(History(rows))

    assert evidence(0.64) is None
    assert evidence(0.66) == (
        "reward/rm/ensemble_std 0.66 (mean of the last 5 steps), 1.65× its start 0.4, 7.7× the noise"
    )
    assert evidence(0.66, reward_now=0.3) is None  # the first 5 rewards' median is 0.3: not above it


def test_ensemble_disagreement_rising_within_its_noise_is_silent():
    """The last 5 steps' mean is 1.7× the start (0.34 against the median 0.2), but the series jumps by about 0.45
    from step to step: the differences' spread is 0.290, so the noise of the rise is 0.290/√5 = 0.130 and the rise
    (0.14) is 1.1 of it, under the 3 the rule asks. Without the noise floor (z = 0) the same series fires."""
    from rlhf.doctor.rules import ensemble_disagreement_rising

    spreads = [0.1, 0.3, 0.05, 0.4, 0.2] + [0.05, 0.5, 0.05, 0.5, 0.05] + [0.34, 0.33, 0.35, 0.34, 0.34]
    rows = [{"step": s, "reward/mean": 0.1 * s, "reward/rm/ensemble_std": v} for s, v in enumerate(spreads, 1)]
    assert RULES_BY_NAME["ensemble_disagreement_rising"].check(History(rows)) is None
    assert "1.1× the noise" in ensemble_disagreement_rising(History(rows), z=0.0)
