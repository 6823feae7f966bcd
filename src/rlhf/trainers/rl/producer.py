"""Asynchronous RL (``sampling.max_staleness`` k > 0): a worker process samples and scores the next batches while
the trainer learns from this one, on a fixed schedule (:func:`version`), so a run at k gives the same numbers however
long each phase takes. The schedule, how the weights and batches travel, and the batches in flight that a checkpoint
holds: docs/async.md.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import queue
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlhf.config import ConfigError, PolicyGradientConfig
from rlhf.data.stream import PromptStream
from rlhf.models.loading import load_trainable_state, trainable_state
from rlhf.runlog.distributed import Dist, WorkerError, collective_timeout, worker_device


def version(step: int, k: int) -> int:
    """The policy version (updates done) that draws the batch trained at ``step`` under staleness ``k``."""
    return max(0, step - 1 - k)


@dataclasses.dataclass(frozen=True)
class Drawn:
    """A batch from the worker: the step it is for, the version that drew it, the algorithm's ``Sampled``, the
    seconds the worker spent waiting for that version's weights, and its prompt stream's and sampling generator's
    state after drawing it (where a resumed worker goes on)."""

    step: int
    version: int
    sampled: Any
    idle_s: float
    stream_state: dict
    generator_state: torch.Tensor


class Producer:
    """The trainer's side of the worker: ``publish`` the weights after an update, ``take`` the batch of a step."""

    def __init__(
        self,
        config: PolicyGradientConfig,
        draw: Callable[..., Any],
        policy: torch.nn.Module,
        *,
        done: int,
        pending: list[Drawn],
        stream: PromptStream,
        generator: torch.Generator,
        d: Dist,
    ):
        """Start the worker after step ``done`` (a resumed run's checkpoint) with the batches already drawn
        (``pending``, from the checkpoint): it draws from the batch after them on, its stream and generator where
        the last of them left them (else where ``stream`` and ``generator`` are); under torchrun, each rank's own."""
        self.k, self.last, self.world_size = config.sampling.max_staleness, config.steps, d.world_size
        self.stream, self.generator = stream, generator
        self.pending = {drawn.step: drawn for drawn in pending}
        self.received = max(self.pending, default=done)  # the last step whose batch came (taken or pending)
        first = self.received + 1
        stream_state = pending[-1].stream_state if pending else stream.state_dict()
        generator_state = pending[-1].generator_state if pending else generator.get_state()
        home = next(policy.parameters()).device
        address, port = "", 0
        if d.distributed:  # rank 0's host, where the workers' rendezvous listens
            address, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), d.broadcast(free_port() if d.is_main else None)
        place = Place(sampling_device(config, home), home, d.rank, d.world_size, d.local_rank, address, port)
        context = mp.get_context("spawn")  # fork would copy the trainer's threads and its process group
        # batches come through a pipe: its send pickles in the worker's own thread, so a batch that cannot be sent
        # raises there (a queue's feeder thread would drop it, and the trainer would wait for ever)
        self.weights, (receiver, sender) = context.Queue(), context.Pipe(duplex=False)
        self.process = context.Process(
            target=_work,
            args=(config, draw, place, first, stream_state, generator_state, self.weights, sender, os.getpid()),
            daemon=True,
            name="rlhf-sampler",
        )
        self.process.start()
        sender.close()  # the worker's end: when it exits, this side reads the end of the pipe
        self.inbox = Inbox(receiver)
        self.threads = torch.get_num_threads()  # the trainer's; the worker's cores are left to it
        torch.set_num_threads(max(1, self.threads - config.sampling.worker_threads))
        self.published = version(first, self.k) - 1
        self.publish(done, policy)  # the weights the worker's first batch is drawn by

    def publish(self, done: int, policy: torch.nn.Module) -> None:
        """After update ``done`` (the policy's version): its trained tensors, when a later batch is drawn by them."""
        if done > self.published and done <= version(self.last, self.k):
            state = trainable_state(policy).items()  # FSDP2: DTensors, gathered whole (every rank publishes)
            whole = {name: t.full_tensor() if hasattr(t, "full_tensor") else t for name, t in state}
            shared = {name: t.detach().to("cpu", copy=True).share_memory_() for name, t in whole.items()}
            self.weights.put((done, shared))
            self.published = done

    def take(self, step: int) -> Any:
        """The batch of ``step`` (drawn already, or waited for), with ``async/*`` stats; the trainer's stream and
        generator are left where drawing it left the worker's, as the synchronous loop leaves them."""
        self._receive(step)
        drawn = self.pending.pop(step)
        self.stream.load_state_dict(drawn.stream_state)
        self.generator.set_state(drawn.generator_state)
        stats = {"async/staleness": step - 1 - drawn.version, "time/producer_idle_s": drawn.idle_s}
        return dataclasses.replace(drawn.sampled, stats=drawn.sampled.stats | stats)

    def in_flight(self, step: int) -> dict[str, list[Drawn]]:
        """For a checkpoint after ``step``: the batches of the next k steps, waited for (their weights are gone
        after this step), in order."""
        until = min(step + self.k, self.last)
        self._receive(until)
        return {"in_flight": [self.pending[s] for s in range(step + 1, until + 1)]}

    def _receive(self, step: int) -> None:
        """Receive the worker's batches up to ``step``'s; `WorkerError` when the worker died, the error it raised
        when it failed."""
        while step > self.received:
            data = self.inbox.get()
            if data is None:  # the worker is gone (a batch cut short by its death included)
                self.process.join(timeout=10)
                raise WorkerError(
                    f"the sampling worker (sampling.max_staleness) died with exit code {self.process.exitcode} "
                    f"before the batch of step {step}"
                )
            drawn = pickle.loads(data)
            if isinstance(drawn, Failure):
                raise drawn.raised(self.world_size)
            self.pending[drawn.step], self.received = drawn, drawn.step

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, error: type[BaseException] | None, *exc: object) -> None:
        """The worker ends: after the run, once the trainer holds every batch; on an error, at once."""
        if error is None:
            self.weights.put(None)
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()
        torch.set_num_threads(self.threads)


