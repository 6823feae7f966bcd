"""This process's memory from /proc, for the benchmark's child processes (standard library only: the peer
venvs import it too, from this directory).

Peak RSS is ``VmHWM``, the process's own high-water mark, not ``ru_maxrss``: Linux carries a parent's peak
into the child it spawns (the parent's memory at the fork counts at exec), so a child of a large parent would
report the parent's peak (a benchmark that had just built the 110M models gave every child 1223 MB).
"""

from __future__ import annotations

import resource
from pathlib import Path


def status_mb(field: str) -> float:
    """``VmHWM`` (peak RSS since start or the last reset) or ``VmRSS`` (now) from /proc/self/status, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB: VmHWM; without /proc, ``ru_maxrss``."""
    try:
        return status_mb("VmHWM")
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
