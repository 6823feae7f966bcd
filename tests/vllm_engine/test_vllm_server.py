"""`VLLMServer` against a real vLLM server (its CPU build), started from the vLLM virtualenv as the class docstring
says; the client runs here, in the test suite's own environment (it needs HTTP and torch only). Skipped or failed
without that virtualenv as test_vllm_engine.py is. One server for the module, started again by the `server` fixture
after each test that stops it (the restart test, the training runs that outlive it, the server gone)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_vllm_engine import ROOT, vllm_python
from vllm_worker import trainer_gap

from rlhf.data import left_pad
from rlhf.httpclient import ServiceError
from rlhf.models.tiny import save_tiny, tiny_causal_lm, toy_corpus, train_tokenizer
from rlhf.rollout.engine import SamplingParams, sample
from rlhf.rollout.vllm_server import VLLMServer
from runs import assert_rows_match, comparable, train_rows

pytestmark = [pytest.mark.slow, pytest.mark.longest]

STARTUP = 600.0
"""Seconds a server may take to answer /health (about 30 on two cores)."""


class Server:
    """A vLLM server process over ``model_dir`` on a free local port; ``start`` and ``stop`` it at will."""

    def __init__(self, python: str, model_dir: Path, log: Path):
        self.python, self.model_dir, self.log = python, model_dir, log
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [
            *(self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir)),
            *("--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32"),
            *("--gpu-memory-utilization", "0.2", "--max-model-len", "128", "--enforce-eager"),
            *("--enable-scale-out", "--logprobs-mode", "processed_logprobs"),
            # prefix caching caches whole blocks, 128 tokens by default on CPU: with 32, the long prompt of
            # prompts() is cached, so a sync that kept the old weights' cache shows (measured: a gap of 1.4)
            *("--block-size", "32"),
        ]
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        with self.log.open("ab") as log:  # its own session: stop() ends the engine processes it spawns too
            self.process = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
        deadline = time.monotonic() + STARTUP
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.fail(f"exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5):
                    return
            except OSError:
                time.sleep(0.5)
        self.fail(f"no answer on /health within {STARTUP:g} s")

    def up(self) -> None:
        """Start it unless it runs."""
        if self.process is None or self.process.poll() is not None:
            self.start()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (``SIGKILL``: at once, as a crash or an out-of-memory kill would)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def fail(self, what: str) -> None:
        self.stop()
        tail = self.log.read_text(errors="replace")[-4000:]
        pytest.fail(f"the vLLM server {what}; its log ends:\n{tail}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, object]:
    """The tiny Llama's directory and tokenizer (head_dim 64: vLLM's CPU attention refuses 16)."""
    out = tmp_path_factory.mktemp("vllm_server") / "tiny"
    tokenizer = train_tokenizer(toy_corpus(500), vocab_size=256)
    save_tiny(policy(tokenizer), tokenizer, out)
    return out, tokenizer


@pytest.fixture(scope="module")
def started(request, tmp_path_factory):
    python = vllm_python()  # skipped (or failed) before anything is built
    log = tmp_path_factory.mktemp("vllm_server_log") / "server.log"
    server = Server(python, request.getfixturevalue("tiny")[0], log)
    yield server
    server.stop()


@pytest.fixture
def server(started):
    """The module's server, running: started again when a test before stopped it."""
    started.up()
    return started


def policy(tokenizer) -> torch.nn.Module:
    """The policy the server starts from, built anew (the tests change its weights)."""
    return tiny_causal_lm("llama", tokenizer, hidden_size=128, num_heads=2, seed=0).eval()


def prompts(tokenizer) -> list[list[int]]:
    """Four short prompts and a long one (70 tokens: two cached blocks)."""
    short = [tokenizer(text).input_ids for text in ("the cat sees", "a small dog", "what is 3 + 4 ?", "the old")]
    return [*short, tokenizer(" ".join(toy_corpus(12))).input_ids[:70]]


