"""`VLLMEngine` against real vLLM (its CPU build), run in the vLLM virtualenv (`make vllm-venv`, or the Python named
by ``RLHF_VLLM_PYTHON``): vLLM pins its own torch and libraries, so it does not share the test suite's. Without that
virtualenv these tests are skipped with the reason, unless ``RLHF_REQUIRE_VLLM=1``, where its absence fails them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("vllm_worker.py")


def vllm_python() -> str:
    """The vLLM virtualenv's Python: ``RLHF_VLLM_PYTHON``, or `.venv-vllm` once `make vllm-venv` has finished it."""
    python = os.environ.get("RLHF_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    built = "RLHF_VLLM_PYTHON" in os.environ or (ROOT / ".venv-vllm" / ".rlhf-installed").exists()
    if built and Path(python).exists():
        return python
    if os.environ.get("RLHF_REQUIRE_VLLM") == "1":
        pytest.fail(f"RLHF_REQUIRE_VLLM=1 but there is no vLLM virtualenv at {python} (make vllm-venv)")
    pytest.skip(f"no vLLM virtualenv at {python}: `make vllm-venv` builds it (vLLM's CPU build)")


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("vllm")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [vllm_python(), str(WORKER), str(out / "tiny")], capture_output=True, text=True, env=env, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


pytestmark = pytest.mark.slow


def test_greedy_tokens_equal_rlhfs_own_engine(measured):
    assert measured["greedy_vllm"] == measured["greedy_rlhf"]


def test_each_row_draws_from_its_own_seed_and_keeps_its_stop_token(measured):
    assert measured["sampled"] == measured["sampled_again"]
    assert measured["stopped"][0] == measured["sampled"][0][:3] and measured["stopped"][0][-1] == measured["stop"]
    assert all(measured["pad"] not in row for row in measured["sampled"])  # PAD is never drawn


def test_sync_gives_vllm_the_trainers_weights(measured):
    # float32 on both sides, other kernels: the log-probs agree to ~1e-6 (measured 1e-6); 1e-4 leaves room for other
    # CPUs, and is far below what one update moves them (a weight change of 0.05 moved them by ~1.4)
    assert measured["gap_before"] < 1e-4
    assert measured["gap_stale"] > 0.1, "the weights changed: stale vLLM weights must show"
    assert measured["gap_synced"] < 1e-4


def test_sync_gives_vllm_a_lora_policys_merged_weights(measured):
    # the same float32 bound as above; these adapters move the log-probs by ~0.9, so a sync that dropped them fails
    assert measured["gap_lora"] < 1e-4 and measured["version"] == 2


def test_sleep_mode_where_vllm_has_one_and_a_clear_refusal_elsewhere(measured):
    if "sleep_refused" in measured:  # the CPU build
        assert "sampling.vllm.sleep: vLLM's sleep mode needs a CUDA, ROCm or XPU device" in measured["sleep_refused"]
    else:  # the rollout's engine slept through the update, and the sync that woke it loaded the policy's weights
        assert measured["slept"] and measured["gap_after_sleep"] < 1e-4


def test_vllm_refusing_to_start_is_a_config_error_naming_the_model(measured):
    assert measured["start_refused"].startswith("sampling.engine vllm: vLLM could not start on ")
    assert "int8" in measured["start_refused"] and "sampling.vllm.memory_fraction" in measured["start_refused"]
