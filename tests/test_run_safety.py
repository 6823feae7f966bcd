"""Never lose or silently replace a user's work: the run directory through the real commands, on tiny models.

A re-run is refused before anything is touched; ``--overwrite`` replaces the run whole; two runs on one
directory cannot interleave; ``--resume`` survives a torn checkpoint and refuses a changed config; ``sample``
and ``eval`` refuse to replace their outputs; a bad ``output_dir`` is one line and exit code 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from configs import nested
from rlhf import __version__, cli, evaluate, sample
from rlhf.config import ConfigError, config_from_dict, config_to_yaml
from rlhf.models.tiny import toy_corpus
from rlhf.runlog import rundir
from rlhf.runlog.checkpoint import save_checkpoint
from rlhf.trainers.rl import ppo

SRC = Path(rundir.__file__).resolve().parents[2]
LENGTH = f"{Path(__file__).resolve().parent / 'trainers' / 'ppo_rewards.py'}:length_chars"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``sft.jsonl`` (16 demonstrations: 4 steps of 4) and ``prompts.jsonl`` (12 prompts)."""
    root = tmp_path_factory.mktemp("safety_data")
    lines = toy_corpus(40, seed=5)
    rows = [{"prompt": " ".join(line.split()[:3]), "response": " " + " ".join(line.split()[3:6])} for line in lines]
    (root / "sft.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:16]))
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": row["prompt"]}) + "\n" for row in rows[:12]))
    return root


def sft_yaml(path: Path, model: Path, data: Path, out: Path, **overrides: object) -> Path:
    values = {"model.name": str(model), "data.train": str(data / "sft.jsonl"), "output_dir": str(out), "sft.epochs": 1,
              "batch.size": 4, "optim.learning_rate": 1e-3, "data.max_length": 32, "run.eval_every": 0, "run.save_every": 1,
              "run.progress": False}  # fmt: skip
    path.write_text(yaml.safe_dump(nested(values | overrides)))
    return path


def ppo_config(model: Path, data: Path, out: Path, **overrides: object):
    values = {"model.name": str(model), "reward.source": LENGTH, "data.train": str(data / "prompts.jsonl"),
              "output_dir": str(out), "ppo.steps": 2, "batch.size": 4, "sampling.max_new_tokens": 4, "run.eval_every": 0,
              "run.save_every": 1, "run.progress": False}  # fmt: skip
    return config_from_dict("ppo", nested(values | overrides))


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != rundir.LOCK_FILE
    }


