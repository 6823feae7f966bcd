"""Asynchronous RL (``sampling.max_staleness`` k > 0): a worker process samples the next batches while the trainer
learns. The schedule is fixed (the batch of step s drawn by the weights after update max(0, s − 1 − k)), so a run
at k is deterministic, its staleness is exactly min(k, s − 1), and a killed run resumes to the same numbers."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import test_grpo
import test_multi_turn
import torch
from safetensors.torch import load_file
from test_grpo import make_config
from test_multi_turn import make_config as multi_turn_config
from test_ppo import make_config as make_ppo_config

from rlhf import cli
from rlhf.config import ConfigError, config_to_yaml
from rlhf.rollout.rewards import RewardError
from rlhf.runlog.distributed import worker_device
from rlhf.trainers.rl import grpo, ppo
from rlhf.trainers.rl.producer import Inbox, Producer, moved, sampling_device
from rlhf.trainers.rl.rollout import Sampled
from runs import assert_rows_match, comparable, dies_after_checkpoint, max_abs_diff, train_rows

pytestmark = pytest.mark.longest  # its kill-and-resume runs: minutes (tests/conftest.py)

prompts_file = test_grpo.prompts_file  # the fixture: 40 short prompts
word_prompts = test_multi_turn.word_prompts  # the fixture: 64 rows naming a code word

ASYNC = {"sampling.max_staleness": 1, "sampling.is_correction": "token"}


def local(name: str) -> str:
    return f"{Path(__file__).resolve()}:{name}"


def dies_in_the_worker_at_step_3(completions, trainer_state, **kwargs):
    """Scores by length, and ends the process that scores the batch of step 3 (the sampling worker's)."""
    if trainer_state.global_step == 2:
        os._exit(3)
    return [len(c) / 10 for c in completions]


def raises_in_the_worker_at_step_3(completions, trainer_state, **kwargs):
    """Scores by length, and raises in the process that scores the batch of step 3 (the sampling worker's)."""
    if trainer_state.global_step == 2:
        raise ValueError("this reward cannot score step 3")
    return [len(c) / 10 for c in completions]


def rows(out: Path) -> list[dict]:
    return comparable(train_rows(out))


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_is_exactly_the_schedules_and_the_run_is_deterministic(tiny_llama_dir, prompts_file, tmp_path, k):
    fields = {"grpo.steps": 4, "sampling.max_staleness": k, "sampling.is_correction": "token"}
    grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "a", **fields))
    grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "b", **fields))
    synchronous = grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "sync", **{"grpo.steps": 1}))
    first, second = train_rows(tmp_path / "a"), rows(tmp_path / "b")
    assert [row["async/staleness"] for row in first] == [min(k, step - 1) for step in range(1, 5)]
    # the same schedule, the same samples and float32 operations in the same order: the same bits
    assert_rows_match(rows(tmp_path / "a"), second, rel=0, abs=0)
    # step 1 is drawn by the starting weights from the same stream and generator as the synchronous loop's
    assert first[0]["reward/mean"] == train_rows(synchronous.parent)[0]["reward/mean"]


@pytest.mark.parametrize("trainer", ["grpo", "ppo", "grpo with lora"])
def test_a_killed_async_run_resumes_to_the_uninterrupted_one(
    tiny_llama_dir, prompts_file, tmp_path, monkeypatch, trainer
):
    module, make = (ppo, make_ppo_config) if trainer == "ppo" else (grpo, make_config)
    steps = {"ppo.steps": 5} if trainer == "ppo" else {"grpo.steps": 5}
    # with LoRA the worker gets the adapters only: had it kept its first ones, the resumed worker (which starts from
    # the checkpoint's) would draw other batches than the uninterrupted one
    lora = {"model.lora": {"r": 4}} if "lora" in trainer else {}
    fields = {**steps, **lora, "run.save_every": 2, **ASYNC, "sampling.max_staleness": 2}
    whole = module.run(make(tiny_llama_dir, prompts_file, tmp_path / "whole", **fields))
    with dies_after_checkpoint(monkeypatch, 2):
        module.run(make(tiny_llama_dir, prompts_file, tmp_path / "resumed", **fields))
    resumed = module.run(make(tiny_llama_dir, prompts_file, tmp_path / "resumed", **{"run.resume": True}, **fields))
    # the checkpoint of step 2 held the batches of steps 3 and 4 (drawn by the weights of steps 0 and 1, which the
    # resumed run never had); trained on, they give the uninterrupted run's bits. Step 5's batch is drawn by the
    # weights of step 2, which the trainer publishes to the worker as it publishes every update's
    assert_rows_match(rows(tmp_path / "whole"), rows(tmp_path / "resumed"), rel=0, abs=0)
    assert max_abs_diff(load_file(resumed / "model.safetensors"), load_file(whole / "model.safetensors")) == 0