def perturb(model: torch.nn.Module) -> None:
    """An "update": every weight moves."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


PARAMS = SamplingParams(max_new_tokens=16, temperature=1.0)
SEEDS = [11, 12, 13, 14, 15]


def test_samples_per_row_seeds_and_the_log_probs_they_were_drawn_from(server, tiny):
    _, tokenizer = tiny
    model, rows = policy(tokenizer), prompts(tokenizer)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    engine = VLLMServer(server.url + "/v1")  # the OpenAI base URL is accepted too
    assert engine.version == 0  # before any sync: the server's startup checkpoint, which is the policy

    greedy = SamplingParams(max_new_tokens=10, top_k=1)
    theirs, _ = engine.sample(rows, greedy, [], pad, seeds=[0] * len(rows))
    ids, mask = left_pad(rows, pad)
    assert theirs == sample(model, ids, mask, greedy, [], pad)[0].tolist()

    sampled, logprobs = engine.sample(rows, PARAMS, [eos], pad, SEEDS)
    assert engine.sample(rows, PARAMS, [eos], pad, SEEDS)[0] == sampled
    assert engine.sample(rows[2:3], PARAMS, [eos], pad, SEEDS[2:3])[0] == sampled[2:3]  # a row's draws: its seed's
    assert engine.sample(rows, PARAMS, [eos], pad, [21, 22, 23, 24, 25])[0] != sampled
    assert all(pad not in row for row in sampled)
    stop = sampled[0][2]  # with a token row 0 draws as the stop token, row 0 ends at its first one
    stopped, _ = engine.sample(rows, PARAMS, [stop], pad, SEEDS)
    assert stopped[0] == sampled[0][: sampled[0].index(stop) + 1]
    # float32 on both sides, other kernels: 1e-6 apart measured, as the colocated engine (test_vllm_engine.py). The
    # trainer's distribution leaves the pad token out: were it in vLLM's, they would differ by >= 0.0025 here
    assert [len(row) for row in logprobs] == [len(row) for row in sampled]
    assert trainer_gap(model, rows, sampled, logprobs, pad) < 1e-4


def test_sync_pushes_the_policys_weights(server, tiny):
    _, tokenizer = tiny
    model, rows = policy(tokenizer), prompts(tokenizer)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    engine = VLLMServer(server.url)
    engine.sync(model)
    assert engine.version == 1
    assert trainer_gap(model, rows, *engine.sample(rows, PARAMS, [eos], pad, SEEDS), pad) < 1e-4

    perturb(model)
    assert trainer_gap(model, rows, *engine.sample(rows, PARAMS, [eos], pad, SEEDS), pad) > 0.1, "must be stale"
    engine.sync(model)
    assert engine.version == 2
    assert trainer_gap(model, rows, *engine.sample(rows, PARAMS, [eos], pad, SEEDS), pad) < 1e-4

    import peft  # a LoRA policy: the server gets its base weights with the adapters added

    lora = peft.get_peft_model(
        model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    engine.sync(lora.eval())
    assert trainer_gap(lora, rows, *engine.sample(rows, PARAMS, [eos], pad, SEEDS), pad) < 1e-4


def test_weights_the_server_lost_or_another_client_replaced_are_stale(server, tiny):
    _, tokenizer = tiny
    model, rows = policy(tokenizer), prompts(tokenizer)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    perturb(model)
    engine = VLLMServer(server.url)
    engine.sync(model)

    other = VLLMServer(server.url)
    other.sync(policy(tokenizer))
    with pytest.raises(ServiceError, match=r"stale weights.*another client pushed weights"):
        engine.sample(rows, PARAMS, [eos], pad, SEEDS)
    engine.sync(model)

    server.stop()  # restarted behind the client's back: back at the checkpoint it starts from
    server.start()
    with pytest.raises(ServiceError, match=rf"{server.url}: stale weights.*\['default'\].*restarted"):
        engine.sample(rows, PARAMS, [eos], pad, SEEDS)
    engine.sync(model)  # pushing again recovers
    assert trainer_gap(model, rows, *engine.sample(rows, PARAMS, [eos], pad, SEEDS), pad) < 1e-4
    fresh = VLLMServer(server.url)
    with pytest.raises(ServiceError, match="stale weights"):  # not the startup checkpoint any more
        fresh.sample(rows, PARAMS, [eos], pad, SEEDS)


def test_grpo_on_the_server_stops_cleanly_when_it_dies_and_resumes_once_it_is_back(server, tiny, tmp_path):
    """`rlhf grpo` sampling from the server (the trainer in this environment, vLLM in the server's): killed under the
    run, the server ends it with exit 2 naming the URL (not an internal error); restarted, ``--run.resume`` on two
    ranks pushes the checkpoint's weights to it (rank 0 alone) and the run finishes, every step sampled by the
    trainer's weights (a resumed run that did not push would sample the server's startup checkpoint: stale)."""
    out = tmp_path / "run"
    command = [*grpo_command(tiny, server, tmp_path, out), "--grpo.steps", "10", "--run.save_every", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    while not (out / "checkpoints" / "step_000002").exists() and run.poll() is None:
        time.sleep(0.1)
    server.stop(signal.SIGKILL)
    _, stderr = run.communicate(timeout=600)
    assert run.returncode == 2, stderr[-3000:]
    assert server.url in stderr and "try 1:" in stderr and "internal error" not in stderr, stderr[-3000:]
    server.start()
    # resumed on two ranks: rank 0 alone pushes the weights, both sample their rows from the server
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2", "--rdzv_backend", "c10d"]
    torchrun += ["--rdzv_endpoint", f"127.0.0.1:{port}", "-m", "rlhf", *command[3:], "--run.resume"]
    resumed = subprocess.run(torchrun, capture_output=True, text=True, env=env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in metrics if "reward/mean" in row]
    assert [row["step"] for row in train] == list(range(1, 11))
    # the weights the server sampled with were the trainer's, before and after the restart (float32: rounding
    # plus the pad term, < 0.01 per token)
    assert max(row["rollout/logprob_diff_max"] for row in train) < 0.05


def grpo_command(tiny, server, tmp_path: Path, out: Path) -> list[str]:
    """`rlhf grpo` of the tiny policy on short prompts, sampling from ``server``, writing to ``out``."""
    prompts_file = tmp_path / "prompts.jsonl"
    rows = [{"prompt": " ".join(line.split()[: 3 + i % 2])} for i, line in enumerate(toy_corpus(40, seed=5))]
    prompts_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    command = [sys.executable, "-m", "rlhf", "grpo", "--model.name", str(tiny[0]), "--data.train", str(prompts_file)]
    command += ["--output_dir", str(out), "--reward.source", f"{ROOT}/tests/trainers/ppo_rewards.py:digit_count"]
    command += ["--batch.size", "4", "--grpo.group_size", "8", "--sampling.max_new_tokens", "8"]
    command += ["--sampling.temperature", "1.0", "--optim.learning_rate", "2e-3", "--optim.scheduler", "constant"]
    command += ["--sampling.engine", "vllm", "--sampling.vllm.url", server.url, "--sampling.vllm.timeout", "5"]
    return [*command, "--run.eval_every", "0", "--run.no_progress"]


def test_grpo_samples_on_the_server_while_it_trains_and_resumes_what_was_in_flight(server, tiny, tmp_path):
    """``sampling.max_staleness: 1`` with a server: the worker process pushes each version's weights to it and draws
    the next batch there while the trainer updates (the trainer never pushes: a push of its own would relabel the
    server's weights, and the worker's next batch would stop the run as stale). Killed (``kill -9``) after the
    checkpoint of step 2, which holds the batch of step 3 drawn by the weights of step 1, the run resumes to the
    uninterrupted run's numbers. The server killed under a run, the worker's error stops it as at k = 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def command(out: Path, steps: int) -> list[str]:
        fields = ["--grpo.steps", str(steps), "--run.save_every", "2", "--sampling.max_staleness", "1"]
        return [*grpo_command(tiny, server, tmp_path, out), *fields, "--sampling.is_correction", "token"]

    def killed_after_step_2(out: Path, steps: int, kill: Callable[[subprocess.Popen], None]) -> subprocess.Popen:
        run = subprocess.Popen(command(out, steps), stderr=subprocess.PIPE, text=True, env=env)
        while not (out / "checkpoints" / "step_000002").exists() and run.poll() is None:
            time.sleep(0.05)
        kill(run)
        return run

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    done = subprocess.run(command(whole, 4), capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    killed_after_step_2(cut, 4, lambda run: run.kill()).communicate(timeout=60)
    resumed = subprocess.run([*command(cut, 4), "--run.resume"], capture_output=True, text=True, env=env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = train_rows(whole), train_rows(cut)
    assert [row["async/staleness"] for row in got] == [0, 1, 1, 1]
    # step 1 was drawn by the starting weights, which the trainer computes too (float32: rounding plus the pad term)
    assert got[0]["rollout/logprob_diff_max"] < 0.05
    # the same weights and row seeds on the server give the same samples, the same updates follow: the same bits
    assert_rows_match(comparable(expected), comparable(got), rel=0, abs=0)
    # the server gone under the worker (drawing step 4 or a later one of 20): the run stops with the clean error
    # (exit 2, the URL) a synchronous run gives
    run = killed_after_step_2(tmp_path / "gone", 20, lambda run: server.stop(signal.SIGKILL))
    _, stderr = run.communicate(timeout=600)
    assert run.returncode == 2, stderr[-3000:]
    assert server.url in stderr and "try 1:" in stderr and "internal error" not in stderr, stderr[-3000:]


def test_a_server_gone_fails_fast_naming_the_url_and_each_try(server, tiny):
    _, tokenizer = tiny
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    engine = VLLMServer(server.url, timeout=5, tries=2)
    server.stop()
    with pytest.raises(ServiceError) as raised:
        engine.sample(prompts(tokenizer), PARAMS, [eos], pad, SEEDS)
    message = str(raised.value)
    assert server.url in message and "try 1: cannot connect" in message and "try 2: cannot connect" in message
    with pytest.raises(ServiceError, match=rf"{server.url}, labelling the new weights: failed after 2 tries"):
        engine.sync(policy(tokenizer))
    with pytest.raises(ServiceError, match=rf"{server.url}, reading its configuration: failed after 2 tries"):
        VLLMServer(server.url, timeout=5, tries=2)