def steps_of(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def child_env() -> dict[str, str]:
    """The environment of an ``rlhf`` process: this checkout's src first, then the environment's own PYTHONPATH (a
    machine may provide torch and the other packages that way rather than installed)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}


def rlhf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlhf", *args], env=child_env(), capture_output=True, text=True)


# --------------------------------------------------------------------------------------------------------------
# Re-running: refused, or replaced whole with --overwrite
# --------------------------------------------------------------------------------------------------------------


def test_rerun_is_refused_untouched_and_overwrite_leaves_nothing_stale(tiny_llama_dir, data, tmp_path, capsys):
    out = tmp_path / "run"
    config = sft_yaml(tmp_path / "sft.yaml", tiny_llama_dir, data, out)
    assert cli.main(["sft", "--config", str(config)]) == 0
    assert steps_of(out) == [1, 2, 3, 4] and len(list((out / "checkpoints").iterdir())) == 4
    before = snapshot(out)
    capsys.readouterr()
    # the same command again: one line, exit 2, nothing touched (bytes and mtimes)
    assert cli.main(["sft", "--config", str(config), "--optim.learning_rate", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds a run" in err and "--run.resume" in err and "--run.overwrite" in err
    assert snapshot(out) == before
    # --overwrite: a new run, without checkpoints; the old ones are gone, so --resume cannot pick them up
    assert (
        cli.main(["sft", "--config", str(config), "--run.overwrite", "--run.save_every", "0", "--sft.epochs", "2"]) == 0
    )
    assert steps_of(out) == list(range(1, 9))
    assert not (out / "checkpoints").exists()
    recorded = (out / "config.yaml").read_text()
    assert yaml.safe_load(recorded)["sft"]["epochs"] == 2
    # its second line names the versions it ran with (a comment: the config read back is unchanged)
    assert recorded.splitlines()[1].startswith(f"# rlhf {__version__}, torch {torch.__version__}, transformers ")
    assert cli.main(["sft", "--config", str(config), "--run.resume", "--run.save_every", "0", "--sft.epochs", "2"]) == 2
    assert "finished without a checkpoint" in capsys.readouterr().err
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [rundir.LOCK_FILE]  # no temp leftovers


def test_resume_skips_a_torn_newest_checkpoint(tiny_llama_dir, data, tmp_path, capsys):
    out = tmp_path / "run"
    config = sft_yaml(tmp_path / "sft.yaml", tiny_llama_dir, data, out, **{"run.save_every": 2})
    assert cli.main(["sft", "--config", str(config)]) == 0
    torn = out / "checkpoints" / "step_000004" / "state.pt"
    torn.write_bytes(torn.read_bytes()[:1000])  # the disk filled while it was written
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "train/lo')  # and a line torn by the same crash
    capsys.readouterr()
    assert cli.main(["sft", "--config", str(config), "--run.resume", "--sft.epochs", "2"]) == 0
    err = capsys.readouterr().err
    assert "step_000004 cannot be loaded" in err and "falling back" in err
    assert "resuming from" in err and "step_000002 (step 2)" in err
    assert "dropping the torn last line" in err
    assert steps_of(out) == list(range(1, 9))  # 3-4 again from step 2, then the new epoch, once each


def test_a_run_directory_moved_elsewhere_resumes_there(tiny_llama_dir, data, tmp_path):
    """``output_dir`` may change on resume (to another disk, say): the moved run continues from its checkpoint to
    the weights the run left in place ends with, bit for bit, and records where it now lives."""
    finals = []
    for name, moved in (("stayed", None), ("moved", tmp_path / "elsewhere" / "run")):
        out = tmp_path / name
        config = sft_yaml(tmp_path / f"{name}.yaml", tiny_llama_dir, data, out, **{"run.save_every": 2})
        assert cli.main(["sft", "--config", str(config)]) == 0  # epoch 1 of 2
        if moved is not None:
            moved.parent.mkdir()
            out = Path(shutil.move(out, moved))
        assert (
            cli.main(["sft", "--config", str(config), "--output_dir", str(out), "--run.resume", "--sft.epochs", "2"])
            == 0
        )
        assert steps_of(out) == list(range(1, 9))
        assert yaml.safe_load((out / "config.yaml").read_text())["output_dir"] == str(out)
        finals.append(load_file(out / "final" / "model.safetensors"))
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][name], finals[1][name]) for name in finals[0])


# --------------------------------------------------------------------------------------------------------------
# Two runs on one directory
# --------------------------------------------------------------------------------------------------------------


def test_a_second_run_on_a_busy_directory_is_refused_and_the_first_logs_each_step_once(tiny_llama_dir, data, tmp_path):
    """The first run's reward waits for a file, so it is certainly mid-run when the second one starts."""
    go = tmp_path / "go"
    rewards = tmp_path / "waiting.py"
    rewards.write_text(
        textwrap.dedent(f"""
        import pathlib, time
        def wait_then_length(completions, **kwargs):
            while not pathlib.Path({str(go)!r}).exists():
                time.sleep(0.05)
            return [len(c) / 10 for c in completions]
    """)
    )
    out = tmp_path / "run"
    config = tmp_path / "ppo.yaml"
    config.write_text(
        config_to_yaml(
            ppo_config(tiny_llama_dir, data, out, **{"ppo.steps": 3, "reward.source": f"{rewards}:wait_then_length"})
        )
    )
    first = subprocess.Popen([sys.executable, "-m", "rlhf", "ppo", "--config", str(config)], env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        while not (out / rundir.LOCK_FILE).exists() or not (out / rundir.LOCK_FILE).read_text().strip():
            assert first.poll() is None, first.communicate()
        second = rlhf("ppo", "--config", str(config))
        assert second.returncode == 2
        assert f"is in use by another run (pid {first.pid})" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        go.touch()
        first.communicate()
    assert first.returncode == 0
    assert steps_of(out) == [0, 1, 2, 3]  # step 0: the held-out answers before training


# --------------------------------------------------------------------------------------------------------------
# Resuming with another config: refused before any model loads, naming each field
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "changes"),
    [("rm", {"batch.size": 8, "optim.learning_rate": 1e-3}), ("grpo", {"grpo.group_size": 2, "model.lora": {"r": 2}})],
)
def test_rm_and_grpo_resume_with_a_changed_config_is_refused(tmp_path, command, changes):
    out = tmp_path / "run"
    out.mkdir()
    base = {"data.train": "t.jsonl", "output_dir": str(out)}
    base |= {"model.name": "m"} if command == "rm" else {"model.name": "p", "reward.source": LENGTH}
    rundir.write_run_config(out, config_from_dict(command, nested(base)))
    save_checkpoint(out, 1, {"step": 1})
    runner = cli.runner(command)
    with pytest.raises(ConfigError, match="resume: the config differs") as error:
        runner(config_from_dict(command, nested(base | changes | {"run.resume": True})))
    for field in changes:
        assert f"{field}: " in str(error.value), field


