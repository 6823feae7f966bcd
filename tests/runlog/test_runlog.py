"""Run bookkeeping: checkpoints are atomic and ordered, metrics resume cleanly, RNG state round-trips."""

from __future__ import annotations

import json
import random

import pytest
import torch

from rlhf.optim import lr_multiplier
from rlhf.runlog.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from rlhf.runlog.metrics import MetricsLogger
from rlhf.runlog.seeding import process_seed, rng_state, set_rng_state


def test_checkpoints_newest_wins_and_partial_writes_are_ignored(tmp_path):
    save_checkpoint(tmp_path, 2, {"x": torch.tensor([2.0])})
    save_checkpoint(tmp_path, 10, {"x": torch.tensor([10.0])})
    # a run killed mid-write leaves only a .tmp directory: never taken for a checkpoint
    (tmp_path / "checkpoints" / "step_000020.tmp").mkdir()
    (tmp_path / "checkpoints" / "step_000020.tmp" / "state.pt").write_bytes(b"partial")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000002", "step_000010"]
    assert load_checkpoint(list_checkpoints(tmp_path)[-1])["x"].item() == 10.0
    save_checkpoint(tmp_path, 20, {"x": torch.tensor([20.0])})  # over the .tmp leftover
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000002", "step_000010", "step_000020"]
    assert list_checkpoints(tmp_path / "nothing") == []


def test_metrics_resume_drops_rows_from_the_resume_step_on(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in range(1, 5):
        logger.log({"step": step, "reward/mean": torch.tensor(step * 0.5)})
    logger.close()
    resumed = MetricsLogger(tmp_path, resume_step=3)  # the checkpoint was at step 2
    resumed.log({"step": 3, "reward/mean": 9.0})
    resumed.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(1, 0.5), (2, 1.0), (3, 9.0)]


def test_tensorboard_sink_writes_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(tmp_path, report_to=("jsonl", "tensorboard"))
    logger.log({"step": 1, "reward/mean": 0.25, "kl/mean": float("nan")})
    logger.log({"step": 2, "reward/mean": 0.75})
    logger.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.25), (2, 0.75)]
    assert "kl/mean" not in events.Tags()["scalars"]  # non-finite values are not sent


def test_unknown_sink_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown metrics sink"):
        MetricsLogger(tmp_path, report_to=("jsonl", "mlflow"))


def test_rng_state_round_trip():
    gen = torch.Generator().manual_seed(5)
    state = rng_state({"sampling": gen})
    first = (random.random(), torch.rand(3), torch.rand(2, generator=gen))
    set_rng_state(state, {"sampling": gen})
    again = (random.random(), torch.rand(3), torch.rand(2, generator=gen))
    assert first[0] == again[0] and torch.equal(first[1], again[1]) and torch.equal(first[2], again[2])
    with pytest.raises(KeyError, match="other"):
        set_rng_state(state, {"other": torch.Generator()})
    assert process_seed(7, rank=2) == 7 + 2 * 100003


def test_lr_schedules():
    linear = lr_multiplier("linear", warmup_steps=0, total_steps=4)
    # N-details linear anneal (reference 2-N): lr·[1, 0.75, 0.5, 0.25]
    assert [linear(s) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    warm = lr_multiplier("cosine", warmup_steps=2, total_steps=6)
    assert [round(warm(s), 6) for s in range(6)] == [0.333333, 0.666667, 1.0, 0.853553, 0.5, 0.146447]
    assert lr_multiplier("constant", 0, 10)(9) == 1.0
    with pytest.raises(ValueError, match="lr_scheduler"):
        lr_multiplier("step", 0, 10)(0)
