"""`rlhf grpo` and `rlhf ppo` with ``sampling.engine: vllm`` (colocated) against real vLLM (its CPU build), run in the
vLLM virtualenv as a user runs them: reward rises, the sampler/trainer mismatch is measured and corrected, a resumed run
is the uninterrupted one (the engine takes the checkpoint's weights), and two ranks sample what one process samples.
Skipped without that virtualenv, as test_vllm_engine.py says."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from test_vllm_engine import ROOT, vllm_python

pytestmark = pytest.mark.slow

REWARD = ROOT / "tests" / "trainers" / "ppo_rewards.py"
COMMON = {
    "reward.source": f"{REWARD}:digit_count",  # digits / 8 of an 8-token response: ~0.03 at random init, 1 at best
    "sampling.max_new_tokens": 8,
    "sampling.engine": "vllm",
    "sampling.vllm.memory_fraction": 0.1,
    "optim.learning_rate": 2e-3,
    "optim.scheduler": "constant",
    "run.eval_every": 0,
    "run.save_every": 0,
    "run.progress": False,
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vllm_training")
    run([vllm_python(), str(Path(__file__).with_name("train_fixture.py")), str(out)], out)
    return out


def run(command: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]


def train(assets: Path, command: str, out: str, launcher: list[str] | None = None, **fields) -> list[dict]:
    """Run ``rlhf COMMAND`` on the tiny policy and prompts with ``fields`` over `COMMON`; its training rows."""
    values = {"model.name": "policy", "data.train": "prompts.jsonl", "output_dir": out, **COMMON, **fields}
    flags = [f"--{key}" if value is True else f"--{key}={value}" for key, value in values.items() if value is not False]
    flags += [f"--{key.replace('run.', 'run.no_')}" for key, value in values.items() if value is False]
    run([*(launcher or [vllm_python()]), "-m", "rlhf", command, *flags], assets)
    return rows(assets / out)


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"]]


def rise(rows: list[dict]) -> tuple[float, float]:
    rewards = [row["reward/mean"] for row in rows]
    return sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5


def test_grpo_learns_with_vllm_sampling_and_sequence_level_correction(assets):
    """Observed (vLLM 0.32 CPU build, float32): mean reward of the first 5 steps 0.05, of the last 5 0.93 after 30;
    the mismatch is log(1 − p_pad) (the engines never draw PAD, the trainer's softmax keeps it): 4e-3 per token at
    random init, shrinking as the policy learns to put no mass there."""
    out = train(assets, "grpo", "grpo", **{"grpo.steps": 30, "batch.size": 4, "grpo.group_size": 8, "grpo.num_minibatches": 1, "sampling.temperature": 1.0, "sampling.is_correction": "sequence"})  # fmt: skip
    first, last = rise(out)
    assert last > first + 0.3, (first, last)
    # float32 on both sides: the trainer and vLLM agree to rounding plus the PAD term (< 0.01 per token here)
    assert max(row["rollout/logprob_diff_max"] for row in out) < 0.05
    assert all(0.9 < row["rollout/is_weight_mean"] <= 1.0 + 1e-3 for row in out)


def test_ppo_learns_with_vllm_sampling_and_token_level_correction(assets):
    out = train(assets, "ppo", "ppo", **{"ppo.steps": 30, "batch.size": 16, "ppo.epochs": 4, "kl.coef": 0.01, "sampling.is_correction": "token"})  # fmt: skip
    first, last = rise(out)
    assert last > first + 0.3, (first, last)
    assert max(row["rollout/logprob_diff_max"] for row in out) < 0.05
    assert all(row["rollout/is_capped_frac"] == 0 for row in out)  # nothing near the cap of 3
    assert all(row["policy/first_ratio_max_dev"] == 0 for row in out)


def test_a_resumed_run_samples_from_the_checkpoints_weights(assets):
    """2 steps, then a resume to 4, against 4 in one go: the engine must take the resumed policy's weights (vLLM
    loads the initial ones from model.name), else steps 3-4 sample another policy's tokens."""
    fields = {"grpo.steps": 4, "batch.size": 2, "grpo.group_size": 4, "run.save_every": 2}
    whole = train(assets, "grpo", "whole", **fields)
    train(assets, "grpo", "parts", **{**fields, "grpo.steps": 2})
    resumed = train(assets, "grpo", "parts", **{**fields, "run.resume": True})
    assert len(resumed) == len(whole) == 4
    for a, b in zip(whole, resumed, strict=True):
        assert a["reward/mean"] == b["reward/mean"] and a["response/tokens"] == b["response/tokens"]
    # the held-out answers of the last step: sampled by vLLM after the last update
    texts = [(assets / run / "samples" / "step_000004.jsonl").read_text() for run in ("whole", "parts")]
    assert texts[0] == texts[1]


def test_two_ranks_sample_what_one_process_samples(assets):
    """Each rank holds its own colocated engine and samples its share of the rows with the rows' own seeds."""
    fields = {"grpo.steps": 1, "batch.size": 4, "grpo.group_size": 2}
    one = train(assets, "grpo", "one", **fields)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = [str(Path(vllm_python()).with_name("torchrun")), "--nproc_per_node", "2", "--rdzv_backend", "c10d"]
    torchrun += ["--rdzv_endpoint", f"127.0.0.1:{port}"]
    two = train(assets, "grpo", "two", launcher=torchrun, **fields)
    assert one[0]["reward/mean"] == two[0]["reward/mean"] and one[0]["response/tokens"] == two[0]["response/tokens"]
    # the held-out answers before training, each rank answering its share
    texts = [(assets / run / "samples" / "step_000000.jsonl").read_text() for run in ("one", "two")]
    assert texts[0] == texts[1]
