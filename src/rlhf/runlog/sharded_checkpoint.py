"""Checkpoints of sharded (FSDP2) training: every rank writes its own shards, any world size reads them back.

Why ``torch.distributed.checkpoint`` (DCP) rather than :mod:`rlhf.runlog.checkpoint`'s single ``state.pt``: gathering a
model and its optimizer state onto one rank would need a full copy there; DCP's shards load at any world size,
resharding as they are read. ``directory`` holds DCP's files and ``extra.pt`` (rank 0's plain state), written into
``directory.tmp`` and renamed into place only once every rank has finished (docs/scaling.md, "Checkpoints and resume").
The models are saved under their names as one ``nn.ModuleDict``, so one optimizer may span several of them (a policy and
its critic) and its state is keyed by the parameters' names, not their order."""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlhf.runlog.checkpoint import SHARDED_FILE as EXTRA_FILE
from rlhf.runlog.checkpoint import fsync_dir


def save_sharded(
    directory: str | Path, models: dict[str, nn.Module], optimizer: torch.optim.Optimizer, extra: dict[str, Any]
) -> Path:
    """Save ``models``, ``optimizer`` and ``extra`` into ``directory`` (replaced if it exists); returns it. Every rank
    must call it with the same arguments. Works without a process group too (one process)."""
    final = Path(directory)
    tmp = final.with_name(final.name + ".tmp")
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of an interrupted save
        tmp.mkdir(parents=True)
    _barrier()
    model_state, optimizer_state = get_state_dict(nn.ModuleDict(models), optimizer)
    # DCP's file writer fsyncs each file it writes (sync_files=True)
    state = {"models": model_state, "optimizer": optimizer_state}
    with _one_process_is_fine():
        dcp.save(state, checkpoint_id=tmp, no_dist=not dist.is_initialized())
    if _rank() == 0:
        with open(tmp / EXTRA_FILE, "wb") as f:
            torch.save(extra, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
    _barrier()  # every rank's shards are on disk before the directory is named as complete
    if _rank() == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(final.parent)  # the rename itself must survive a power cut
    _barrier()  # no rank reads or re-saves before the rename
    return final


def load_sharded(
    directory: str | Path, models: dict[str, nn.Module], optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Load a :func:`save_sharded` checkpoint into ``models`` and ``optimizer`` in place; returns ``extra``. The models
    may be sharded over any number of ranks, or not at all, whatever the saving run used; ``models`` must have the names
    and architectures it saved."""
    directory = Path(directory)
    container = nn.ModuleDict(models)
    # the current state, for its structure (and shards) to load into; it also creates the optimizer's
    # state if no step has been taken yet
    model_state, optimizer_state = get_state_dict(container, optimizer)
    state = {"models": model_state, "optimizer": optimizer_state}
    with _one_process_is_fine():
        dcp.load(state, checkpoint_id=directory, no_dist=not dist.is_initialized())
    set_state_dict(container, optimizer, model_state_dict=state["models"], optim_state_dict=state["optimizer"])
    # weights_only=False: extra holds Python's RNG state and other plain objects (as checkpoint.py's state)
    return torch.load(directory / EXTRA_FILE, map_location="cpu", weights_only=False)


@contextmanager
def _one_process_is_fine() -> Iterator[None]:
    """DCP warns whenever it runs without a process group; here that is a supported use (one process
    saving, or loading a sharded run's checkpoint), not a forgotten ``init_process_group``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
