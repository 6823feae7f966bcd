"""The ground every config stands on: `ConfigError`, the field types pydantic checks, the ``section``
decorator and its base class, and the small helpers of structured command-line flags."""

import contextlib
import contextvars
import dataclasses
import difflib
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal, NoReturn

import pydantic
import pydantic_core
import yaml
from pydantic import AfterValidator, Field
from tyro.constructors import PrimitiveConstructorSpec


class ConfigError(Exception):
    """A config that cannot run: unknown key, wrong type, value out of range or impossible combination.

    Not a ValueError on purpose: pydantic would fold a ValueError raised by a cross-field rule into its own
    ValidationError; this one reaches the caller as it was raised.
    """


# Choices that only the config knows about (the algorithmic ones are enums in rlhf.core.choices).
LRScheduler = Literal["constant", "linear", "cosine"]
DType = Literal["float32", "bfloat16", "float16"]
Parallelism = Literal["auto", "none", "ddp", "fsdp"]
Sink = Literal["jsonl", "tensorboard", "wandb", "trackio"]
RewardAggregation = Literal["sum", "gdpo"]
Critic = Literal["auto", "shared", "separate"]
Preset = Literal["tiny", "small"]

# How each estimator scales its advantages when `scale_rewards` is "auto".
_ESTIMATOR_SCALING = {"grpo": "group", "dr_grpo": "none", "rloo": "none", "reinforce_pp": "batch"}

# While a config is assembled from YAML and then flags, the intermediate one may break a cross-field rule
# (YAML num_minibatches=3, fixed by --ppo.num_minibatches 2); only the final config is checked.
_DEFER_CHECKS: contextvars.ContextVar[bool] = contextvars.ContextVar("rlhf_config_defer", default=False)


@contextlib.contextmanager
def _checks_deferred() -> Iterator[None]:
    token = _DEFER_CHECKS.set(True)
    try:
        yield
    finally:
        _DEFER_CHECKS.reset(token)


# ---------------------------------------------------------------------------------------------------------------
# Field types. pydantic checks them on every construction (YAML, flags, Python, dataclasses.replace).
# ---------------------------------------------------------------------------------------------------------------


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


@section
class _Section:
    """Base of every section and command config.

    While tyro builds a config from the command line (checks deferred), a field that fails its check keeps
    its raw value instead of stopping tyro, whose own message would lose the field's path: the final config
    is validated again from plain data, and that refusal names the path (`_build`)."""

    @pydantic.model_validator(mode="wrap")
    @classmethod
    def _keep_raw_while_deferred(cls, values: Any, handler: Any) -> Any:
        try:
            return handler(values)
        except pydantic.ValidationError as error:
            if not _DEFER_CHECKS.get() or not isinstance(values, pydantic_core.ArgsKwargs):
                raise
            given = values.kwargs or {}
            bad = {e["loc"][0] for e in error.errors() if e["loc"]} & set(given)
            kept = {k: v for k, v in given.items() if k not in bad}
            # a required text field (every required field below a section is one) gets `_placeholder`'s stand-in
            kept |= {f.name: "…" for f in dataclasses.fields(cls) if f.name in bad and _is_required(f)}
            out = handler(pydantic_core.ArgsKwargs((), kept))  # the instance being built (`self_instance`)
            for name in bad:
                object.__setattr__(out, name, given[name])
            return out


def _is_required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _defaults(cls: type, **values: Any) -> Any:
    """A section field whose default is `cls` with this command's own defaults."""
    return dataclasses.field(default_factory=functools.partial(cls, **values))


