"""The run directory: one run at a time (flock), existing work refused, resume checked, files replaced atomically.

No models here: configs are built but never run; real processes where the behaviour is about processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from configs import nested
from rlhf.config import ConfigError, config_from_dict
from rlhf.runlog import rundir
from rlhf.runlog.checkpoint import save_checkpoint
from rlhf.runlog.metrics import MetricsLogger
from rlhf.runlog.rundir import write_run_config

SRC = Path(rundir.__file__).resolve().parents[2]


def sft_config(out: Path, **overrides: object):
    values = {"model.name": "some/model", "data.train": "train.jsonl", "output_dir": str(out), "run.progress": False}
    return config_from_dict("sft", nested(values | overrides))


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root`` (the lock file aside): its bytes and mtime."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != rundir.LOCK_FILE
    }


def finished_run(out: Path, config, steps=(2, 4)) -> None:
    """What a finished run leaves: config.yaml, metrics, checkpoints, final/."""
    write_run_config(out, config)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 5)))
    for step in steps:
        save_checkpoint(out, step, {"step": step})
    (out / "final").mkdir()
    (out / "final" / "model.safetensors").write_bytes(b"weights")


def claim(config) -> None:
    """Claim ``output_dir`` and let go: what a run does before its first model loads."""
    with rundir.claim(config):
        pass


def python(code: str) -> subprocess.Popen:
    # this checkout's src first, then the environment's own PYTHONPATH: a machine may provide torch and the other
    # packages that way rather than installed (without them the child stopped at its imports, exit 1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    # stdin is a pipe the child can wait on (`input()`), whatever the test runner's own stdin is (CI has none)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


# --------------------------------------------------------------------------------------------------------------
# Claiming output_dir
# --------------------------------------------------------------------------------------------------------------


def test_an_existing_run_is_refused_and_left_untouched(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    finished_run(out, sft_config(out))
    before = snapshot(out)
    with pytest.raises(ConfigError, match=r"output_dir .* already holds a run \(config.yaml, metrics.jsonl"
                       r".*--run.resume to continue it or --run.overwrite to replace it"):  # fmt: skip
        claim(sft_config(out))
    assert snapshot(out) == before


def test_a_directory_without_rlhf_files_is_usable_and_overwrite_removes_only_rlhf_files(tmp_path):
    out = tmp_path
    (out / "ppo.yaml").write_text("mine")  # the user's own files (or `output_dir: .`)
    (out / "notes").mkdir()
    claim(sft_config(out))
    finished_run(out, sft_config(out))
    (out / "samples").mkdir()
    (out / "samples" / "step_000002.jsonl").write_text("{}\n")
    with rundir.claim(sft_config(out, **{"run.overwrite": True})):
        rundir.clear_run(out)
    assert sorted(p.name for p in out.iterdir()) == sorted([rundir.LOCK_FILE, "ppo.yaml", "notes"])


def test_resume_and_overwrite_together_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"run.resume and run.overwrite are both set"):
        sft_config(tmp_path, **{"run.resume": True, "run.overwrite": True})


def test_output_dir_that_is_a_file_or_cannot_be_created_is_refused(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=r"^sft: output_dir '.*file' is a file, not a directory"):
        claim(sft_config(a_file))
    with pytest.raises(ConfigError, match=r"^sft: output_dir '.*file/run' cannot be created: Not a directory"):
        claim(sft_config(a_file / "run"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_output_dir_is_refused(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match=r"output_dir '.*ro' is not writable"):
            claim(sft_config(out))
    finally:
        out.chmod(0o755)


def test_a_second_run_is_refused_naming_the_holder_and_a_killed_holder_frees_it(tmp_path):
    out = tmp_path / "run"
    holder = python(f"""
        from rlhf.config import config_from_dict
        from rlhf.runlog import rundir
        config = config_from_dict("sft", {{"model": {{"name": "m"}}, "data": {{"train": "t"}}, "output_dir": {str(out)!r}}})
        with rundir.claim(config):
            print("locked", flush=True)
            input()
    """)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(ConfigError, match=rf"output_dir '.*run' is in use by another run \(pid {holder.pid}\)"):
            claim(sft_config(out))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with rundir.claim(sft_config(out)):  # the kernel released the dead process's lock
        pass


# --------------------------------------------------------------------------------------------------------------
# Resume
# --------------------------------------------------------------------------------------------------------------


def test_resume_refuses_a_changed_config_listing_each_field(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    finished_run(out, sft_config(out, **{"optim.learning_rate": 1e-3}))
    changed = sft_config(out, **{"run.resume": True, "optim.learning_rate": 2e-3, "data.train": "other.jsonl", "batch.size": 16, "model.lora": {"r": 4}})  # fmt: skip
    with pytest.raises(ConfigError) as error:
        claim(changed)
    message = str(error.value)
    assert "data.train: 'train.jsonl' → 'other.jsonl'" in message
    assert "optim.learning_rate: 0.001 → 0.002" in message
    assert "batch.size: 32 → 16" in message
    assert "model.lora: None → {'r': 4," in message
    assert "--run.overwrite instead of --run.resume" in message
    # the fields that may change on resume
    same = sft_config(out, **{"run.resume": True, "optim.learning_rate": 1e-3, "sft.epochs": 5, "run.eval_every": 7, "run.save_every": 3, "run.log_every": 2, "run.name": "x", "run.report_to": ["jsonl", "tensorboard"], "batch.micro_size": 8})  # fmt: skip
    claim(same)


def test_resume_of_another_command_is_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    finished_run(out, sft_config(out))
    rm = config_from_dict(
        "rm", nested({"model.name": "m", "data.train": "train.jsonl", "output_dir": str(out), "run.resume": True})
    )
    with pytest.raises(ConfigError, match=r"in command: sft → rm"):
        claim(rm)


def test_resume_of_a_finished_run_without_checkpoints_is_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    finished_run(out, sft_config(out), steps=())
    with pytest.raises(ConfigError, match=r"finished without a checkpoint .* --run.overwrite instead of --run.resume"):
        claim(sft_config(out, **{"run.resume": True}))


def test_a_torn_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    out = tmp_path
    save_checkpoint(out, 2, {"step": 2, "x": torch.ones(3)})
    newest = save_checkpoint(out, 4, {"step": 4, "x": torch.ones(1000)})
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[:100])  # disk full: the file was renamed in half-written
    path, saved = rundir.load_resume_checkpoint(sft_config(out, **{"run.resume": True}))
    assert (path.name, saved["step"]) == ("step_000002", 2)
    assert f"checkpoint {newest} cannot be loaded" in capsys.readouterr().err
    (path / "state.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"none of the 2 checkpoints .* can be loaded"):
        rundir.load_resume_checkpoint(sft_config(out, **{"run.resume": True}))
    assert rundir.load_resume_checkpoint(sft_config(out)) == (None, None)


# --------------------------------------------------------------------------------------------------------------
# metrics.jsonl on resume
# --------------------------------------------------------------------------------------------------------------


def test_a_torn_last_metrics_line_is_dropped_with_a_message(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    MetricsLogger(tmp_path, resume_step=5).close()
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert "dropping the torn last line 3" in capsys.readouterr().err
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON row"):
        MetricsLogger(tmp_path, resume_step=5)


def test_a_kill_during_the_metrics_rewrite_leaves_the_complete_file(tmp_path):
    """The process dies (SIGKILL) at the worst moment: the new contents are written, the rename not yet done."""
    path = tmp_path / "metrics.jsonl"
    rows = "".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in range(1, 31))
    path.write_text(rows)
    victim = python(f"""
        import os, signal
        from rlhf.runlog import rundir
        from rlhf.runlog.metrics import MetricsLogger
        rundir.os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        MetricsLogger({str(tmp_path)!r}, resume_step=11)
    """)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert path.read_text() == rows
    leftovers = list(tmp_path.glob(".metrics.jsonl.*.tmp"))
    assert len(leftovers) == 1  # the new contents it never renamed; the next run's claim deletes them
    claim(sft_config(tmp_path, **{"run.resume": True}))
    assert not leftovers[0].exists()
    # the next resume cleans up after it and keeps steps 1-10
    MetricsLogger(tmp_path, resume_step=11).close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == list(range(1, 11))


# --------------------------------------------------------------------------------------------------------------
# Atomic files and directories
# --------------------------------------------------------------------------------------------------------------


def test_staged_replaces_a_directory_whole_or_not_at_all(tmp_path):
    final = tmp_path / "final"
    final.mkdir()
    (final / "old.bin").write_text("old")
    with pytest.raises(RuntimeError, match="disk full"), rundir.staged(final) as staging:
        (staging / "final").mkdir()
        (staging / "final" / "new.bin").write_text("half")
        raise RuntimeError("disk full")
    assert [p.name for p in final.iterdir()] == ["old.bin"]
    with rundir.staged(final) as staging:
        (staging / "final").mkdir()
        (staging / "final" / "new.bin").write_text("new")
    assert [p.name for p in final.iterdir()] == ["new.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no temp directory left behind


def test_atomic_open_keeps_the_old_file_on_error_and_never_replaces_a_file_without_being_asked(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    with pytest.raises(RuntimeError), rundir.atomic_open(path) as f:
        f.write("new")
        raise RuntimeError
    assert path.read_text() == "old\n"
    refused = pytest.raises(ConfigError, match=r"was written by another process meanwhile")
    with refused, rundir.atomic_open(path, replace=False) as f:
        f.write("new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_a_run_failing_before_it_writes_leaves_no_directory_it_created(tmp_path):
    out = tmp_path / "new" / "run"
    with pytest.raises(ValueError), rundir.claim(sft_config(out)):
        raise ValueError("bad data")
    assert not out.exists()
    out.mkdir()  # a directory that was there before stays
    with pytest.raises(ValueError), rundir.claim(sft_config(out)):
        raise ValueError("bad data")
    assert out.is_dir()
