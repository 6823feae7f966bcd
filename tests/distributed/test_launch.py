"""Launching as users do: two torchrun "nodes" on localhost, a crash and a resume at another world size, a rank
that fails. Real torchrun, gloo, processes on this machine."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from torchrun_runs import (
    TIMEOUT_S,
    assert_same_gradients,
    assert_same_metrics,
    assert_same_weights,
    command_line,
    environment,
    run,
    torchrun,
    two_nodes,
)

from configs import nested

pytestmark = [pytest.mark.slow, pytest.mark.longest]

REWARDS = Path(__file__).resolve().parent / "dist_rewards.py"


def ppo_config(policy: Path, prompts: Path, **overrides: object) -> dict:
    return {
        "model.name": str(policy), "reward.source": f"{REWARDS}:length_or_die", "data.train": str(prompts), "ppo.steps": 3,
        "batch.size": 4, "sampling.max_new_tokens": 6, "optim.learning_rate": 1e-3, "ppo.epochs": 2, "ppo.num_minibatches": 2,
        "run.eval_every": 0, "run.save_every": 0, "run.progress": False,
    } | overrides  # fmt: skip


def test_two_nodes_on_localhost_equal_one_process(tiny_llama_dir, prompts, tmp_path):
    """``--nnodes 2`` with a c10d rendezvous: two torchrun launchers of one rank each make one run."""
    config = ppo_config(tiny_llama_dir, prompts)
    one_rows, one_grads = run("ppo", config, tmp_path / "one")
    two_rows, two_grads = run("ppo", config, tmp_path / "two", *two_nodes())
    assert_same_gradients(one_grads, two_grads)
    assert_same_metrics(one_rows, two_rows)
    assert_same_weights(tmp_path / "one" / "run" / "final", tmp_path / "two" / "run" / "final", 3 * 1e-3)


def crash(config: dict, out: Path, die_at: int) -> None:
    """Run 2 ranks that both die abruptly (``os._exit``) right after the checkpoint of step ``die_at``."""
    out.mkdir(parents=True)
    (out / "in.yaml").write_text(yaml.safe_dump(nested(config)))
    args = [str(out / "unused.pt"), "ppo", "--config", str(out / "in.yaml"), "--output_dir", str(out / "run")]
    result = subprocess.run(command_line(args, torchrun()), env={**environment(), "DIE_AT_STEP": str(die_at)},
                            stdin=subprocess.PIPE, capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert result.returncode != 0
    assert not (out / "run" / "final").exists()
    assert (out / "run" / "checkpoints" / f"step_{die_at:06d}").is_dir()


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_killed_run_resumes_at_any_world_size(tiny_llama_dir, prompts, tmp_path, parallelism):
    """Both ranks die after step 2 of 4; ``--resume`` with 2 ranks, and again from the same crashed directory with 1
    process, ends where the uninterrupted 2-rank run ends: the checkpoint holds global state only (weights,
    optimizer, schedule, prompt position, random streams, KL coefficient, the moving reference), so the world size
    may change. FSDP2 writes sharded (DCP) checkpoints, which one process reads back whole."""
    config = ppo_config(tiny_llama_dir, prompts, **{"ppo.steps": 4, "run.save_every": 1, "kl.control": "adaptive",
                                                "kl.reference_ema": 0.5, "run.parallelism": parallelism})  # fmt: skip
    whole_rows, whole_grads = run("ppo", config, tmp_path / "whole", torchrun())
    crash(config, tmp_path / "resumed", die_at=2)
    # the same crash, copied (a run directory resumes wherever it now is), is resumed again by one process
    shutil.copytree(tmp_path / "resumed", tmp_path / "resumed_alone")
    for out, launcher in ((tmp_path / "resumed", [torchrun()]), (tmp_path / "resumed_alone", [])):
        rows, grads = run("ppo", config, out, *launcher, flags=("--run.resume",))
        assert [row["step"] for row in rows] == [0, 1, 2, 3, 4]  # step 0: the held-out answers before training
        assert_same_gradients(whole_grads[2 * 4 :], grads)  # steps 3-4 (4 optimizer steps each: 2 epochs × 2)
        assert_same_metrics(whole_rows, rows)
        assert_same_weights(tmp_path / "whole" / "run" / "final", out / "run" / "final", 2 * 1e-3)


def test_a_failing_rank_stops_every_rank_with_its_error(tiny_llama_dir, prompts, tmp_path):
    """Rank 1's reward raises: the run ends non-zero with that error, long before the collective timeout (set
    to 15 minutes here, so a rank left waiting in a collective would fail this test by its own timeout)."""
    config = ppo_config(tiny_llama_dir, prompts, **{"reward.source": f"{REWARDS}:fails_on_rank_one"})
    (tmp_path / "in.yaml").write_text(yaml.safe_dump(nested(config)))
    command = [sys.executable, "-m", "torch.distributed.run", *torchrun(), "-m", "rlhf", "ppo", "--config",
               str(tmp_path / "in.yaml"), "--output_dir", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, env={**environment(), "RLHF_DIST_TIMEOUT_S": "900"}, stdin=subprocess.PIPE,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert "this sample cannot be scored (rank 1)" in result.stderr
    assert not (tmp_path / "run" / "final").exists()


def test_a_bad_config_fails_on_every_rank_alike(tiny_llama_dir, prompts, tmp_path):
    """An input error is found by every rank before any collective, so none waits for the others: the first
    rank to find it prints it and exits with the input-error code, and torchrun stops the run non-zero.

    Whether the other rank prints it too is a race (torchrun terminates the remaining workers as soon as one
    fails), so the test asks for the message once; a rank waiting in a collective would hit the timeout."""
    config = ppo_config(tiny_llama_dir, prompts, **{"data.train": str(tmp_path / "missing.jsonl")})
    (tmp_path / "in.yaml").write_text(yaml.safe_dump(nested(config)))
    command = [sys.executable, "-m", "torch.distributed.run", *torchrun(), "-m", "rlhf", "ppo", "--config",
               str(tmp_path / "in.yaml"), "--output_dir", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, env=environment(), stdin=subprocess.PIPE, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert "missing.jsonl: no such file or directory" in result.stderr, result.stderr[-3000:]
    assert "exitcode: 2" in result.stderr, result.stderr[-3000:]  # the input-error exit, not a crash or a signal


def test_the_doctor_stops_every_rank_at_the_same_step(tiny_llama_dir, prompts, tmp_path):
    """``doctor.stop_on``: rank 0 reads the metrics and its decision reaches every rank (a broadcast), so all stop
    at the step where the finding starts — here GRPO with a reward that never varies (no_group_signal, step 5) —
    save that step's checkpoint and final/, and exit 0; a rank left in the loop would hang until the timeout."""
    constant = Path(__file__).resolve().parents[1] / "trainers" / "ppo_rewards.py"
    config = {
        "model.name": str(tiny_llama_dir), "reward.source": f"{constant}:constant_one", "data.train": str(prompts),
        "grpo.steps": 8, "batch.size": 2, "grpo.group_size": 2, "sampling.max_new_tokens": 4, "run.eval_every": 0,
        "run.save_every": 0, "run.progress": False, "doctor.stop_on": "warning",
    }  # fmt: skip
    rows, _ = run("grpo", config, tmp_path, torchrun())
    assert [row["step"] for row in rows] == [0, 1, 2, 3, 4, 5]  # step 0: the held-out answers before training
    assert (tmp_path / "run" / "checkpoints" / "step_000005").is_dir() and (tmp_path / "run" / "final").is_dir()
    assert '"rule": "no_group_signal"' in (tmp_path / "run" / "doctor.jsonl").read_text()


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_a_killed_async_run_of_two_ranks_resumes_to_the_uninterrupted_one(
    tiny_llama_dir, prompts, tmp_path, parallelism
):
    """``sampling.max_staleness: 1`` under torchrun: each rank's trainer starts a sampling worker, the workers
    gather the ranks' shards in a process group of their own. The workers die (``os._exit``) scoring the batch of
    step 4 while the trainers learn step 3, so the checkpoint of step 3, which must hold that batch, is never
    written; resumed from step 2's (which holds the batch of step 3, drawn by the weights of step 1), the run ends
    where the uninterrupted one ends."""
    config = ppo_config(tiny_llama_dir, prompts, **{"ppo.steps": 4, "run.save_every": 1, "run.parallelism": parallelism,
                                                "sampling.max_staleness": 1, "sampling.is_correction": "token"})  # fmt: skip
    whole_rows, _ = run("ppo", config, tmp_path / "whole", torchrun())
    out = tmp_path / "resumed"
    out.mkdir()
    (out / "in.yaml").write_text(yaml.safe_dump(nested(config)))
    args = [str(out / "unused.pt"), "ppo", "--config", str(out / "in.yaml"), "--output_dir", str(out / "run")]
    result = subprocess.run(command_line(args, torchrun()), env={**environment(), "DIE_AT_STEP": "3"},
                            stdin=subprocess.PIPE, capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    # each rank's trainer says its worker died, or (its worker's collective ended by the other's death) that another
    # rank's did; torchrun may stop one trainer before it says so
    assert result.returncode != 0 and "sampling worker (sampling.max_staleness)" in result.stderr, result.stderr[-3000:]
    assert "died" in result.stderr
    assert sorted(path.name for path in (out / "run" / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    rows, _ = run("ppo", config, out, torchrun(), flags=("--run.resume",))
    assert [row["async/staleness"] for row in rows[1:]] == [0, 1, 1, 1]
    # as the synchronous resume above: gloo's reductions may add the ranks' parts in another order from run to run
    # (two uninterrupted runs differ in the last bits already at step 1), so the tolerances of assert_same_metrics
    assert_same_metrics(whole_rows, rows)
    assert_same_weights(tmp_path / "whole" / "run" / "final", out / "run" / "final", 2 * 1e-3)
