"""How a config is assembled — defaults < the ``--config`` YAML file < command-line flags — and how every
refusal is worded (the field's path, the value, what is allowed); YAML in and out."""

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tyro
import yaml

from rlhf.config.base import ConfigError, _checks_deferred, _is_required, _merge, _to_plain, _validate
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


# ---------------------------------------------------------------------------------------------------------------
# YAML in and out, and the one way a config is assembled: defaults < YAML < command line.
# ---------------------------------------------------------------------------------------------------------------


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain YAML/JSON data: sections as mappings, tuples as lists, enums as strings."""
    return _to_plain(cfg)


def config_to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text that `load_config(<command>, file)` reads back into an equal config."""
    header = f"# rlhf {cfg.COMMAND}: resolved config (defaults < --config file < command line)\n"
    return header + yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True, width=110)


def _section_defaults(cls: type) -> dict[str, Any]:
    """The command's own defaults of its sections, as plain data (YAML overrides keys inside them)."""
    return {
        f.name: _to_plain(f.default_factory())
        for f in dataclasses.fields(cls)
        if f.default_factory is not dataclasses.MISSING
    }


def _build(cls: type, data: Mapping[str, Any], where: str, args: Sequence[str] = ()) -> Any:
    """`cls` from plain data: flat keys moved, laid over the command's defaults, validated."""
    values = _merge(_section_defaults(cls), _migrate(cls, data, where))
    _check_required(cls, values, args)
    return _validate(cls, values, where)


def _check_required(cls: type, values: Mapping[str, Any], args: Sequence[str]) -> None:
    """ConfigError naming every required field that neither `values` nor a flag in `args` sets."""
    missing = _required(cls, values, args)
    if missing and not any(arg in ("-h", "--help") for arg in args):
        flags = " ".join(f"--{name} …" for name in missing)
        raise ConfigError(
            f"{cls.COMMAND}: missing required field{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
            f"set {'them' if len(missing) > 1 else 'it'} in the --config YAML file or pass {flags}"
        )


def read_yaml(cls: type[CommandConfig], path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file, flat keys of version 0.1 moved to their sections.

    Raises ConfigError naming the file: missing file, invalid YAML (with its line) or not a mapping.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{cls.COMMAND}: config file {str(path)!r} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{cls.COMMAND}: cannot read config file {str(path)!r}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or " ".join(str(e).split())
        raise ConfigError(f"{cls.COMMAND}: {path}{line}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{cls.COMMAND}: {path}: expected a mapping of field: value at the top level, got {type(data).__name__}"
        )
    return _migrate(cls, data, f"{cls.COMMAND}: {path}: ")


def config_from_dict(command: str, values: Mapping[str, Any]) -> Any:
    """A checked config of `command` from plain data (as in a YAML file): the Python form of load_config."""
    cls = config_class(command)
    return _build(cls, values, f"{command}: ")


def _description(cls: type[CommandConfig]) -> str:
    summary = " ".join((cls.__doc__ or "").split())
    return (
        f"{summary}\n\nUsage: rlhf {cls.COMMAND} --config FILE.yaml [--<section>.<field> <value> ...]. "
        "Each field below can be set in the YAML file (nested under its section) or with its flag; the flag "
        "wins. The defaults shown include the file's values."
    )


def _required(cls: type, values: Mapping[str, Any], args: Sequence[str], prefix: str = "") -> list[str]:
    """Dotted paths of required fields that neither `values` nor a ``--path`` flag in `args` sets."""
    flags = {arg[2:].split("=", 1)[0].replace("-", "_") for arg in args if arg.startswith("--")}
    missing = []
    for f in dataclasses.fields(cls):
        if not _is_required(f):
            continue
        value = values.get(f.name)
        if dataclasses.is_dataclass(f.type) and (value is None or isinstance(value, Mapping)):
            missing += _required(f.type, value or {}, args, f"{prefix}{f.name}.")
        elif value is None and f"{prefix}{f.name}" not in flags:
            missing.append(f"{prefix}{f.name}")
    return missing


def _placeholder(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with a stand-in for each required field still unset, for tyro's default object.

    The stand-in never survives: `_check_required` made sure the flags set every such field, and the final
    config is built again from tyro's result.
    """
    out = dict(values)
    for f in dataclasses.fields(cls):
        if not _is_required(f):
            continue
        if dataclasses.is_dataclass(f.type):
            out[f.name] = _placeholder(f.type, out.get(f.name) or {})
        else:
            out.setdefault(f.name, "…")
    return out


def load_config(command: str, path: str | Path | None = None, overrides: Sequence[str] = ()) -> Any:
    """The checked config of `command`: defaults < YAML file `path` < command-line `overrides`.

    `overrides` are flags as typed on the command line, e.g. ``["--ppo.steps", "10", "--run.no_progress"]``;
    every check runs once, on the merged result. Raises ConfigError for a bad file, a missing required field
    or an impossible value or combination. A malformed flag is reported by tyro, which exits with
    SystemExit(2) (``--help`` exits with 0 after printing the help).
    """
    cls = config_class(command)
    overrides = _boolean_values(cls, _flag_moves(cls, list(overrides)))
    where = f"{command}: {path}: " if path is not None else f"{command}: "
    values = _merge(_section_defaults(cls), read_yaml(cls, path) if path is not None else {})
    _check_required(cls, values, overrides)
    with _checks_deferred():
        default = _validate(cls, _placeholder(cls, values), where)
        parsed = tyro.cli(
            cls,
            default=default,
            args=overrides,
            prog=f"rlhf {command}",
            description=_description(cls),
            use_underscores=True,
            config=(tyro.conf.EnumChoicesFromValues,),
        )
    return _build(cls, config_to_dict(parsed), f"{command}: ")  # the merged config, checked once


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _boolean_paths(cls: type, prefix: str = "") -> set[str]:
    """The dotted paths of the boolean fields of `cls`."""
    paths: set[str] = set()
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type):
            paths |= _boolean_paths(f.type, f"{prefix}{f.name}.")
        elif f.type is bool:
            paths.add(f"{prefix}{f.name}")
    return paths


def _boolean_values(cls: type, args: Sequence[str]) -> list[str]:
    """A boolean given a value, as every other field is (``--run.progress false``, ``--run.progress=true``),
    rewritten to the flag tyro takes (``--run.no_progress``, ``--run.progress``); the bare flags stay as they are."""
    booleans, out, i = _boolean_paths(cls), [], 0
    while i < len(args):
        arg = args[i]
        name, eq, text = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        name = name.replace("-", "_")
        if name in booleans and not eq and i + 1 < len(args) and args[i + 1].lower() in _TRUE + _FALSE:
            text, eq, i = args[i + 1], "=", i + 1
        if name in booleans and eq:
            if text.lower() not in _TRUE + _FALSE:
                raise ConfigError(f"{cls.COMMAND}: --{name}={text!r}: expected true or false")
            section, _, field = name.rpartition(".")
            arg = f"--{name}" if text.lower() in _TRUE else f"--{section}{'.' if section else ''}no_{field}"
        out.append(arg)
        i += 1
    return out