def _yaml_flag(text: str, flag: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{flag}: not valid YAML ({' '.join(str(e).split())})") from None


def _flow_yaml(value: Any) -> str:
    return yaml.safe_dump(_to_plain(value), default_flow_style=True, width=10_000).strip()


def _flag(metavar: str, parse: Any, is_instance: Any) -> PrimitiveConstructorSpec:
    """A structured field given as one argument on the command line: a plain value or YAML flow syntax."""

    def to_str(value: Any) -> list[str]:
        return [value if isinstance(value, str) else "None" if value is None else _flow_yaml(value)]

    return PrimitiveConstructorSpec(
        nargs=1,
        metavar=metavar,
        instance_from_str=lambda args: parse(args[0]),
        is_instance=is_instance,
        str_from_instance=to_str,
    )


def _is_null(text: str) -> bool:
    return text.strip() in ("None", "null", "none", "~", "")


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on top, mapping by mapping."""
    out = dict(base)
    for key, value in over.items():
        is_map = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merge(out[key], value) if is_map else value
    return out


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_to_plain(item) for item in value]
    if isinstance(value, str):
        return str(value)  # a StrEnum member as its plain string
    return value


# ---------------------------------------------------------------------------------------------------------------
# Validation errors, in our words: the field's path, the value, what is allowed.
# ---------------------------------------------------------------------------------------------------------------


def _walk(cls: Any, loc: Sequence[Any]) -> tuple[str, Any]:
    """The dotted path of pydantic's `loc` (union branch tags dropped) and the class that holds its last key."""
    path, holder = "", cls
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            continue
        names = {f.name: f.type for f in dataclasses.fields(holder)} if dataclasses.is_dataclass(holder) else {}
        if part not in names:
            if part.startswith(("function-", "tuple[")) or part in ("str", "none", "nullable"):
                continue  # a union member or validator pydantic names in the location
            return path + ("." if path else "") + str(part), holder
        path += ("." if path else "") + part
        holder = _section_type(names[part])
    return path, holder


def _section_type(tp: Any) -> Any:
    """The dataclass inside a field's annotation (RewardSpec inside a reward list), else the annotation."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in getattr(tp, "__args__", ()) or ():
        found = _section_type(arg)
        if dataclasses.is_dataclass(found):
            return found
    if hasattr(tp, "__origin__"):  # Annotated
        return _section_type(tp.__origin__)
    return tp


def _message(cls: type, error: Any) -> str:
    path, holder = _walk(cls, error["loc"])
    kind, value = error["type"], error.get("input")
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        names = [f.name for f in dataclasses.fields(holder)] if dataclasses.is_dataclass(holder) else []
        key = path.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(key.replace("-", "_"), names, n=1, cutoff=0.6)
        parent = path[: -len(key)]
        hint = f"; did you mean '{parent}{close[0]}'?" if close else f"; valid keys: {', '.join(names)}"
        return f"unknown key '{path}'{hint}"
    if kind == "missing" or kind == "missing_keyword_argument":
        return f"{path} is required; set it in the --config YAML file or pass --{path}"
    message = error["msg"].removeprefix("Value error, ")
    message = message[0].lower() + message[1:] if message else message
    return f"{path}={value!r}: {message}"


def _validate(cls: Any, data: Any, where: str) -> Any:
    """`data` validated as `cls`; ConfigError with one line per problem (or the rule's own ConfigError)."""
    try:
        return pydantic.TypeAdapter(cls).validate_python(data)
    except pydantic.ValidationError as e:
        _raise(cls, e, where)


def _other_branch(error: Any) -> bool:
    """Whether `error` is a reward source's string branch failing on a list, or its list branch on a string."""
    tag = error["loc"][-1] if error["loc"] else ""
    if not isinstance(tag, str):
        return False
    is_text = isinstance(error.get("input"), str)
    return (tag.startswith("function-after[") and not is_text) or (tag.startswith("tuple[") and is_text)


def _raise(cls: Any, error: pydantic.ValidationError, where: str) -> NoReturn:
    errors = error.errors()
    for err in errors:  # a cross-field rule raised ConfigError inside __post_init__: pass it on unchanged
        if isinstance(err.get("ctx", {}).get("error"), ConfigError):
            raise err["ctx"]["error"] from None
    seen: dict[str, None] = {}
    for err in errors:
        if not _other_branch(err):
            seen.setdefault(_message(cls, err), None)
    raise ConfigError(where + "; ".join(seen)) from None
