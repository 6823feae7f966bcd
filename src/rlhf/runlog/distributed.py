"""One process, or many under ``torchrun``: the process group, this rank's device, and the reductions trainers use.

Every trainer runs inside :func:`process_group` (through :func:`entry`) and talks to the other ranks only through the
:class:`Dist` it yields, whose reductions are identities for one process: a single-process run takes exactly the code
path of rank 0 of one. Results do not depend on the number of ranks because every batch stays global (each rank trains
on a strided share, :meth:`Dist.shard`) and every normaliser is reduced over all ranks before use; docs/scaling.md
explains this, and how a failing rank stops the others (``RLHF_DIST_TIMEOUT_S``)."""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from rlhf.config import ConfigError, TrainingConfig

F = TypeVar("F", bound=Callable[..., Any])

EXIT_GRACE_S = 30
"""Seconds a failed rank has to report its error and exit before it is ended (see :func:`process_group`)."""

DEFAULT_TIMEOUT_S = 1800
"""Longest wait of a collective before it fails (a peer that died without closing its connection)."""


@dataclass(frozen=True)
class Dist:
    """This process's place in the run: ``rank`` of ``world_size``, its ``device``, and the reductions;
    ``parallelism``: ``"none"`` (one process), ``"ddp"`` (replicated models) or ``"fsdp"`` (FSDP2-sharded)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    parallelism: str = "none"

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files, logs metrics and draws progress bars."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def check_batch(self, command: str, size: int) -> None:
        """Refuse a global batch (``batch.size``, all ranks together) that leaves some rank without a row."""
        if size < self.world_size:
            raise ConfigError(
                f"{command}: batch.size={size} is global (all ranks together) and gives no rows to some of the "
                f"{self.world_size} ranks; use a batch.size of at least {self.world_size} or fewer processes"
            )

    @property
    def sharded(self) -> bool:
        """Models are FSDP2-sharded over the ranks (``parallelism: fsdp`` under torchrun)."""
        return self.distributed and self.parallelism == "fsdp"

    @functools.cached_property
    def mesh(self) -> Any:
        """The one-dimensional device mesh of all ranks (FSDP2 shards over it)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, (self.world_size,))

    def shard(self, n: int, unit: int = 1) -> list[int]:
        """This rank's rows of a global batch of ``n`` rows, in runs of ``unit`` rows that stay together (the ``G``
        samples of one GRPO prompt): units ``rank, rank + world_size, …``, strided so that any contiguous part of
        the batch (a minibatch) is spread evenly over the ranks."""
        return [
            row
            for first in range(self.rank * unit, n, self.world_size * unit)
            for row in range(first, min(first + unit, n))
        ]

    def owns(self, rows: torch.Tensor, unit: int = 1) -> torch.Tensor:
        """(k,) bool: which of the global ``rows`` (k,) are this rank's (:meth:`shard`)."""
        return (rows // unit) % self.world_size == self.rank

    def gather_rows(self, local: Sequence[Any], n: int, unit: int = 1) -> list[Any]:
        """The global batch of ``n`` rows from every rank's rows of it (:meth:`shard`), back in row order."""
        if not self.distributed:
            return list(local)
        out: list[Any] = [None] * n
        for rank, part in enumerate(self.gather([list(local)])):
            rows = Dist(rank, self.world_size).shard(n, unit)
            if len(rows) != len(part):
                raise RuntimeError(f"rank {rank} sent {len(part)} rows, its shard of {n} has {len(rows)}")
            for row, item in zip(rows, part, strict=True):
                out[row] = item
        return out

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``tensor`` over ranks (a new tensor; float64 sums stay float64)."""
        return self._all_reduce(tensor, dist.ReduceOp.SUM)

    def max(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise maximum of ``tensor`` over ranks."""
        return self._all_reduce(tensor, dist.ReduceOp.MAX)

    def _all_reduce(self, tensor: torch.Tensor, op: Any) -> torch.Tensor:
        if not self.distributed:
            return tensor.clone()
        out = tensor.detach().clone()
        dist.all_reduce(out, op=op)
        return out

    def sum_values(self, values: dict[str, float]) -> dict[str, float]:
        """Each value summed over ranks, in one collective. Every rank must pass the same keys."""
        if not self.distributed or not values:
            return dict(values)
        keys = sorted(values)
        totals = self.sum(torch.tensor([float(values[k]) for k in keys], dtype=torch.float64))
        return dict(zip(keys, totals.tolist(), strict=True))

    def gather(self, items: Sequence[Any]) -> list[Any]:
        """Every rank's ``items`` concatenated in rank order (picklable objects: texts, rows, floats)."""
        if not self.distributed:
            return list(items)
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, list(items))
        return [item for part in parts for item in part]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]


SINGLE = Dist()
"""One process, no group."""

