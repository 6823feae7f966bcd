"""The ground every config stands on: `ConfigError`, the field types pydantic checks, the ``section``
decorator, the helper of structured command-line flags, and the wording of refusals."""

import dataclasses
import difflib
import functools
import typing
from collections.abc import Mapping
from typing import Annotated, Any

import pydantic
import yaml
from pydantic import AfterValidator, Field
from tyro.constructors import PrimitiveConstructorSpec


class ConfigError(Exception):
    """A config that cannot run: unknown key, wrong type, value out of range or impossible combination. Not a
    ValueError on purpose: pydantic would fold a ValueError raised by a cross-field rule into its own
    ValidationError; this one reaches the caller as it was raised."""


# Field types. pydantic checks them on every construction (YAML, flags, Python, dataclasses.replace).


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("is empty")
    return value


Text = Annotated[str, AfterValidator(_not_blank)]
Count = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]

section = functools.partial(
    pydantic.dataclasses.dataclass,
    frozen=True,
    kw_only=True,
    config=pydantic.ConfigDict(extra="forbid", allow_inf_nan=False),
)
"""Decorator of every section and command config: frozen, keyword-only, unknown keys refused."""


def _defaults(cls: type, **values: Any) -> Any:
    """A section field whose default is `cls` with this command's own defaults (a section whose defaults differ
    between commands gets them here; YAML then overrides single keys of those defaults, not the whole section)."""
    return dataclasses.field(default_factory=functools.partial(cls, **values))


def config_to_dict(cfg: Any) -> Any:
    """The config as plain YAML/JSON data: sections as mappings, tuples as lists, enums as strings."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple | list):
        return [config_to_dict(item) for item in cfg]
    return str(cfg) if isinstance(cfg, str) else cfg  # a StrEnum member as its plain string


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on top, mapping by mapping."""
    out = dict(base)
    for key, value in over.items():
        is_map = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merge(out[key], value) if is_map else value
    return out


def _yaml_flag(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not valid YAML ({' '.join(str(e).split())})") from None


def _flag(metavar: str, parse: Any, kind: Any, optional: bool = False) -> PrimitiveConstructorSpec:
    """A structured field given as one argument on the command line: `parse` turns it into plain data (a text,
    or YAML flow syntax) that pydantic checks with the rest of the config. `kind` is the type of the field's
    values (tyro checks the defaults with it); when `optional`, None/null is None."""

    def to_str(value: Any) -> list[str]:
        if isinstance(value, str) or value is None:
            return [str(value)]
        return [yaml.safe_dump(config_to_dict(value), default_flow_style=True, width=10_000).strip()]

    def from_str(args: list[str]) -> Any:
        return None if optional and args[0].strip() in ("None", "null", "none", "~", "") else parse(args[0])

    return PrimitiveConstructorSpec(
        nargs=1,
        metavar=metavar,
        instance_from_str=from_str,
        is_instance=lambda v: isinstance(v, kind) or (optional and v is None),
        str_from_instance=to_str,
    )


# Validation errors, in our words: the field's path, the value, what is allowed.


def _section_type(tp: Any) -> Any:
    """The dataclass inside a field's annotation (RewardSpec inside a reward list), or None."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    return next(filter(None, map(_section_type, typing.get_args(tp))), None)


def _message(cls: type, error: Any) -> str:
    kind, loc = error["type"], error["loc"]
    unknown = kind in ("unexpected_keyword_argument", "extra_forbidden")
    path, holder, names = "", cls, {}
    for i, part in enumerate(loc):  # the dotted path; `names` ends as the fields of the class holding its last key
        names = {f.name: f.type for f in dataclasses.fields(holder)} if holder else {}
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in names or (unknown and i == len(loc) - 1):
            path, holder = path + ("." if path else "") + part, _section_type(names.get(part))
        # any other part names a union's branch (a reward source's text or list): not part of the path
    if unknown:
        key = path.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(key.replace("-", "_"), list(names), n=1, cutoff=0.6)
        hint = f"did you mean '{path[: -len(key)]}{close[0]}'?" if close else f"valid keys: {', '.join(names)}"
        return f"unknown key '{path}'; {hint}"
    if kind in ("missing", "missing_keyword_argument"):
        return f"{path} is required; set it in the --config YAML file or pass --{path}"
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")  # a section's own rule (its __post_init__) gets the whole section: not worth quoting
    where = f"{path}: " if isinstance(value, dict) else f"{path}={value!r}: "
    return f"{where}{message[:1].lower()}{message[1:]}"


def _validate(cls: Any, data: Any, where: str, check: bool = True) -> Any:
    """`data` validated as `cls`; ConfigError with one line per problem (or the rule's own ConfigError).
    `check=False` leaves out the command's cross-field rules (`CommandConfig._check`)."""
    try:
        return pydantic.TypeAdapter(cls).validate_python(data, context={"check": check})
    except pydantic.ValidationError as e:
        problems = dict.fromkeys(_message(cls, err) for err in e.errors())
        raise ConfigError(where + "; ".join(problems)) from None
