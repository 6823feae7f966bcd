"""tools/versions.py: the oldest versions `make test-oldest` installs are pyproject.toml's lower bounds, and the drift
`make test-latest` reports lists exactly the installed packages whose version is not the lock's."""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

_PATH = Path(__file__).resolve().parents[1] / "tools" / "versions.py"
_spec = importlib.util.spec_from_file_location("tools_versions", _PATH)
versions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(versions)


def test_the_oldest_constraints_are_pyprojects_lower_bounds():
    """One ``name==bound`` line per tested package, the bound read back from pyproject.toml's ``>=`` specifier."""
    requirements = {Requirement(r).name: Requirement(r) for r in versions.requirements()}
    lines = versions.oldest().splitlines()
    assert [line.split("==")[0] for line in lines] == list(versions.TESTED_FLOORS)
    for line in lines:
        name, bound = line.split("==")
        assert [spec.version for spec in requirements[name].specifier if spec.operator == ">="] == [bound]


def test_drift_names_what_moved_and_ignores_pins_for_other_pythons(tmp_path):
    """A lock pinning pytest elsewhere, pytest's own version under a marker that holds for no Python, and
    pyyaml at its installed version: pytest is reported as moved, pyyaml not, and an installed package the lock
    lacks is reported as such."""
    pytest_version, yaml_version = metadata.version("pytest"), metadata.version("pyyaml")
    lock = tmp_path / "lock.txt"
    lock.write_text(
        "# a comment\n"
        "pytest==0.0.1 ; python_full_version >= '3.0'\n"
        f"pytest=={pytest_version} ; python_full_version < '3.0'\n"
        f"pyyaml=={yaml_version}\n"
        "    # via something\n"
    )
    report = versions.drift(lock)
    assert f"  pytest 0.0.1 -> {pytest_version}\n" in report
    assert "pyyaml" not in report
    assert f"  torch {metadata.version('torch')} (not in the lock)" in report