def test_a_worker_that_dies_is_a_clean_error_after_the_batches_it_sent(
    tiny_llama_dir, prompts_file, tmp_path, monkeypatch, capsys
):
    """The worker sends the batch of step 2, then its process ends drawing step 3's. The trainer reads step 2's
    only once the worker is gone (made so here): a batch travels by value, so it is still whole and step 2 trains
    (a shared-memory handle, served by the worker, died with it: ConnectionResetError, seen under load in CI);
    step 3 is a clean error (exit 2, not an internal error)."""
    take = Producer.take

    def after_the_worker_died(self: Producer, step: int, *args: object) -> object:
        if step == 2:
            self.process.join()
        return take(self, step, *args)

    monkeypatch.setattr(Producer, "take", after_the_worker_died)
    fields = {"grpo.steps": 4, "reward.source": local("dies_in_the_worker_at_step_3"), **ASYNC}
    config = tmp_path / "grpo.yaml"
    config.write_text(config_to_yaml(make_config(tiny_llama_dir, prompts_file, tmp_path / "run", **fields)))
    assert cli.main(["grpo", "--config", str(config)]) == 2
    assert "sampling worker (sampling.max_staleness) died with exit code 3 before the batch of step 3" in (
        capsys.readouterr().err
    )
    assert [row["step"] for row in rows(tmp_path / "run")][-1] == 2


def test_an_error_in_the_worker_is_the_error_a_synchronous_run_raises(tiny_llama_dir, prompts_file, tmp_path):
    """A reward that raises is a `RewardError` (exit 2, no traceback) at k = 0; raised in the worker it is the same
    error in the trainer, the worker's traceback in a note (it was an internal error, exit 1)."""
    fields = {"grpo.steps": 4, "reward.source": local("raises_in_the_worker_at_step_3"), **ASYNC}
    with pytest.raises(RewardError, match="raised ValueError: this reward cannot score step 3") as raised:
        grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "run", **fields))
    (note,) = raised.value.__notes__
    assert note.startswith("raised in the sampling worker") and "raises_in_the_worker_at_step_3" in note


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sampling.max_staleness": 1}, "set sampling.is_correction to token"),
        ({**ASYNC, "sampling.engine": "vllm"}, "set sampling.vllm.url, another engine"),
        ({"sampling.max_staleness": -1}, "max_staleness"),
        ({**ASYNC, "sampling.worker_device": "gpu"}, "worker_device"),
    ],
)
def test_bad_staleness_settings_are_refused(tiny_llama_dir, prompts_file, tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        make_config(tiny_llama_dir, prompts_file, tmp_path / "run", **fields)


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_a_killed_async_run_of_episodes_resumes_to_the_uninterrupted_one(
    tiny_llama_dir, word_prompts, tmp_path, monkeypatch, command
):
    """Multi-turn episodes (an environment, its replies in the transcript) drawn in the worker: each belongs to the
    one policy version that drew its batch; the episodes in flight go into the checkpoint with their batches. The
    last step saves a checkpoint too, with nothing in flight (this waited for ever on the batch already taken)."""
    module = grpo if command == "grpo" else ppo
    fields = {f"{command}.steps": 4, "run.save_every": 2, **ASYNC}
    whole = module.run(multi_turn_config(command, tiny_llama_dir, word_prompts, tmp_path / "whole", **fields))
    with dies_after_checkpoint(monkeypatch, 2):
        module.run(multi_turn_config(command, tiny_llama_dir, word_prompts, tmp_path / "resumed", **fields))
    resumed = module.run(
        multi_turn_config(command, tiny_llama_dir, word_prompts, tmp_path / "resumed", **fields, **{"run.resume": True})
    )
    first = train_rows(tmp_path / "whole")
    assert [row["async/staleness"] for row in first] == [0, 1, 1, 1]
    assert all(1 <= row["episode/turns_mean"] <= 2 for row in first)  # episodes, played in the worker
    assert_rows_match(rows(tmp_path / "whole"), rows(tmp_path / "resumed"), rel=0, abs=0)
    assert max_abs_diff(load_file(resumed / "model.safetensors"), load_file(whole / "model.safetensors")) == 0


def test_the_workers_device(monkeypatch):
    """``sampling.worker_device: auto`` beside a CPU trainer is the CPU; beside a GPU the next GPU when there is
    another, else the trainer's own; a GPU the machine lacks is refused at the start."""
    cpu, first, second = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    assert worker_device("auto", cpu) == cpu
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert worker_device("auto", first) == first
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert (worker_device("auto", first), worker_device("auto", second)) == (second, first)
    assert (worker_device("cpu", first), worker_device("cuda:1", cpu)) == (cpu, second)
    assert worker_device("cuda", second) == first  # GPU 0, named as its tensors name it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = make_config(
        Path("unused"), Path("unused"), Path("unused"), **ASYNC, **{"sampling.worker_device": "cuda:1"}
    )
    with pytest.raises(ConfigError, match="sampling.worker_device 'cuda:1': this machine has 2 CUDA GPU"):
        sampling_device(config, cpu)


