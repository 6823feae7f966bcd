"""Durable writes without torch: a directory's entries made durable, and an append-only JSONL log.

`AppendLog` is what every "acknowledged means on disk" promise rests on (the labels of ``rlhf label``, the LLM judge's
cache): each record is one line written with a single ``write`` on an ``O_APPEND`` descriptor and fsynced before
`append` returns. A crash can only leave a *torn last line* (a record whose write never completed, so it was never
acknowledged); `AppendLog.open` moves such a tail aside to ``<file>.torn-<n>`` before appending, so every later line
starts at a line boundary."""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AlreadyOpen(Exception):
    """Another process holds the file open for appending."""


class AppendLog:
    """An append-only JSONL file: `append` returns once the line is on disk (fsynced)."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd = fd

    @classmethod
    def open(cls, path: str | Path) -> AppendLog:
        """Open for appending, creating it (its directory entry made durable), as the one writer: a second
        process opening the same file gets `AlreadyOpen` (the lock ends with the process, even on kill -9).
        A torn last line is set aside first."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        if created:
            fsync_dir(path.parent)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyOpen(f"{path} is open for writing in another process") from None
        _set_aside_torn_tail(path, fd)
        return cls(path, fd)

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        written = os.write(self._fd, line)
        if written != len(line):  # a regular file takes the whole write or raises (disk full: OSError)
            raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes)")
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _set_aside_torn_tail(path: Path, fd: int) -> None:
    """A last line without its newline was cut by a crash mid-write: never acknowledged, so it is moved to
    ``<path>.torn-<n>`` (kept for inspection, never deleted) and the file is cut back to its last newline."""
    size = os.fstat(fd).st_size
    tail_start = os.pread(fd, size, 0).rfind(b"\n") + 1  # the callers read the whole file next anyway
    if tail_start == size:
        return
    torn = os.pread(fd, size - tail_start, tail_start)
    n = 1
    while Path(f"{path}.torn-{n}").exists():
        n += 1
    aside = Path(f"{path}.torn-{n}")
    aside.write_bytes(torn)
    with open(aside, "rb") as f:
        os.fsync(f.fileno())
    os.ftruncate(fd, tail_start)
    os.fsync(fd)
    print(
        f"warning: {path}: its last line was cut off by a crash while it was written ({len(torn)} bytes, never "
        f"acknowledged); moved to {aside}",
        file=sys.stderr,
    )
