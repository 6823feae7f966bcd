"""Write docs/config.md, the reference of every command's config fields, from the dataclasses themselves.

    python tools/config_reference.py          # rewrite docs/config.md
tests/test_docs.py fails when docs/config.md is out of date, so the reference cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from tyro import _docstrings

from rlhf.config import COMMANDS

OUT = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "**required**"
    if isinstance(value, tuple):
        value = list(value)
    return f"`{value!r}`".replace("'", "")


def render() -> str:
    lines = [
        "# Config reference",
        "",
        "Generated from `src/rlhf/config.py` by `python tools/config_reference.py`; do not edit by hand.",
        "Every field can be set in the `--config` YAML file or as `--<field> <value>`; the flag wins.",
    ]
    for command, cls in COMMANDS.items():
        lines += ["", f"## `rlhf {command}`", "", (cls.__doc__ or "").strip().splitlines()[0], ""]
        lines += ["| field | default | meaning |", "|---|---|---|"]
        for field in dataclasses.fields(cls):
            doc = (_docstrings.get_field_docstring(cls, field.name, ()) or "").strip().replace("|", "/")
            lines.append(f"| `{field.name}` | {_default(field)} | {' '.join(doc.split())} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
