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

pytestmark = [pytest.mark.slow, pytest.mark.longest]

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


GRPO = {"grpo.steps": 30, "batch.size": 4, "grpo.group_size": 8, "grpo.num_minibatches": 1, "sampling.temperature": 1.0, "sampling.is_correction": "sequence"}  # fmt: skip


@pytest.fixture(scope="module")
def grpo_rows(assets) -> list[dict]:
    return train(assets, "grpo", "grpo", **GRPO)


def test_grpo_learns_with_vllm_sampling_and_sequence_level_correction(grpo_rows):
    """Observed (vLLM 0.32 CPU build, float32): mean reward of the first 5 steps 0.05, of the last 5 0.93 after 30;
    the mismatch is log(1 − p_pad) (the engines never draw PAD, the trainer's softmax keeps it): 4e-3 per token at
    random init, shrinking as the policy learns to put no mass there."""
    first, last = rise(grpo_rows)
    assert last > first + 0.3, (first, last)
    # float32 on both sides: the trainer and vLLM agree to rounding plus the PAD term (< 0.01 per token here)
    assert max(row["rollout/logprob_diff_max"] for row in grpo_rows) < 0.05
    assert all(0.9 < row["rollout/is_weight_mean"] <= 1.0 + 1e-3 for row in grpo_rows)


def test_ppo_learns_with_vllm_sampling_and_token_level_correction(assets):
    out = train(assets, "ppo", "ppo", **{"ppo.steps": 30, "batch.size": 16, "ppo.epochs": 4, "kl.coef": 0.01, "sampling.is_correction": "token"})  # fmt: skip
    first, last = rise(out)
    assert last > first + 0.3, (first, last)
    assert max(row["rollout/logprob_diff_max"] for row in out) < 0.05
    assert all(row["rollout/is_capped_frac"] == 0 for row in out)  # nothing near the cap of 3
    assert all(row["policy/first_ratio_max_dev"] == 0 for row in out)


def test_two_ranks_sample_what_one_process_samples(assets, grpo_rows):
    """Each rank holds its own colocated engine and samples its share of the rows with the rows' own seeds: the first
    step of the GRPO run above, and its held-out answers before training, again on two ranks. (A resumed run's
    engine taking the checkpoint's weights: test_vllm_server.py, whose resume goes through the same sync.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = [str(Path(vllm_python()).with_name("torchrun")), "--nproc_per_node", "2", "--rdzv_backend", "c10d"]
    torchrun += ["--rdzv_endpoint", f"127.0.0.1:{port}"]
    (two,) = train(assets, "grpo", "two", launcher=torchrun, **{**GRPO, "grpo.steps": 1})
    one = grpo_rows[0]
    assert one["reward/mean"] == two["reward/mean"] and one["response/tokens"] == two["response/tokens"]
    texts = [(assets / run / "samples" / "step_000000.jsonl").read_text() for run in ("grpo", "two")]
    assert texts[0] == texts[1]


def test_sample_and_eval_answer_on_vllm(assets):
    """Greedy answers (vLLM's greedy tokens are the lean decoder's: test_vllm_engine.py): `rlhf sample` and `rlhf eval`
    give the same ones, and eval with a baseline runs two engines one after the other in its process (the first gives
    its memory back)."""
    flags = ["--sampling.top_k=1", "--sampling.max_new_tokens=8", "--sampling.vllm.memory_fraction=0.1"]
    flags += ["--sampling.engine=vllm", "--model.name=policy"]
    sample = ["sample", "--prompts=prompts.jsonl", "--output=sampled.jsonl", "--num_samples=2"]
    run([vllm_python(), "-m", "rlhf", *sample, *flags], assets)
    evaluate = ["eval", "--eval_data=prompts.jsonl", "--baseline=policy", f"--reward.source={REWARD}:length_chars"]
    evaluate += ["--output=eval.json", "--samples_output=answers.jsonl"]
    run([vllm_python(), "-m", "rlhf", *evaluate, *flags], assets)
    sampled = [json.loads(line) for line in (assets / "sampled.jsonl").read_text().splitlines()]
    answers = [json.loads(line) for line in (assets / "answers.jsonl").read_text().splitlines()]
    assert len(sampled) == len(answers) == 40
    for row, answer in zip(sampled, answers, strict=True):
        assert (
            row["completions"] == [answer["completion"]] * 2 and answer["baseline_completion"] == answer["completion"]
        )
    assert json.loads((assets / "eval.json").read_text())["ties"] == 40  # the baseline is the policy
