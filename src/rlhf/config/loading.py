"""How a config is assembled — defaults < the ``--config`` YAML file < command-line flags — from YAML, flags
or Python data, and written back as YAML."""

import contextvars
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import tyro
import yaml
from tyro.constructors import ConstructorRegistry, StructConstructorSpec, StructTypeInfo

from rlhf.config.base import ConfigError, _merge, _validate, config_to_dict
from rlhf.config.commands import config_class
from rlhf.config.legacy import _flag_moves, _migrate
from rlhf.config.training import CommandConfig


def flat_config(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config mapping as ``{"section.field": value}`` (reward lists stay whole)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping) and key != "lora":
            out |= flat_config(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text that `load_config(<command>, file)` reads back into an equal config."""
    header = f"# rlhf {cfg.COMMAND}: resolved config (defaults < --config file < command line)\n"
    return header + yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True, width=110)


def read_yaml(cls: type[CommandConfig], path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file, flat keys of version 0.1 moved to their sections; ConfigError naming
    the file when it is missing, not valid YAML (with its line) or not a mapping."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{cls.COMMAND}: config file {str(path)!r} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{cls.COMMAND}: cannot read config file {str(path)!r}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or " ".join(str(e).split())
        raise ConfigError(f"{cls.COMMAND}: {path}{line}: invalid YAML: {problem}") from None
    if not isinstance(data, Mapping | None):
        raise ConfigError(
            f"{cls.COMMAND}: {path}: expected a mapping of field: value at the top level, got {type(data).__name__}"
        )
    return _migrate(cls, data or {}, f"{cls.COMMAND}: {path}: ")


def _with_defaults(cls: type, data: Mapping[str, Any], args: Sequence[str] = ()) -> dict[str, Any]:
    """`data` laid over the command's own defaults of its sections (a section given in part keeps the rest),
    with the stand-in "…" for each required field it leaves unset (tyro's default object must be complete).
    ConfigError names every such field that no ``--path`` flag in `args` sets either: no stand-in survives."""
    defaults = {
        f.name: config_to_dict(f.default_factory())
        for f in dataclasses.fields(cls)
        if f.default_factory is not dataclasses.MISSING
    }
    values, unset = _fill_required(cls, _merge(defaults, data))
    flags = {arg[2:].split("=", 1)[0].replace("-", "_") for arg in args if arg.startswith("--")}
    missing = [name for name in unset if name not in flags]
    if missing and not any(arg in ("-h", "--help") for arg in args):
        many = len(missing) > 1
        raise ConfigError(
            f"{cls.COMMAND}: missing required field{'s' if many else ''} {', '.join(missing)}; set "
            f"{'them' if many else 'it'} in the --config YAML file or pass {' '.join(f'--{m} …' for m in missing)}"
        )
    return values


def _fill_required(cls: type, values: Mapping[str, Any], prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """`values` with "…" for each required field still unset, and the dotted paths of those fields."""
    out, unset = dict(values), []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        value = out.get(f.name)
        if dataclasses.is_dataclass(f.type) and (value is None or isinstance(value, Mapping)):
            out[f.name], inner = _fill_required(f.type, value or {}, f"{prefix}{f.name}.")
            unset += inner
        elif value is None:
            out[f.name] = "…"
            unset.append(f"{prefix}{f.name}")
    return out, unset


def config_from_dict(command: str, values: Mapping[str, Any]) -> Any:
    """A checked config of `command` from plain data (as in a YAML file): the Python form of load_config."""
    return _build(config_class(command), values, f"{command}: ")


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    """`cls` from plain data (a function of its own: `_migrate` warns at the caller of config_from_dict)."""
    return _validate(cls, _with_defaults(cls, _migrate(cls, data, where)), where)


# tyro parses every section into a plain dict instead of building it: the flags may set a value pydantic
# refuses, or mend a cross-field rule the YAML file breaks, and the merged config is checked once, whole, so
# that a refusal names the field's path (tyro's own message would not).
_SECTIONS_AS_DICTS = ConstructorRegistry()
_INSIDE_RULE: contextvars.ContextVar[bool] = contextvars.ContextVar("rlhf_config_inside_rule", default=False)


@_SECTIONS_AS_DICTS.struct_rule
def _section_as_dict(info: StructTypeInfo) -> StructConstructorSpec | None:
    if _INSIDE_RULE.get() or not dataclasses.is_dataclass(info.type):
        return None
    token = _INSIDE_RULE.set(True)
    try:  # tyro's own dataclass rule: the fields, their help text and defaults
        spec = ConstructorRegistry.get_struct_spec(info)
    finally:
        _INSIDE_RULE.reset(token)
    return dataclasses.replace(spec, instantiate=dict) if isinstance(spec, StructConstructorSpec) else spec


def load_config(command: str, path: str | Path | None = None, overrides: Sequence[str] = ()) -> Any:
    """The checked config of `command`: defaults < YAML file `path` < command-line `overrides`. `overrides` are flags as
    typed on the command line, e.g. ``["--ppo.steps", "10", "--run.no_progress"]``; every check runs once, on the merged
    result. Raises ConfigError for a bad file, a missing required field or an impossible value or combination. A
    malformed flag is reported by tyro, which exits with SystemExit(2) (``--help`` exits with 0 after printing the
    help)."""
    cls = config_class(command)
    overrides = _boolean_values(cls, _flag_moves(cls, list(overrides)))
    values = read_yaml(cls, path) if path is not None else {}
    return _parse(cls, values, overrides, f"{command}: {path}: " if path is not None else f"{command}: ")


def with_flags(config: CommandConfig, overrides: Sequence[str]) -> Any:
    """``config`` with command-line ``overrides`` laid over it as `load_config` lays them over a file (the same
    parser: what is accepted here, ``rlhf <command>`` accepts), checked once."""
    cls = type(config)
    flags = _boolean_values(cls, _flag_moves(cls, list(overrides)))
    return _parse(cls, config_to_dict(config), flags, f"{cls.COMMAND}: ")


def _parse(cls: type[CommandConfig], data: Mapping[str, Any], overrides: list[str], where: str) -> Any:
    """``data`` with ``overrides`` (flags, as `_boolean_values` leaves them) laid over it by tyro, checked once."""
    command, values = cls.COMMAND, _with_defaults(cls, data, overrides)
    summary = " ".join((cls.__doc__ or "").split())
    with _SECTIONS_AS_DICTS:
        parsed = tyro.cli(
            cls,
            default=_validate(cls, values, where, check=False),  # its cross-field rules wait for the flags
            args=overrides,
            prog=f"rlhf {command}",
            description=f"{summary}\n\nUsage: rlhf {command} --config FILE.yaml [--<section>.<field> <value> ...]. "
            "Each field below can be set in the YAML file (nested under its section) or with its flag; the flag "
            "wins. The defaults shown include the file's values.",
            use_underscores=True,
            config=(tyro.conf.EnumChoicesFromValues,),
        )
    return _validate(cls, parsed, f"{command}: ")  # the merged config, checked once


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _boolean_values(cls: type, args: Sequence[str]) -> list[str]:
    """A boolean given a value, as every other field is (``--run.progress false``, ``--run.progress=true``),
    rewritten to the flag tyro takes (``--run.no_progress``, ``--run.progress``); the bare flags stay as they are."""
    booleans, out, i = set(_boolean_paths(cls)), [], 0
    while i < len(args):
        arg = args[i]
        name, eq, text = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        name = name.replace("-", "_")
        if name in booleans and not eq and i + 1 < len(args) and args[i + 1].lower() in _TRUE + _FALSE:
            text, eq, i = args[i + 1], "=", i + 1
        if name in booleans and eq:
            if text.lower() not in _TRUE + _FALSE:
                raise ConfigError(f"{cls.COMMAND}: --{name}={text!r}: expected true or false")
            field = name.rpartition(".")[2]
            arg = f"--{name}" if text.lower() in _TRUE else f"--{name[: -len(field)]}no_{field}"
        out.append(arg)
        i += 1
    return out


def _boolean_paths(cls: type, prefix: str = "") -> Iterator[str]:
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type):
            yield from _boolean_paths(f.type, f"{prefix}{f.name}.")
        elif f.type is bool:
            yield prefix + f.name