class Inbox:
    """The trainer's end of the worker's pipe, read by a thread of its own as the batches come: a send returns once
    the pipe's buffer (64 KiB on Linux) holds the rest, so a larger batch (PPO's 64 rows of 128 tokens) would hold
    the worker in its send, neither drawing nor counted idle, until the trainer took it."""

    def __init__(self, connection: Any):
        self._items: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, args=(connection,), daemon=True, name="rlhf-sampler-inbox").start()

    def _read(self, connection: Any) -> None:
        while True:
            try:
                self._items.put(connection.recv_bytes())
            except (EOFError, OSError):  # every sender closed: the worker exited, or died mid-batch
                self._items.put(None)
                return

    def get(self) -> bytes | None:
        """The next message the worker sent, in order (waited for); None once the worker is gone."""
        return self._items.get()


@dataclasses.dataclass(frozen=True)
class Failure:
    """The exception that ended the worker, for the trainer to raise as its own: a reward source's, a server's or a
    data error stays the clean error it is at k = 0. ``error`` is None for one that does not pickle."""

    error: BaseException | None
    text: str
    """Its traceback in the worker."""

    @classmethod
    def of(cls, error: BaseException) -> Failure:
        text = "".join(traceback.format_exception(error))
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:  # an exception class whose arguments are not its constructor's
            return cls(None, text)
        return cls(error, text)

    def raised(self, world_size: int) -> BaseException:
        """The error for the trainer to raise. Under torchrun a collective's error (gloo's and NCCL's are plain
        RuntimeErrors) most often means another rank's worker died, and that rank's trainer may be stopped before
        it says so: the message says where to look."""
        if self.error is None:
            return WorkerError(f"the sampling worker (sampling.max_staleness) failed:\n{self.text}")
        if world_size > 1 and type(self.error) in (RuntimeError, dist.DistError, dist.DistBackendError):
            return WorkerError(
                "the sampling worker (sampling.max_staleness) failed, most likely because another rank's worker "
                f"died or failed (the workers' collectives end with it; that rank's error says why): {self.error}"
            )
        self.error.add_note(f"raised in the sampling worker (sampling.max_staleness):\n{self.text}")
        return self.error


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a worker runs: on ``device`` beside a trainer on ``home``; under torchrun the worker of ``rank`` of
    ``world_size``, the workers meeting at ``address``:``port`` in a process group of their own (the draw's
    collectives gather the ranks' shards of a batch as the trainers' would)."""

    device: torch.device
    home: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    address: str = ""
    port: int = 0

    def join(self) -> Dist:
        """This worker's `Dist` (no DDP or FSDP: it never trains), after joining the workers' group."""
        if self.world_size > 1:
            backend = "cpu:gloo,cuda:nccl" if self.device.type == "cuda" else "gloo"
            # a store of their own, rank 0's worker its server: torchrun's environment would have every worker
            # join the launcher's store as a client (TORCHELASTIC_USE_AGENT_STORE), and none would serve this port
            timeout = collective_timeout()
            store = dist.TCPStore(self.address, self.port, self.world_size, self.rank == 0, timeout=timeout)
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size, timeout=timeout)
        return Dist(self.rank, self.world_size, self.local_rank, self.device)


def free_port() -> int:
    """A TCP port free on this host now."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _orphaned(trainer: int) -> None:
    """End this process once the trainer (pid ``trainer``) is gone: killed with -9, it never says so, and a worker
    blocked in a queue or a collective would live on."""
    while os.getppid() == trainer:
        time.sleep(1.0)
    os._exit(1)


