"""The doctor's rules for asynchronous RL (``sampling.max_staleness`` k > 0, docs/async.md): ``async_does_not_pay``
(one side of the pipeline mostly waits for the other) and ``stale_samples_hurt`` (the batches too stale for the
importance weights), each firing on hand-built rows that show its failure and silent on a balanced async run and on
every synchronous one; ``mismatch_growing`` leaves the gap that staleness widens by design to them."""

from __future__ import annotations

import pytest

from rlhf.doctor.rules import History
from rlhf.doctor.watch import diagnose

ASYNC = {"sampling": {"max_staleness": 2, "is_correction": "token", "is_cap": 3.0}}
SYNCHRONOUS = [{"sampling": {"max_staleness": 0}}, {}]  # k = 0 written out, and a run without its config


def row(step: int, **metrics: float) -> dict:
    """A balanced async step of 1 s: the trainer barely waits for its batch, the worker barely for its weights (step 1
    waits for the worker's start); the behaviour–proximal gap widens with the staleness min(2, step − 1) and then
    as the policy learns, but stays well within bounds."""
    staleness = min(2, step - 1)
    return {
        "step": step,
        "async/staleness": staleness,
        "time/step_s": 1.0,
        "time/rollout_s": 0.9 if step == 1 else 0.05,
        "time/producer_idle_s": 0.0 if step == 1 else 0.08,
        "rollout/is_weight_mean": 0.99,
        "rollout/is_capped_frac": 0.001 * staleness,
        "rollout/logprob_diff_mean": 0.01 + 0.04 * staleness + 0.004 * step,
        **{key.replace("__", "/"): value for key, value in metrics.items()},
    }


def run(n: int = 30, config=ASYNC, **from_step_11: float) -> History:
    """``n`` balanced steps, with ``from_step_11`` (``time__rollout_s=0.8``: ``time/rollout_s`` 0.8) from step 11 on."""
    return History([row(s, **(from_step_11 if s >= 11 else {})) for s in range(1, n + 1)], config)


def findings(history: History) -> dict:
    return {f.rule.name: f for f in diagnose(history)}


def test_a_balanced_async_run_raises_nothing():
    # its gap grows from 0.014 (step 1) to 0.21: mismatch_growing's condition at k = 0, by design here
    assert findings(run()) == {}


@pytest.mark.parametrize("config", SYNCHRONOUS)
def test_a_growing_gap_at_k_0_is_mismatch_growing_and_not_staleness(config):
    found = findings(run(config=config))
    assert list(found) == ["mismatch_growing"]


def test_the_trainer_waiting_for_its_samples():
    found = findings(run(time__rollout_s=0.8, time__step_s=1.25))
    assert list(found) == ["async_does_not_pay"]
    finding = found["async_does_not_pay"]
    assert finding.rule.severity == "info"
    assert finding.episodes == [(13, 30)]  # the median of the last 5 steps: from the third such step on
    assert finding.first == (
        "the trainer waited for its batch 64% of each step (time/rollout_s over time/step_s, median of the last 5 "
        "steps): sampling is the bottleneck"
    )


def test_the_worker_idling_for_its_weights():
    found = findings(run(time__producer_idle_s=1.4, time__step_s=2.0))
    assert list(found) == ["async_does_not_pay"]
    assert found["async_does_not_pay"].episodes == [(13, 30)]
    assert found["async_does_not_pay"].first.startswith("the worker waited for its weights 70% of each step")


def test_the_first_batch_is_always_waited_for():
    # every step waits for its batch 90 % of the time: the finding starts once the last 5 steps leave out step 1
    rows = [row(s, time__rollout_s=0.9) for s in range(1, 9)]
    found = findings(History(rows, ASYNC))
    assert found["async_does_not_pay"].episodes == [(6, 8)]


@pytest.mark.parametrize("config", SYNCHRONOUS)
def test_no_async_finding_in_a_synchronous_run(config):
    # at k = 0 rollout_s is the sampling itself: a run that mostly samples is no pipeline out of balance
    waiting = run(config=config, time__rollout_s=0.9, rollout__is_capped_frac=0.2)
    assert not {"async_does_not_pay", "stale_samples_hurt"} & set(findings(waiting))
    rows = [
        {k: v for k, v in r.items() if not k.startswith("async/") and k != "time/producer_idle_s"} for r in waiting.rows
    ]
    assert not {"async_does_not_pay", "stale_samples_hurt"} & set(findings(History(rows, config)))


def test_most_weights_capped():
    found = findings(run(rollout__is_capped_frac=0.12, rollout__is_weight_mean=0.7))
    assert list(found) == ["stale_samples_hurt"]
    finding = found["stale_samples_hurt"]
    assert finding.rule.severity == "warning" and finding.episodes == [(13, 30)]
    assert finding.first == "rollout/is_capped_frac 12.0% (median of the last 5 steps; sampling.max_staleness 2)"


def test_a_gap_past_the_bound():
    found = findings(run(rollout__logprob_diff_mean=0.8))
    assert list(found) == ["stale_samples_hurt"]
    assert found["stale_samples_hurt"].first == (
        "rollout/logprob_diff_mean 0.8 (median of the last 5 steps; sampling.max_staleness 2)"
    )
    both = findings(run(rollout__logprob_diff_mean=0.8, rollout__is_capped_frac=0.06))["stale_samples_hurt"]
    assert both.first.startswith("rollout/is_capped_frac 6.0% and rollout/logprob_diff_mean 0.8 (")


def test_a_finding_clears_when_the_balance_comes_back():
    # waiting from step 11 to 20 only: the finding holds from 13 to 22, the median of 5 steps 2 steps late each way
    rows = [row(s, **({"time/rollout_s": 0.8} if 11 <= s <= 20 else {})) for s in range(1, 31)]
    assert findings(History(rows, ASYNC))["async_does_not_pay"].episodes == [(13, 22)]
