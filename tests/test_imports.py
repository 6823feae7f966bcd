"""Import hygiene: `rlhf.core` is pure tensor math, and `import rlhf` stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "src" / "rlhf" / "core"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: only within rlhf.core is allowed (checked below)
                names.add("." * node.level + (node.module or ""))
            else:
                names.add(node.module or "")
    return names


def test_core_imports_only_torch_stdlib_and_core():
    files = sorted(CORE.glob("*.py"))
    assert len(files) >= 5, f"expected the core modules under {CORE}"
    allowed_roots = {"torch", "rlhf"} | set(sys.stdlib_module_names)
    for path in files:
        for name in _imported_modules(path):
            if name.startswith(".."):
                raise AssertionError(f"{path.name}: relative import {name!r} leaves rlhf.core")
            if name.startswith("."):
                continue
            root = name.split(".")[0]
            assert root in allowed_roots, (
                f"{path.name} imports {name!r}; rlhf.core may import torch + stdlib only"
            )
            if root == "rlhf":
                assert name.startswith("rlhf.core"), f"{path.name} imports {name!r} from outside rlhf.core"


def test_core_import_does_not_load_transformers():
    code = (
        "import sys, rlhf.core, importlib, pkgutil\n"
        "for m in pkgutil.iter_modules(rlhf.core.__path__): importlib.import_module('rlhf.core.' + m.name)\n"
        "bad = [m for m in ('transformers', 'peft', 'datasets', 'vllm', 'rlhf.models', 'rlhf.trainers') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"importing rlhf.core loaded {out}"


def test_import_rlhf_is_light():
    code = "import sys, rlhf; print(','.join(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"`import rlhf` loaded {out}"