def sampling_device(config: PolicyGradientConfig, home: torch.device) -> torch.device:
    """The worker's device beside a trainer on ``home`` (``sampling.worker_device``,
    `rlhf.runlog.distributed.worker_device`), checked here."""
    device = worker_device(config.sampling.worker_device, home)
    if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
        raise ConfigError(
            f"sampling.worker_device {config.sampling.worker_device!r}: this machine has "
            f"{torch.cuda.device_count()} CUDA GPU(s); choose one of them, cpu, or auto"
        )
    return device


def _work(
    config: PolicyGradientConfig,
    draw: Callable[..., Any],
    place: Place,
    first: int,
    stream_state: dict,
    generator_state: torch.Tensor,
    weights: Any,
    batches: Any,
    trainer: int,
) -> None:
    """The worker: the algorithm's ``draw`` (`rlhf.trainers.rl.loop.Algorithm.draw`) for steps first…, each after
    loading its version's weights into a policy of its own on ``place.device``; a batch's tensors reach the trainer
    on its own device, as they would have in its process, and by value (docs/async.md: a batch once sent is the
    trainer's even if the worker dies)."""
    device, home = place.device, place.home
    threading.Thread(target=_orphaned, args=(trainer,), daemon=True).start()
    from rlhf.trainers.rl.inputs import load_inputs, make_trainer_state
    from rlhf.trainers.rl.models import Models

    torch.set_num_threads(config.sampling.worker_threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        inputs = load_inputs(config, worker=place.join())
        models = Models(config, inputs.d, sampler=True)
        stream = PromptStream(inputs.train_prompts, config.batch.size, seed=config.run.seed)
        stream.load_state_dict(stream_state)
        generator = torch.Generator()
        generator.set_state(generator_state)
        loaded = -1
        for step in range(first, config.steps + 1):
            wanted, t0 = version(step, config.sampling.max_staleness), time.perf_counter()
            fresh = loaded < wanted
            while loaded < wanted:
                item = weights.get()
                if item is None:
                    return
                loaded, state = item
                if loaded != wanted:  # the trainer publishes exactly the versions the schedule draws by, in order
                    raise RuntimeError(f"the weights of update {loaded} came for a batch drawn by update {wanted}")
                load_trainable_state(models.policy, state, "policy weights")
            idle = time.perf_counter() - t0
            if fresh:
                models.sync_engine()  # a vLLM server samples by them from now on (ours sample the policy itself)
            trainer_state = make_trainer_state(config, step - 1, stream)
            sampled = draw(config, inputs, models, stream, generator, trainer_state)
            sampled = moved(sampled, device, home)
            drawn = Drawn(step, loaded, sampled, idle, stream.state_dict(), generator.get_state())
            batches.send_bytes(pickle.dumps(drawn))  # by value: a batch once sent outlives this process
        if dist.is_initialized():
            dist.destroy_process_group()
    except BaseException as error:  # the trainer raises it
        batches.send_bytes(pickle.dumps(Failure.of(error)))
        raise


def moved(value: Any, source: torch.device, target: torch.device) -> Any:
    """``value`` (a batch: dataclasses, lists, tuples, dicts of tensors) with its tensors on ``source`` on ``target``
    instead; the others (a CPU tensor beside a GPU's) where they are. The same object when the devices are one."""
    if source == target:
        return value
    if isinstance(value, torch.Tensor):
        return value.to(target) if value.device == source else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: moved(getattr(value, f.name), source, target) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **fields)
    if isinstance(value, (list, tuple)):
        items = [moved(item, source, target) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a named tuple by field
    if isinstance(value, dict):
        return {key: moved(item, source, target) for key, item in value.items()}
    return value