def test_resume_with_a_changed_config_is_refused_naming_each_field(tmp_path):
    out = tmp_path / "run"
    recorded = ppo_config("policy", tmp_path, out)  # never loaded: the refusal comes first
    out.mkdir()
    rundir.write_run_config(out, recorded)
    save_checkpoint(out, 1, {"step": 1})
    before = snapshot(out)
    changed = ppo_config("policy", tmp_path, out, **{"run.resume": True, "data.train": "other.jsonl", "ppo.critic": "separate", "model.lora": {"r": 4}}, **{"optim.learning_rate": 1e-4, "ppo.steps": 10})  # fmt: skip
    with pytest.raises(ConfigError) as error:
        ppo.run(changed)
    message = str(error.value)
    for field in ("data.train", "ppo.critic", "model.lora", "optim.learning_rate"):
        assert f"{field}: " in message, field
    assert "ppo.steps" not in message.split("Only")[0]  # steps may change
    assert snapshot(out) == before


# --------------------------------------------------------------------------------------------------------------
# sample and eval outputs; unusable output_dir
# --------------------------------------------------------------------------------------------------------------


def test_sample_and_eval_refuse_existing_outputs_without_overwrite(tiny_llama_dir, data, tmp_path):
    prompts = str(data / "prompts.jsonl")
    out, samples = tmp_path / "samples.jsonl", tmp_path / "eval_samples.jsonl"
    out.write_text("precious\n")
    samples.write_text("precious\n")
    values = {"model.name": str(tiny_llama_dir), "prompts": prompts, "output": str(out), "sampling.max_new_tokens": 4,
              "progress": False}  # fmt: skip
    with pytest.raises(ConfigError, match=r"sample: output '.*samples.jsonl' already exists; pass --overwrite"):
        sample.run(config_from_dict("sample", nested(values)))
    eval_values = {"model.name": str(tiny_llama_dir), "eval_data": prompts, "reward.source": LENGTH, "sampling.max_new_tokens": 4,
                   "output": str(tmp_path / "new.json"), "samples_output": str(samples), "progress": False}  # fmt: skip
    with pytest.raises(ConfigError, match=r"eval: samples_output '.*' already exists; pass --overwrite"):
        evaluate.run(config_from_dict("eval", nested(eval_values)))
    assert out.read_text() == samples.read_text() == "precious\n"
    assert not (tmp_path / "new.json").exists()
    sample.run(config_from_dict("sample", nested(values | {"overwrite": True})))
    assert len(out.read_text().splitlines()) == 12
    evaluate.run(config_from_dict("eval", nested(eval_values | {"overwrite": True})))
    assert len(samples.read_text().splitlines()) == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_samples.jsonl", "new.json", "samples.jsonl"]


def test_output_dir_that_is_a_file_is_one_line_and_exit_2(tiny_llama_dir, data, tmp_path, capsys):
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    for out in (a_file, a_file / "run"):
        config = sft_yaml(tmp_path / "sft.yaml", tiny_llama_dir, data, out)
        assert cli.main(["sft", "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: sft: output_dir ") and err.count("\n") == 1, err
    assert a_file.read_text() == "x"


def test_demo_refuses_a_directory_holding_a_demo(tmp_path, capsys):
    (tmp_path / "summary.json").write_text("{}")
    assert cli.main(["demo", "--output_dir", str(tmp_path), "--preset", "tiny", "--no-progress"]) == 2
    assert "already holds a run (summary.json)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [rundir.LOCK_FILE, "summary.json"]