_current: Dist = SINGLE


def current() -> Dist:
    """The `Dist` of the run in progress (:data:`SINGLE` outside one)."""
    return _current


def device_for_run() -> torch.device:
    """The device of a one-process command (``rlhf sample``, ``rlhf eval``): a GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def collective_timeout() -> datetime.timedelta:
    """How long a collective waits for its peers: ``RLHF_DIST_TIMEOUT_S``, else :data:`DEFAULT_TIMEOUT_S`."""
    return datetime.timedelta(seconds=float(os.environ.get("RLHF_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))


class WorkerError(RuntimeError):
    """A sampling worker (`rlhf.trainers.rl.producer`) died (killed, out of memory, a reward that ended its process)
    or failed with an error that is not one it raises as itself; the CLI's exit 2, not an internal error."""


def worker_device(setting: str, trainer: torch.device) -> torch.device:
    """The device of the sampling worker of a trainer on ``trainer`` (``sampling.worker_device``): ``auto`` is the
    CPU beside a CPU trainer; beside a GPU trainer a GPU no trainer uses when the machine has one for each of its
    ranks (one process: the next GPU; under torchrun with L ranks here, the one L after the rank's), else the
    trainer's own (the two processes share it)."""
    if setting != "auto":
        device = torch.device(setting)
        return torch.device("cuda", 0) if device == torch.device("cuda") else device  # as its tensors name it
    if trainer.type != "cuda":
        return torch.device("cpu")
    index, count = trainer.index or 0, torch.cuda.device_count()
    here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # the trainers on this machine, one GPU each
    return torch.device("cuda", (index + here) % count if count >= 2 * here else index)


def _device(local_rank: int) -> torch.device:
    """GPU ``LOCAL_RANK`` when there are GPUs (each rank of a node its own), else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"local rank {local_rank} needs GPU {local_rank}, but this machine has {torch.cuda.device_count()}; "
            "start at most one process per GPU (--nproc_per_node), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to "
            "run on the CPU"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def strategy(parallelism: str, world_size: int) -> str:
    """``run.parallelism`` on ``world_size`` ranks: ``none`` for one, ``auto`` is ddp for several (the memory plan
    reads it here too)."""
    return "none" if world_size == 1 else "ddp" if parallelism == "auto" else parallelism


@contextlib.contextmanager
def process_group(parallelism: str = "auto") -> Iterator[Dist]:
    """Join the ``torchrun`` process group for the duration of a run (or run as one process); always leave it.
    ``parallelism``: ``auto`` — DDP under ``torchrun``, one process otherwise; ``ddp`` / ``fsdp`` — that strategy under
    ``torchrun`` (one process without it is the same computation, so it runs); ``none`` — refuse ``torchrun``. A group
    someone else already set up (a notebook, a test) is used and left alone."""
    global _current
    group = ("WORLD_SIZE" in os.environ and "RANK" in os.environ) or dist.is_initialized()  # torchrun sets both
    owned = group and not dist.is_initialized()
    if not group:
        _current = Dist(device=_device(0))
    elif parallelism == "none":
        raise ConfigError("parallelism: none, but the run was launched by torchrun; set parallelism: ddp or fsdp")
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = _device(local_rank)
        if owned:
            timeout = collective_timeout()
            # on GPUs, NCCL for CUDA tensors and gloo for the CPU ones (the stats' sums, the objects' pickles):
            # NCCL alone cannot reduce a CPU tensor
            backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=timeout)
        world = dist.get_world_size()
        _current = Dist(dist.get_rank(), world, local_rank, device, strategy(parallelism, world))
    try:
        yield _current
    except BaseException:
        # Leave at once: a collective now would wait for peers that may be waiting for us. torchrun stops them
        # when this process exits — so make sure it does: if reporting the error gets stuck (a print was seen to
        # block for ever in a rank whose peer sat in a collective), a C-level watchdog ends the process.
        if group:
            faulthandler.dump_traceback_later(EXIT_GRACE_S, exit=True)
        raise
    else:
        if group:
            dist.barrier()  # nobody tears the group down while a peer is still in its last collective
    finally:
        _current = SINGLE
        if owned and dist.is_initialized():
            dist.destroy_process_group()


def entry(run: F) -> F:
    """Decorate a trainer's ``run(config)``: it runs inside :func:`process_group` (``config.run.parallelism``),
    ranks other than 0 with stdout and stderr silenced (they would repeat rank 0's) until an error leaves ``run``:
    it is then reported on the restored stderr like rank 0's."""

    @functools.wraps(run)
    def wrapper(config: TrainingConfig, *args: Any, **kwargs: Any) -> Any:
        with process_group(config.run.parallelism) as d:
            if d.is_main:
                return run(config, *args, **kwargs)
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                return run(config, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
