"""Import hygiene: `rlhf.core` is pure tensor math, `import rlhf` stays light, and the package's imports run one
way (no module imports one that imports it back, no layer imports a layer above it)."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
CORE = SRC / "rlhf" / "core"

LAYERS = {
    "core": 0,
    "config": 1, "optim": 1, "httpclient": 1, "doctor": 1,
    "data": 2, "runlog": 2,
    "models": 3, "labelling": 3,
    "rollout": 4,
    "inputs": 5,
    "planning": 6,
    "cli": 7, "__main__": 8,
    "trainers": 7,
    "answering": 8,
    "sample": 9,
    "evaluate": 10, "report": 10,
    "demo": 11,
}  # fmt: skip
"""Each part of ``rlhf`` (a subpackage or a top-level module) and its layer: a part may import parts of lower
layers only, whether at the top of a file or inside a function. The map in docs/architecture.md."""


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
            assert root in allowed_roots, f"{path.name} imports {name!r}; rlhf.core may import torch + stdlib only"
            if root == "rlhf":
                assert name.startswith("rlhf.core"), f"{path.name} imports {name!r} from outside rlhf.core"


def test_core_import_does_not_load_transformers():
    code = (
        "import sys, rlhf.core, importlib, pkgutil\n"
        "for m in pkgutil.iter_modules(rlhf.core.__path__): importlib.import_module('rlhf.core.' + m.name)\n"
        "bad = [m for m in ('transformers', 'peft', 'datasets', 'vllm', 'rlhf.models', 'rlhf.trainers') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing rlhf.core loaded {out}"


def test_import_rlhf_is_light():
    code = "import sys, rlhf; print(','.join(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"`import rlhf` loaded {out}"


def _package_graph() -> dict[str, set[str]]:
    """Every module of ``rlhf`` → the ``rlhf`` modules it imports anywhere in its file (function bodies too)."""
    modules = {}
    for path in (SRC / "rlhf").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                # `from pkg import module` imports the module; `from module import name` the module itself
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _part(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_no_import_cycles():
    graph = _package_graph()
    assert len(graph) > 40, "expected the rlhf modules"
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        raise AssertionError(f"import cycle: {' -> '.join(error.args[1])}") from None


def test_imports_run_down_the_layers():
    graph = _package_graph()
    parts = {_part(m) for m in graph} - {"rlhf"}
    assert parts <= set(LAYERS), f"parts without a layer: {sorted(parts - set(LAYERS))} (add them to LAYERS)"
    upward = [
        f"{source} imports {target}"
        for source, targets in sorted(graph.items())
        for target in sorted(targets)
        if _part(source) in LAYERS and _part(target) in LAYERS and _part(source) != _part(target)
        and LAYERS[_part(target)] >= LAYERS[_part(source)]
    ]  # fmt: skip
    assert not upward, "imports that do not run down the layers:\n" + "\n".join(upward)
