"""Checkpoints: the complete training state at a step, written atomically; resume from the newest.

Layout: ``output_dir/checkpoints/step_NNNNNN/state.pt``. A checkpoint is first written to ``step_NNNNNN.tmp`` and
renamed into place, so a run killed mid-write never leaves a checkpoint that looks complete; the ``.tmp`` leftovers are
ignored and overwritten."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from rlhf.runlog.durable import fsync_dir

_STEP_DIR = re.compile(r"^step_(\d+)$")
STATE_FILE = "state.pt"
SHARDED_FILE = "extra.pt"
"""What a sharded checkpoint (`rlhf.runlog.sharded_checkpoint`, FSDP2 runs) holds besides DCP's shard files."""


def checkpoint_path(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(output_dir: str | Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` (any ``torch.save``-able dict) as the checkpoint of ``step``; returns its directory."""
    final = checkpoint_path(output_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with open(tmp / STATE_FILE, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)  # the rename itself must survive a power cut, not only the file's bytes
    return final


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and ((p / STATE_FILE).is_file() or (p / SHARDED_FILE).is_file())
    ]
    return [p for _, p in sorted(found)]


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint directory of :func:`save_checkpoint`; of a sharded one, its plain state with
    ``"sharded": <the directory>``, for `rlhf.runlog.sharded_checkpoint.load_sharded` to read the models and the
    optimizer. ``weights_only=False``: the state holds Python's RNG state and other plain objects; load only your own.
    """
    path = Path(path)
    if not (path / STATE_FILE).is_file() and (path / SHARDED_FILE).is_file():
        return {**torch.load(path / SHARDED_FILE, map_location="cpu", weights_only=False), "sharded": path}
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
