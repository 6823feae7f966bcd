"""The update engine: micro-batch plans, micro-batched forward/backward, gradient synchronisation over ranks,
the optimizer step. Every trainer takes its optimizer steps through here (PPO and GRPO in
`rlhf.trainers.rl.updates.update_passes`), so the distributed part of an update is written once. How N ranks take the
step one process takes (global minibatches, global denominators, filler passes): docs/scaling.md, "The result
does not depend on the number of processes"; per-update statistics are summed (``*_max`` keys: maximised) over
micro-batches and ranks.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import torch
from torch import nn

from rlhf.runlog.distributed import Dist

M = TypeVar("M")

Step = Callable[[Any], tuple[torch.Tensor, dict[str, float]]]
"""One micro-batch's forward: (its loss, already divided by the global denominators; its share of the stats)."""


class Trainable:
    """The trained module as the ranks train it: itself (one process), inside ``DistributedDataParallel``, or
    FSDP2-sharded in place where the model loads (every backward reduce-scatters, so accumulation needs no switch).
    ``module`` is the plain module (no-grad passes, generation, saving); ``forward`` runs a training forward
    through the wrapper that synchronises gradients."""

    def __init__(self, module: nn.Module, d: Dist):
        self.module, self.d = module, d
        self.wrapped: nn.Module = module  # sharded (fsdp): the FSDP2 hooks sit in its modules already
        if d.distributed and d.parallelism == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [d.device.index] if d.device.type == "cuda" else None
            # no buffer sync in forward: our buffers are constants (rotary tables); syncing them would make every
            # forward a collective (torch ≥ 2.13 names the switch forward_sync_buffers, older ones broadcast_buffers)
            params = inspect.signature(DistributedDataParallel).parameters
            no_sync = {"forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": False}
            self.wrapped = DistributedDataParallel(module, device_ids=device_ids, **no_sync)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped(*args, **kwargs)

    def parameters(self) -> list[nn.Parameter]:
        """The trained parameters; sharded, the DTensor shards (what the optimizer must hold)."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        if self.d.sharded:
            from torch.distributed.tensor import DTensor  # only sharded runs: torch.distributed may be absent

            # FSDP2 swaps a gathered module's parameters for the full tensors until it reshards (the root does
            # not reshard after a forward outside autograd): an optimizer built on those would never update
            # the real weights
            if not all(isinstance(p, DTensor) for p in params):
                raise RuntimeError(
                    "an FSDP module is still gathered: reshard it (models.sharding.gathered) before taking its "
                    "parameters"
                )
        return params

    @property
    def grad_scale(self) -> float:
        """DDP and FSDP2 average gradients over ranks; our losses already are the global means."""
        return float(self.d.world_size) if self.d.distributed else 1.0

    @contextlib.contextmanager
    def sync(self, last: bool) -> Iterator[None]:
        """Gradients are reduced over ranks in the last backward of an optimizer step only (accumulation)."""
        if last or self.wrapped is self.module:
            yield
        else:
            with self.wrapped.no_sync():  # type: ignore[operator]
                yield


def evenly(micro_batches: Sequence[M], filler: Callable[[], M], d: Dist) -> Iterator[tuple[M, bool, bool]]:
    """(micro-batch, real, last) for this rank's ``micro_batches``, followed by ``filler()`` until every rank has
    run as many (``real`` False: its loss and stats must be weighted 0). One collective when distributed."""
    n = len(micro_batches)
    if d.distributed:
        n = int(d.max(torch.tensor([n])).item())
    for i in range(n):
        real = i < len(micro_batches)
        yield (micro_batches[i] if real else filler()), real, i == n - 1


def accumulate(
    trainable: Trainable, micro_batches: Sequence[M], filler: Callable[[], M], step: Step
) -> dict[str, float]:
    """Forward + backward of every micro-batch of one optimizer step on this rank; returns the summed stats
    (``*_max`` keys: the maximum) of its real micro-batches. Gradients are synchronised in the last backward."""
    totals: dict[str, float] = {}
    for micro, real, last in evenly(micro_batches, filler, trainable.d):
        with trainable.sync(last):
            loss, stats = step(micro)
            (loss * (trainable.grad_scale if real else 0.0)).backward()
        if real:
            merge(totals, stats)
    return totals


def merge(totals: dict[str, float], stats: dict[str, float]) -> None:
    """Add ``stats`` into ``totals`` (``*_max`` keys keep the maximum)."""
    for key, value in stats.items():
        if key.endswith("_max"):
            totals[key] = max(totals.get(key, -math.inf), value)
        else:
            totals[key] = totals.get(key, 0.0) + value


def reduce_stats(totals: dict[str, float], d: Dist) -> dict[str, float]:
    """Sum ``totals`` over ranks (``*_max`` keys: maximum). Every rank passes the same keys."""
    sums = d.sum_values({k: v for k, v in totals.items() if not k.endswith("_max")})
    maxima = {k: v for k, v in totals.items() if k.endswith("_max")}
    if d.distributed and maxima:
        keys = sorted(maxima)
        values = d.max(torch.tensor([maxima[k] for k in keys], dtype=torch.float64)).tolist()
        maxima = dict(zip(keys, values, strict=True))
    return {**sums, **maxima}


class Stepped(NamedTuple):
    """What one optimizer step reports: ``norm``, the global gradient norm before clipping (``grad/norm``), and
    ``changed``, the share of the sampled trained weights with a gradient that the step changed at all
    (``update/changed_frac``; :func:`changed_share`)."""

    norm: float
    changed: float


def optimizer_step(trainable: Trainable, optimizer: Any, scheduler: Any, max_grad_norm: float | None) -> Stepped:
    """Clip the global gradient norm, step the optimizer and the schedule (:class:`Stepped`)."""
    params = trainable.parameters()
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm is not None else math.inf)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor over the shards
        norm = norm.full_tensor()
    with changed_share(params, trainable.d) as changed:
        optimizer.step()
    scheduler.step()
    if trainable.d.device.type == "cpu":
        release_freed_heap()
    return Stepped(float(norm), changed[0])


SAMPLED_WEIGHTS = 256
"""Elements of each trained tensor :func:`changed_share` compares, evenly strided over it."""


def _strided(t: torch.Tensor) -> torch.Tensor:
    """Up to `SAMPLED_WEIGHTS` elements of ``t`` (a sharded tensor: of this rank's shard), evenly strided; a copy."""
    flat = (t.to_local() if hasattr(t, "to_local") else t).detach().reshape(-1)
    return flat[:: max(1, flat.numel() // SAMPLED_WEIGHTS)][:SAMPLED_WEIGHTS].clone()


@contextlib.contextmanager
def changed_share(params: Sequence[nn.Parameter], d: Dist) -> Iterator[list[float]]:
    """Around an optimizer step: the share of the sampled elements of ``params`` with a non-zero gradient whose
    value the step changed at all (the list yielded holds it afterwards; NaN when no gradient was non-zero).

    Why: in pure bfloat16 a weight near 0.02 has a spacing of 1.2e-4, and an AdamW step of about the learning
    rate (1e-6) rounds back to the same weight — the update vanishes without a sign in the loss. Weights with a
    zero gradient (embedding rows of tokens not in the batch, held parameters) are left out: AdamW does not
    move them either, in any precision. A sample of each tensor is enough for a share, and costs two small
    copies per tensor per step; under FSDP the counts of every rank's shards are summed."""
    sampled = [(p, _strided(p.grad) != 0, _strided(p)) for p in params if p.grad is not None]
    out = [math.nan]
    yield out
    if not sampled:
        return
    moving = torch.stack([m.sum() for _, m, _ in sampled]).sum()
    changed = torch.stack([((_strided(p) != before) & m).sum() for p, m, before in sampled]).sum()
    counts = torch.stack([changed, moving]).double().cpu()
    if d.sharded:
        counts = d.sum(counts)
    out[0] = (counts[0] / counts[1]).item() if counts[1] > 0 else math.nan


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; musl and macOS have none
    except (AttributeError, OSError):
        return None


def release_freed_heap() -> None:
    """Give the heap pages freed since the last update back to the system (glibc's ``malloc_trim``); why after
    every update on CPU, and what it costs: docs/memory.md, "Phases"."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def own_row(num_rows: int, unit: int, d: Dist) -> torch.Tensor:
    """(1,) the first row this rank owns: what its filler passes run on."""
    return torch.tensor(d.shard(num_rows, unit)[:1])


def own_micro_batches(
    minibatch: torch.Tensor, unit: int, plan: Callable[[torch.Tensor], list[Any]], d: Dist
) -> list[Any]:
    """The micro-batches of this rank's rows of ``minibatch`` (none when it owns none of them)."""
    mine = minibatch[d.owns(minibatch, unit)]
    return plan(mine) if len(mine) else []


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """The rows of one forward/backward pass, (b,) indices, and the only columns of ``query ⊕ response`` they need:
    from ``first_column``, the first of the C query columns where a row has a real token, and ``response_length``
    T' ≤ T response columns, the longest response + 1 (for the value read one past the stop token)."""

    rows: torch.Tensor
    first_column: int
    response_length: int

    def columns(self, C: int) -> slice:
        """The kept columns of a (B, C+T) ``query ⊕ response`` tensor."""
        return slice(self.first_column, C + self.response_length)


def plan_micro_batches(
    rows: torch.Tensor, attention_mask: torch.Tensor, T: int, max_rows: int, max_tokens: int | None
) -> list[MicroBatch]:
    """Split the ``rows`` of one minibatch into micro-batches with their padding cut (``attention_mask``: (B, C+T),
    query left-padded, response right-padded): at most ``max_rows`` rows and, with ``max_tokens``, that many tokens
    once padded to its own longest row; with a token budget the rows go longest first (similar lengths pad little;
    a row over the budget goes alone). The plan depends only on the lengths, so the rollout's no-grad pass and the
    first epoch, planned alike, run exactly the same forwards."""
    C = attention_mask.shape[1] - T
    query = attention_mask[rows, :C].sum(-1).tolist()
    needed = (attention_mask[rows, C:].sum(-1) + 1).clamp(max=T).tolist()  # response columns a row needs
    order = list(range(len(query)))
    if max_tokens is not None:
        order.sort(key=lambda i: -(query[i] + needed[i]))
    plans: list[list[int]] = []
    widest_query = widest_response = 0
    for i in order:
        grown = max(widest_query, query[i]) + max(widest_response, needed[i])
        group = plans[-1] if plans else []
        full = len(group) >= max_rows or (max_tokens is not None and (len(group) + 1) * grown > max_tokens)
        if not group or full:
            group, widest_query, widest_response = [], 0, 0
            plans.append(group)
        group.append(i)
        widest_query, widest_response = max(widest_query, query[i]), max(widest_response, needed[i])
    return [
        MicroBatch(
            rows=rows[torch.tensor(group)],
            first_column=C - max(query[i] for i in group),
            response_length=max(needed[i] for i in group),
        )
        for group in plans
    ]
