"""Live alarms (`rlhf.runlog.health`): each finding said once when it starts and when it clears, its events in
``doctor.jsonl``, what holds listed under the progress bar, a resumed run that remembers, and ``stop_on``."""

from __future__ import annotations

import json
import math

import pytest

from rlhf.runlog.health import EVENTS_FILE, HealthLog
from rlhf.runlog.metrics import MetricsLogger
from rlhf.runlog.progress import StepProgress


def rows(n: int, nan_steps: range = range(0), spike: int | None = None) -> list[dict]:
    """Steps 1..n of a quiet run; policy/loss is NaN (critical) at ``nan_steps``, grad/norm spikes (info) at
    ``spike``."""
    return [
        {"step": s, "policy/loss": math.nan if s in nan_steps else 0.1, "grad/norm": 50.0 if s == spike else 1.0}
        for s in range(1, n + 1)
    ]


def events(out) -> list[tuple[int, str, str]]:
    lines = (out / EVENTS_FILE).read_text().splitlines()
    return [(e["step"], e["event"], e["rule"]) for e in map(json.loads, lines)]


def test_each_finding_is_said_once_when_it_starts_and_when_it_clears(tmp_path):
    said: list[str] = []
    health = HealthLog(tmp_path, {}, [], None)
    health.say = said.append
    for row in rows(20, nan_steps=range(5, 8), spike=15):
        health.observe(row)
        if row["step"] == 6:
            assert health.notes() == ["doctor [critical] non_finite since step 5: policy/loss = nan at step 6"]
    health.close()
    assert events(tmp_path) == [(5, "start", "non_finite"), (8, "clear", "non_finite"),
                                (15, "start", "grad_spike"), (16, "clear", "grad_spike")]  # fmt: skip
    assert said[0].startswith("doctor: step 5: [critical] non_finite: a loss, gradient norm, reward or KL is not")
    assert "try: lower optim.learning_rate" in said[0]
    assert said[1] == "doctor: step 8: non_finite cleared" and len(said) == 4
    assert health.notes() == [] and health.stop is None  # stop_on never


def test_every_event_carries_what_a_tool_needs(tmp_path):
    health = HealthLog(tmp_path, {}, [], None)
    health.say = lambda message: None
    for row in rows(6, nan_steps=range(3, 7)):
        health.observe(row)
    health.close()
    (event,) = map(json.loads, (tmp_path / EVENTS_FILE).read_text().splitlines())
    assert event == {"step": 3, "event": "start", "rule": "non_finite", "severity": "critical",
                     "evidence": "policy/loss = nan at step 3", "diagnosis": event["diagnosis"],
                     "fix": event["fix"]}  # fmt: skip
    assert event["diagnosis"] and "optim.learning_rate" in event["fix"]


def test_a_resumed_run_remembers_what_held_and_drops_the_events_it_runs_again(tmp_path):
    run = rows(20, nan_steps=range(5, 12))
    first = HealthLog(tmp_path, {}, [], None)
    first.say = lambda message: None
    for row in run[:14]:  # logged to step 14, then killed; the checkpoint was at step 10
        first.observe(row)
    first.close()
    assert events(tmp_path) == [(5, "start", "non_finite"), (12, "clear", "non_finite")]

    said: list[str] = []
    resumed = HealthLog(tmp_path, {}, run[:10], resume_step=11)
    resumed.say = said.append
    assert [note.split(":")[0] for note in resumed.notes()] == ["doctor [critical] non_finite since step 5"]
    assert events(tmp_path) == [(5, "start", "non_finite")]  # the clear at step 12 is of a step run again
    for row in run[10:]:
        resumed.observe(row)
    resumed.close()
    assert events(tmp_path) == [(5, "start", "non_finite"), (12, "clear", "non_finite")]
    assert said == ["doctor: step 12: non_finite cleared"]  # nothing said again about step 5


@pytest.mark.parametrize(("stop_on", "stop_step"), [("never", None), ("critical", 14), ("warning", 14)])
def test_stop_on_asks_to_stop_at_the_first_finding_that_severe(tmp_path, stop_on, stop_step):
    health = HealthLog(tmp_path, {}, [], None, stop_on=stop_on)
    health.say = lambda message: None
    for row in rows(16, nan_steps=range(14, 16), spike=12):  # the spike (info) never stops a run
        health.observe(row)
    assert [e[2] for e in events(tmp_path) if e[1] == "start"] == ["grad_spike", "non_finite"]
    assert (health.stop.step if health.stop else None) == stop_step


def test_the_logger_hands_every_logged_row_to_the_doctor(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.health = HealthLog(tmp_path, {}, logger.kept, None)
    said: list[str] = []
    logger.health.say = said.append
    for row in rows(4, nan_steps=range(2, 3)):
        logger.log(row)
    logger.close()
    assert events(tmp_path) == [(2, "start", "non_finite"), (3, "clear", "non_finite")] and len(said) == 2


def test_the_progress_bar_prints_alarms_and_lists_what_holds(tmp_path, capsys):
    health = HealthLog(tmp_path, {}, [], None)
    with StepProgress(6, enabled=True, health=health) as progress:
        for row in rows(6, nan_steps=range(4, 7)):
            health.observe(row)
            progress.update(row["step"], row)
    assert health.say is not None
    err = capsys.readouterr().err
    assert "doctor: step 4: [critical] non_finite" in err  # said above the bar
    assert "doctor [critical] non_finite since step 4" in err  # still holding under the bar when it stopped
    said: list[str] = []
    health.say = said.append  # after the bar, messages go where they went before it
    health.close()
