"""Write docs/config.md, the reference of every command's config fields, from the config classes themselves.

    python tools/config_reference.py          # rewrite docs/config.md

Each field is listed by its dotted path (its YAML nesting and its ``--section.field`` flag) with the command's
default, its documentation, and the functions in ``src/rlhf`` that read it — found by searching the source for
the path, so a newcomer can go from a YAML key to the code that uses it. tests/test_docs.py fails when
docs/config.md is out of date, so the reference cannot drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from functools import cache
from pathlib import Path

from tyro import _docstrings

from rlhf.config import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "config.md"
SRC = ROOT / "src" / "rlhf"
ALGORITHMS = ("ppo", "grpo")  # read through `config.algorithm` by the code both share


def _default(field: dataclasses.Field, value: object = dataclasses.MISSING) -> str:
    if value is dataclasses.MISSING:
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            return "**required**"
    if isinstance(value, tuple):
        value = [str(v) if isinstance(v, str) else v for v in value]
    elif isinstance(value, str):
        value = str(value)  # an enum member as its text
    return f"`{value!r}`".replace("'", "")


def _doc(cls: type, name: str) -> str:
    return " ".join((_docstrings.get_field_docstring(cls, name, ()) or "").split()).replace("|", "/")


def field_rows(cls: type, defaults: object = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted path, default, doc) of every leaf field; `defaults` is the command's instance of a section."""
    rows = []
    for field in dataclasses.fields(cls):
        path = prefix + field.name
        if dataclasses.is_dataclass(field.type):
            section = field.default_factory() if field.default_factory is not dataclasses.MISSING else None
            rows += field_rows(field.type, section, path + ".")
        else:
            value = getattr(defaults, field.name) if defaults is not None else dataclasses.MISSING
            rows.append((path, _default(field, value), _doc(cls, field.name)))
    return rows


@cache
def _functions() -> list[tuple[str, int, int, str]]:
    """(file, first line, last line, name) of every function in src/rlhf, innermost last."""
    found = []
    for file in sorted(SRC.rglob("*.py")):
        if file.parent.name == "config":
            continue
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((str(file.relative_to(SRC)), node.lineno, node.end_lineno or node.lineno, node.name))
    return found


@cache
def _lines() -> dict[str, list[str]]:
    return {
        str(f.relative_to(SRC)): f.read_text().splitlines()
        for f in sorted(SRC.rglob("*.py"))
        if f.parent.name != "config"
    }


# Properties of the command configs, and the fields each one reads (the code names the property).
PROPERTIES = {
    "batch.size": ("minibatch_size", "num_sequences"), "batch.micro_size": ("effective_micro_batch_size",),
    "num_minibatches": ("minibatch_size",), "clip_range_high": ("clip_range_upper",), "steps": ("steps",),
    "grpo.scale_rewards": ("reward_scaling",), "grpo.group_size": ("num_sequences",),
}  # fmt: skip


def _used_in(command: str, path: str) -> str:
    """``module:function`` of every function whose code names `path` (or ``algorithm.<field>``, a property)."""
    section, _, name = path.rpartition(".")
    spellings = [path] if section else [f"config.{path}"]
    if section in ALGORITHMS:
        spellings.append(f"algorithm.{name}")
    spellings += [f"config.{p}" for key in (path, name) if section in ALGORITHMS or key == path
                  for p in PROPERTIES.get(key, ())]  # fmt: skip
    pattern = re.compile(r"(?<![\w])(" + "|".join(map(re.escape, spellings)) + r")\b")
    places = []
    for file, lines in _lines().items():
        for number, line in enumerate(lines, 1):
            if not pattern.search(line) or line.lstrip().startswith("#"):
                continue
            inner = [f for f in _functions() if f[0] == file and f[1] <= number <= f[2]]
            where = f"{file.removesuffix('.py').replace('/', '.')}:{inner[-1][3]}" if inner else None
            if where is not None and where not in places:  # module level: a table of names, not a use
                places.append(where)
    return ", ".join(f"`{p}`" for p in places[:6]) + (" …" if len(places) > 6 else "") or "—"


def render() -> str:
    lines = [
        "# Config reference",
        "",
        "Generated from `src/rlhf/config/` by `python tools/config_reference.py`; do not edit by hand.",
        "Every field can be set in the `--config` YAML file, nested under its section (`kl: {coef: 0.1}`), or",
        "as `--section.field value` (`--kl.coef 0.1`); the flag wins. *Read in* names the functions that use it.",
    ]
    for command, cls in COMMANDS.items():
        lines += ["", f"## `rlhf {command}`", "", (cls.__doc__ or "").strip().splitlines()[0], ""]
        lines += ["| field | default | meaning | read in |", "|---|---|---|---|"]
        for path, default, doc in field_rows(cls):
            lines.append(f"| `{path}` | {default} | {doc} | {_used_in(command, path)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