def test_the_worker_sends_its_batches_before_the_trainer_takes_them():
    """Batches are larger than a pipe's buffer (64 KiB on Linux): the trainer's end reads them as they come, so the
    worker's sends return and it draws on (left unread, the second send would wait for ever), and the trainer gets
    them in order, then the end of the pipe once the worker is gone."""
    receiver, sender = torch.multiprocessing.get_context("spawn").Pipe(duplex=False)
    inbox = Inbox(receiver)
    batches = [bytes([i]) * (1 << 20) for i in range(3)]
    worker = threading.Thread(target=lambda: [sender.send_bytes(batch) for batch in batches], daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive()  # every send returned, none taken yet
    sender.close()
    assert [inbox.get() for _ in range(4)] == [*batches, None]


def test_moving_a_batch_between_devices_keeps_its_structure():
    """What the worker sends a GPU trainer: its own device's tensors on the trainer's, the rest as they were."""
    sampled = Sampled(generated=None, scores=None, rewards=torch.ones(2), prompts=["a", "b"], stats={"x": 1.0})
    assert moved(sampled, torch.device("cpu"), torch.device("cpu")) is sampled
    meta = moved(sampled, torch.device("cpu"), torch.device("meta"))
    assert meta.rewards.device.type == "meta" and meta.prompts == ["a", "b"] and meta.stats == {"x": 1.0}
    pair = moved((torch.ones(1), [torch.zeros(1, device="meta")]), torch.device("cpu"), torch.device("meta"))
    assert pair[0].device.type == "meta" and isinstance(pair[1], list) and pair[1][0].device.type == "meta"


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: /proc/PID/task/*/children)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        # a thread may end between the listing and the read: its children pass to a thread still listed
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from Linux's /proc")
def test_kill_9_mid_run_leaves_no_worker_and_resumes_to_the_uninterrupted_run(tiny_llama_dir, prompts_file, tmp_path):
    """A real ``kill -9`` of ``rlhf grpo`` as soon as the checkpoint of step 2 is on disk: its sampling worker,
    never told, ends by itself (no orphan holding a policy copy), and ``--run.resume`` gives the run never killed,
    bit for bit. (Where the kill lands varies from run to run; the result may not.)"""
    fields = {"grpo.steps": 6, "run.save_every": 2, **ASYNC, "sampling.max_staleness": 2}
    whole = grpo.run(make_config(tiny_llama_dir, prompts_file, tmp_path / "whole", **fields))
    out = tmp_path / "killed"
    config = tmp_path / "grpo.yaml"
    config.write_text(config_to_yaml(make_config(tiny_llama_dir, prompts_file, out, **fields)))
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    trainer = subprocess.Popen([sys.executable, "-m", "rlhf", "grpo", "--config", str(config)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    workers: list[int] = []
    while not (out / "checkpoints" / "step_000002").is_dir():
        assert trainer.poll() is None, "the run ended before its checkpoint of step 2"
        workers = children(trainer.pid) or workers
        time.sleep(0.01)
    trainer.kill()
    trainer.wait()
    assert workers and not (out / "final").exists()
    deadline = time.monotonic() + 30  # the worker looks for its trainer every second
    while any(Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
              for pid in workers):  # fmt: skip
        assert time.monotonic() < deadline, "the sampling worker outlived its killed trainer"
        time.sleep(0.1)
    resumed = grpo.run(make_config(tiny_llama_dir, prompts_file, out, **fields, **{"run.resume": True}))
    assert_rows_match(rows(tmp_path / "whole"), rows(out), rel=0, abs=0)
    assert max_abs_diff(load_file(resumed / "model.safetensors"), load_file(whole / "model.safetensors")) == 0
