"""Config dictionaries for tests: dotted overrides laid over a nested base, as the command line writes them.

``merged({"kl": {"coef": 0.05}}, {"kl.coef": 0.1, "ppo.steps": 3})`` is the mapping a YAML file with those
values would hold; tests pass it to ``rlhf.config.config_from_dict``.
"""

from collections.abc import Mapping
from typing import Any


def nested(values: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1, "c": 2}`` → ``{"a": {"b": 1}, "c": 2}``."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        *heads, name = key.split(".")
        place = out
        for head in heads:
            place = place.setdefault(head, {})
        place[name] = value
    return out


def merged(base: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`base` (nested or dotted) with dotted `overrides` on top, mapping by mapping."""
    out = nested(base)
    for key, value in nested(overrides or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
