"""The versions the two commands install, the oldest ones pyproject.toml promises, and what differs from the lock.

    python tools/versions.py oldest                  # pip constraints: each of TESTED_FLOORS at its lower bound
    python tools/versions.py drift requirements/lock.txt   # the installed packages whose version is not the lock's

`make test-oldest` installs with the first (docs/dependencies.md); `make test-latest` prints the second before it
runs the suite on the newest releases, so a failure there comes with the versions that moved.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TESTED_FLOORS = ("torch", "transformers", "peft", "trl")
"""The packages whose lower bounds `make test-oldest` installs; the rest resolve to what those versions accept."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> list[str]:
    """Every requirement of the package, its dev extra included."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["dev"]]


def lower_bound(name: str) -> str:
    """The ``>=`` bound of ``name`` in pyproject.toml; an error when it has none."""
    for requirement in requirements():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", requirement.split(";")[0].strip())
        if match and canonical(match[1]) == canonical(name):
            bound = re.search(r">=\s*([^,\s]+)", match[2])
            if bound:
                return bound[1]
    raise SystemExit(f"pyproject.toml gives {name} no lower bound (>=)")


def oldest() -> str:
    return "".join(f"{name}=={lower_bound(name)}\n" for name in TESTED_FLOORS)


def pinned(lock: Path) -> dict[str, str]:
    """The ``name==version`` lines of a constraints file whose environment marker holds for this interpreter."""
    from packaging.markers import Marker

    pins = {}
    for line in lock.read_text().splitlines():
        match = re.match(r"([A-Za-z0-9_.-]+)==([^\s;]+)\s*(?:;(.*))?$", line)
        if match and (match[3] is None or Marker(match[3]).evaluate()):
            pins[canonical(match[1])] = match[2]
    return pins


def drift(lock: Path) -> str:
    """One line per installed distribution whose version differs from ``lock``'s pin, or that the lock lacks."""
    pins = pinned(lock)
    lines = []
    for dist in sorted(metadata.distributions(), key=lambda d: canonical(d.metadata["Name"])):
        name, version = canonical(dist.metadata["Name"]), dist.version
        if name in ("pip", "setuptools", "rlhf-kit"):
            continue
        if name not in pins:
            lines.append(f"  {name} {version} (not in the lock)")
        elif pins[name] != version.split("+")[0]:
            lines.append(f"  {name} {pins[name]} -> {version}")
    moved = "\n".join(lines) if lines else "  none: every installed version is the lock's"
    return f"installed versions that differ from {lock.name}:\n{moved}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("oldest", help="pip constraints pinning the tested packages at pyproject.toml's lower bounds")
    drifted = sub.add_parser("drift", help="the installed versions that differ from a lock file")
    drifted.add_argument("lock", type=Path)
    args = parser.parse_args(argv)
    sys.stdout.write(oldest() if args.what == "oldest" else drift(args.lock))
    return 0


if __name__ == "__main__":
    sys.exit(main())
