"""One frozen, typed config dataclass per command — what ``rlhf <command>`` accepts, in YAML or as flags.

| command  | class         | runs                                   |
|----------|---------------|----------------------------------------|
| `sft`    | `SFTConfig`   | supervised fine-tuning                 |
| `rm`     | `RMConfig`    | Bradley–Terry reward model             |
| `ppo`    | `PPOConfig`   | PPO with a critic                      |
| `grpo`   | `GRPOConfig`  | GRPO / Dr. GRPO / RLOO / REINFORCE++   |
| `sample` | `SampleConfig`| candidates, pairs, judged preferences, best-of-N |
| `eval`   | `EvalConfig`  | held-out rewards; win rate vs a baseline |
| `demo`   | `DemoConfig`  | a tiny end-to-end run                  |

Values are resolved in one order: dataclass defaults < the ``--config`` YAML file < command-line flags
(`load_config`). The docstring under each field is its ``--help`` text (tyro reads it). ``__post_init__``
checks types and ranges and every cross-field rule on the *final* config, raising `ConfigError` with a
message that names the field and what would be valid. Derived sizes (`minibatch_size`, `grad_accum_steps`)
are properties of checked fields, so they always divide exactly.

Batch sizes are global (all ranks together); trainers split them over ``torchrun`` ranks.

This module must stay light: no torch, no transformers (``import rlhf.cli`` is checked not to load torch).
"""

import contextlib
import contextvars
import dataclasses
import difflib
import math
import types
import typing
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import tyro
import yaml
from tyro.constructors import MISSING, PrimitiveConstructorSpec

__all__ = [
    "COMMANDS",
    "ConfigError",
    "DemoConfig",
    "EvalConfig",
    "GRPOConfig",
    "LoRAConfig",
    "PPOConfig",
    "RMConfig",
    "RewardSpec",
    "SFTConfig",
    "SampleConfig",
    "config_class",
    "config_from_dict",
    "config_to_dict",
    "config_to_yaml",
    "load_config",
    "read_yaml",
]


class ConfigError(ValueError):
    """A config that cannot run: unknown key, wrong type, value out of range or impossible combination."""


# ---------------------------------------------------------------------------------------------------------------
# Choices. Plain string Literals: YAML holds plain strings, tyro lists them in --help, and a wrong value is
# reported with the valid ones. Code that dispatches on a choice can map the string to its function directly.
# ---------------------------------------------------------------------------------------------------------------

LRScheduler = Literal["constant", "linear", "cosine"]
DType = Literal["float32", "bfloat16", "float16"]
Parallelism = Literal["auto", "none", "ddp", "fsdp"]
Sink = Literal["jsonl", "tensorboard", "wandb", "trackio"]
KLEstimator = Literal["k1", "k2", "k3"]
KLIn = Literal["reward", "loss"]
KLControl = Literal["fixed", "adaptive"]
MissingEOSMode = Literal["replace", "subtract"]
RewardAggregation = Literal["sum", "gdpo"]
Critic = Literal["shared", "separate"]
ScorePosition = Literal["after_eos", "eos"]
Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]
ScaleRewards = Literal["auto", "group", "batch", "none"]
LossAggregation = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
Preset = Literal["tiny", "small"]

# How each estimator scales its advantages when `scale_rewards` is "auto".
_ESTIMATOR_SCALING: dict[str, str] = {
    "grpo": "group",
    "dr_grpo": "none",
    "rloo": "none",
    "reinforce_pp": "batch",
}


# ---------------------------------------------------------------------------------------------------------------
# Deferred checks. While a config is assembled from YAML and then command-line flags, the intermediate objects
# may be invalid (YAML num_minibatches=3, fixed by --num_minibatches 2); only the final object is checked.
# ---------------------------------------------------------------------------------------------------------------

_DEFER_CHECKS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "rlhf_config_defer_checks", default=False
)


@contextlib.contextmanager
def _checks_deferred() -> Iterator[None]:
    token = _DEFER_CHECKS.set(True)
    try:
        yield
    finally:
        _DEFER_CHECKS.reset(token)


# ---------------------------------------------------------------------------------------------------------------
# Type checking and conversion of plain (YAML) values against field annotations.
# ---------------------------------------------------------------------------------------------------------------


def _describe(tp: Any) -> str:
    """The type as a user reads it in an error message."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _describe(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(option) for option in get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(tp))
    if origin is tuple:
        return f"a list of ({_describe(get_args(tp)[0])})"
    if dataclasses.is_dataclass(tp):
        keys = "a mapping with keys " + ", ".join(f.name for f in dataclasses.fields(tp))
        return keys + " (or a source string)" if tp is RewardSpec else keys
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _as_float(value: Any) -> float | None:
    """`value` as a float if it is a number (not a bool) or a numeric string, else None.

    PyYAML reads ``1e-5`` (no dot) as the *string* "1e-5" (YAML 1.1), so numeric strings are accepted.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _fits(tp: Any, value: Any) -> bool:
    """Whether `value` has the shape of `tp` (used to pick the branch of a union before converting)."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _fits(get_args(tp)[0], value)
    if origin in (Union, types.UnionType):
        return any(_fits(option, value) for option in get_args(tp))
    if origin is Literal:
        return any(value == choice and type(value) is type(choice) for choice in get_args(tp))
    if origin is tuple:
        return isinstance(value, list | tuple)
    if dataclasses.is_dataclass(tp):
        return isinstance(value, tp | Mapping) or (tp is RewardSpec and isinstance(value, str))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return _as_float(value) is not None
    if tp is str:
        return isinstance(value, str)
    return False


def _coerce(tp: Any, value: Any, where: str, path: str) -> Any:
    """Check `value` against annotation `tp` and convert it (int → float, list → tuple, mapping → dataclass).

    `where` prefixes every message ("ppo: " or "ppo: run.yaml: "), `path` names the key ("lora.r").
    """
    origin = get_origin(tp)
    if origin is Annotated:
        return _coerce(get_args(tp)[0], value, where, path)
    if origin in (Union, types.UnionType):
        for option in get_args(tp):
            if _fits(option, value):
                return _coerce(option, value, where, path)
    elif origin is tuple and _fits(tp, value):
        item_type = get_args(tp)[0]
        return tuple(_coerce(item_type, item, where, f"{path}[{i}]") for i, item in enumerate(value))
    elif dataclasses.is_dataclass(tp) and _fits(tp, value):
        return _nested(tp, value, where, path)
    elif tp is float and _fits(tp, value):
        return _as_float(value)
    elif _fits(tp, value):
        return value
    raise ConfigError(f"{where}{path}: expected {_describe(tp)}, got {value!r}")


def _nested(cls: type, value: Any, where: str, path: str) -> Any:
    """A nested config (LoRAConfig, RewardSpec) from a mapping or an instance, checked unless deferred."""
    if isinstance(value, str):  # a reward list entry given as its source alone
        value = {"source": value}
    if isinstance(value, Mapping):
        values = _values_from_mapping(cls, value, where, f"{path}.")
        missing = [name for name in _required_fields(cls) if name not in values]
        if missing:
            raise ConfigError(f"{where}{path}: missing key {', '.join(repr(name) for name in missing)}")
        with _checks_deferred():
            value = cls(**values)
    _normalize_fields(value, where, f"{path}.")
    if not _DEFER_CHECKS.get():
        value._check(f"{where}{path}.")
    return value


def _values_from_mapping(
    cls: type, mapping: Mapping[Any, Any], where: str, prefix: str = ""
) -> dict[str, Any]:
    """Converted field values from a plain mapping; an unknown key is refused with the closest valid one."""
    hints = _type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    values: dict[str, Any] = {}
    for key, value in mapping.items():
        if key not in names:
            raise ConfigError(f"{where}{_unknown_key_message(cls, key, names, prefix)}")
        values[key] = _coerce(hints[key], value, where, f"{prefix}{key}")
    return values


def _unknown_key_message(cls: type, key: Any, names: list[str], prefix: str) -> str:
    message = f"unknown key '{prefix}{key}'"
    close = difflib.get_close_matches(str(key).replace("-", "_"), names, n=1, cutoff=0.6)
    if close:
        message += f"; did you mean '{prefix}{close[0]}'?"
    elsewhere = [cmd for cmd, other in COMMANDS.items() if other is not cls and key in _field_names(other)]
    if getattr(cls, "COMMAND", "") and elsewhere:
        message += f" ('{key}' is a field of `rlhf {' / '.join(elsewhere)}`, not of `rlhf {cls.COMMAND}`)"
    if not close:
        command = getattr(cls, "COMMAND", "")
        message += (
            f"; `rlhf {command} --help` lists the valid keys"
            if command
            else f"; valid keys: {', '.join(names)}"
        )
    return message


def _normalize_fields(obj: Any, where: str, prefix: str = "") -> None:
    """Type-check every field of `obj` in place (frozen, hence object.__setattr__): int → float, list → tuple."""
    hints = _type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is MISSING:
            raise ConfigError(
                f"{where}{prefix}{f.name} is required; set it in the --config YAML file or pass --{f.name}"
            )
        converted = _coerce(hints[f.name], value, where, f"{prefix}{f.name}")
        if converted is not value:
            object.__setattr__(obj, f.name, converted)


_HINTS: dict[type, dict[str, Any]] = {}


def _type_hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return _HINTS[cls]


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _required_fields(cls: type) -> list[str]:
    """Fields without a default, in declaration order."""
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


# ---------------------------------------------------------------------------------------------------------------
# Range checks. Each raises ConfigError naming the field, its value and what is allowed.
# ---------------------------------------------------------------------------------------------------------------


def _check_range(
    where: str,
    name: str,
    value: float,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    hint: str = "",
) -> None:
    ok = math.isfinite(value)
    ok = ok and (gt is None or value > gt) and (ge is None or value >= ge)
    ok = ok and (lt is None or value < lt) and (le is None or value <= le)
    if not ok:
        bounds = [
            f"{op} {bound:g}"
            for op, bound in ((">", gt), ("≥", ge), ("<", lt), ("≤", le))
            if bound is not None
        ]
        allowed = " and ".join(bounds) if bounds else "a finite number"
        raise ConfigError(f"{where}{name}={value!r} is out of range; it must be {allowed}{hint}")


def _check_nonempty(where: str, name: str, value: str | None, what: str) -> None:
    if value is not None and not value.strip():
        raise ConfigError(f"{where}{name} is empty; give {what}")


def _divisors(n: int) -> str:
    found = [d for d in range(1, n + 1) if n % d == 0]
    shown = ", ".join(str(d) for d in found[:12])
    return shown + (", …" if len(found) > 12 else "")


def _check_divides(where: str, name: str, value: int, total: int, total_text: str) -> None:
    """`value` (field `name`) must divide `total` (described by `total_text`)."""
    if total % value != 0:
        raise ConfigError(
            f"{where}{name}={value} does not divide {total_text}; choose a divisor of {total} ({_divisors(total)})"
        )


# ---------------------------------------------------------------------------------------------------------------
# Nested configs: LoRA adapters and one entry of a reward list.
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """LoRA adapters (peft) instead of full fine-tuning. YAML: a mapping under ``lora:``."""

    r: int = 8
    """Rank of the adapter matrices."""
    alpha: float = 16.0
    """Scaling numerator: the adapter's update is multiplied by alpha / r."""
    dropout: float = 0.05
    """Dropout on the adapter input, in [0, 1)."""
    target_modules: tuple[str, ...] | None = None
    """Module names to adapt; None = peft's default for the architecture, or every linear layer of the decoder (not the output head) where peft has none (e.g. Phi-3); ['all-linear'] = every linear layer except the output head. Names that match no module are refused, listing the model's linear layers."""

    def __post_init__(self) -> None:
        if not _DEFER_CHECKS.get():
            _normalize_fields(self, "", "lora.")
            self._check("lora.")

    def _check(self, where: str) -> None:
        _check_range(where, "r", self.r, ge=1)
        _check_range(where, "alpha", self.alpha, gt=0)
        _check_range(where, "dropout", self.dropout, ge=0, lt=1)
        if self.target_modules is not None and (
            not self.target_modules or not all(m.strip() for m in self.target_modules)
        ):
            raise ConfigError(
                f"{where}target_modules is empty; list module names or use null for peft's default"
            )


def _default_reward_name(source: str) -> str:
    """A short, readable name for a reward source (used for the `reward/<name>/mean` metric)."""
    text = source.strip().rstrip("/")
    if text.startswith(("http://", "https://")):
        return urllib.parse.urlsplit(text).hostname or text
    if ":" in text:  # path/file.py:function or package.module:function
        return text.rsplit(":", 1)[1]
    return Path(text).name or text


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardSpec:
    """One entry of a reward list: a source, its weight in the combination, and the name it is logged under."""

    source: str
    """A reward-model directory, `path/file.py:function`, `package.module:function` or an http(s):// URL."""
    weight: float = 1.0
    """Weight of this reward in the combination."""
    name: str | None = None
    """Metric name (`reward/<name>/mean`); null = derived from the source (function name, directory name or host)."""

    def __post_init__(self) -> None:
        if self.name is None and isinstance(self.source, str):
            object.__setattr__(self, "name", _default_reward_name(self.source))
        if not _DEFER_CHECKS.get():
            _normalize_fields(self, "", "reward.")
            self._check("reward.")

    def _check(self, where: str) -> None:
        _check_reward_source(where, "source", self.source)
        _check_range(where, "weight", self.weight)
        _check_nonempty(where, "name", self.name, "a metric name or leave it null")


def _check_reward_source(where: str, name: str, source: str) -> None:
    _check_nonempty(where, name, source, "a reward-model directory, file.py:function, module:function or URL")
    if source.strip().endswith(".py"):
        raise ConfigError(
            f"{where}{name}={source!r} names a file but no function; write '{source}:function_name'"
        )


# ---------------------------------------------------------------------------------------------------------------
# Command-line parsing of the two structured fields. Both take one argument: a plain value, or YAML flow syntax
# for the structured form — --reward rm_dir, --reward '[{source: a.py:f, weight: 2}, b.py:g]',
# --lora '{r: 16, alpha: 32}', --lora null.
# ---------------------------------------------------------------------------------------------------------------

RewardSourceType = str | tuple[RewardSpec, ...]


def _flow_yaml(value: Any) -> str:
    return yaml.safe_dump(_to_plain(value), default_flow_style=True, width=10_000).strip()


def _yaml_argument(text: str, flag: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{flag}: not valid YAML ({' '.join(str(e).split())})") from None


def _reward_spec(optional: bool) -> PrimitiveConstructorSpec:
    tp = RewardSourceType | None if optional else RewardSourceType

    def from_str(args: list[str]) -> Any:
        text = args[0]
        if optional and text.strip() in ("None", "null", "none", "~"):
            return None
        if not text.lstrip().startswith(("[", "{")):
            return text
        # one spec serves --reward and --judge, so the message names the kind of value, not the flag
        value = _yaml_argument(text, "reward source")
        return _coerce(tp, [value] if isinstance(value, Mapping) else value, "", "reward source")

    def to_str(value: Any) -> list[str]:
        return [value if isinstance(value, str) else "None" if value is None else _flow_yaml(list(value))]

    return PrimitiveConstructorSpec(
        nargs=1,
        metavar="SOURCE|[{source,weight,name},...]" + ("|None" if optional else ""),
        instance_from_str=from_str,
        is_instance=lambda value: _fits(tp, value),
        str_from_instance=to_str,
    )


def _lora_from_str(args: list[str]) -> LoRAConfig | None:
    text = args[0]
    if text.strip() in ("None", "null", "none", "~", ""):
        return None
    value = _yaml_argument(text, "--lora")
    if not isinstance(value, Mapping):
        raise ValueError(f"--lora: expected a mapping like '{{r: 16, alpha: 32}}' or null, got {text!r}")
    return _coerce(LoRAConfig, value, "", "--lora")


RewardSource = Annotated[RewardSourceType, _reward_spec(optional=False)]
OptionalRewardSource = Annotated[RewardSourceType | None, _reward_spec(optional=True)]
OptionalLoRA = Annotated[
    LoRAConfig | None,
    PrimitiveConstructorSpec(
        nargs=1,
        metavar="None|{r,alpha,dropout,target_modules}",
        instance_from_str=_lora_from_str,
        is_instance=lambda value: value is None or isinstance(value, LoRAConfig),
        str_from_instance=lambda value: ["None" if value is None else _flow_yaml(value)],
    ),
]


def _check_reward(where: str, reward: RewardSourceType | None, aggregation: str) -> None:
    """A reward string, or a non-empty list of specs with unique names and finite weights."""
    if reward is None:
        return
    if isinstance(reward, str):
        _check_reward_source(where, "reward", reward)
        if aggregation == "gdpo":
            raise ConfigError(
                f"{where}reward_aggregation='gdpo' combines several rewards but reward is a single source; "
                "give reward as a list of {source, weight, name} or use reward_aggregation='sum'"
            )
        return
    if not reward:
        raise ConfigError(f"{where}reward is an empty list; give at least one {{source, weight, name}}")
    seen: dict[str, int] = {}
    for i, spec in enumerate(reward):
        spec._check(f"{where}reward[{i}].")
        assert spec.name is not None  # filled from the source by RewardSpec.__post_init__
        if spec.name in seen:
            raise ConfigError(
                f"{where}reward[{i}].name={spec.name!r} is already used by reward[{seen[spec.name]}]; "
                "give each reward a distinct `name`"
            )
        seen[spec.name] = i


def _check_sampling(where: str, cfg: Any) -> None:
    """Generation fields shared by ppo, grpo, sample and eval."""
    _check_range(where, "max_prompt_length", cfg.max_prompt_length, ge=1)
    _check_range(where, "max_new_tokens", cfg.max_new_tokens, ge=1)
    _check_range(where, "temperature", cfg.temperature, gt=0, hint=" (1.0 samples the model as is)")
    _check_range(where, "top_k", cfg.top_k, ge=0, hint=" (0 turns top-k off)")
    _check_range(where, "top_p", cfg.top_p, gt=0, le=1, hint=" (1.0 turns nucleus sampling off)")
    if cfg.stop_token == "":  # whitespace such as "\n" is a valid stop text
        raise ConfigError(f"{where}stop_token is empty; give 'eos' or the text that ends a response")


# ---------------------------------------------------------------------------------------------------------------
# Command configs.
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Config:
    """Base of every command config: type-checks fields, then runs `_check` (unless checks are deferred)."""

    COMMAND: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if _DEFER_CHECKS.get():
            return
        _normalize_fields(self, f"{self.COMMAND}: ")
        self._check(f"{self.COMMAND}: ")

    def _check(self, where: str) -> None:
        """Ranges and cross-field rules; `where` prefixes every message."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _TrainingConfig(_Config):
    """Fields shared by the four training commands (sft, rm, ppo, grpo)."""

    output_dir: str
    """Run directory: config.yaml, metrics.jsonl, samples/, checkpoints/ and final/ are written here."""
    seed: int = 0
    """Seed for every random number generator (data order, dropout, sampling)."""
    train_data: str
    """Training data: a JSONL, JSON or Parquet file, or a `datasets` directory."""
    eval_data: str | None = None
    """Held-out data in the same format as train_data; None = no evaluation."""
    learning_rate: float = 1e-5
    """Peak learning rate of AdamW."""
    batch_size: int = 32
    """Examples per optimizer step, over all ranks."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward pass (gradient accumulation when smaller than the batch); must divide it. None = the whole batch in one pass."""
    lr_scheduler: LRScheduler = "linear"
    """Learning-rate schedule after warm-up: constant, linear decay to 0, or cosine decay to 0."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to learning_rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value; None = no clipping (the norm is still logged)."""
    eval_every: int = 100
    """Evaluate every this many optimizer steps (and before training and after each epoch); 0 = only then."""
    save_every: int = 500
    """Write a resumable checkpoint every this many optimizer steps; 0 = only the final model."""
    lora: OptionalLoRA = None
    """LoRA adapters instead of full fine-tuning: a mapping {r, alpha, dropout, target_modules} (on the command line as YAML, e.g. --lora '{r: 16, alpha: 32}'); None = full fine-tuning."""
    dtype: DType = "float32"
    """Parameter and compute dtype."""
    parallelism: Parallelism = "auto"
    """How the ranks of a torchrun launch share the work (batch_size stays global): ddp = every rank holds the models and trains on its share of each batch, gradients are averaged; fsdp = FSDP2, parameters, gradients and optimizer state sharded per decoder layer; auto = ddp under torchrun, one process otherwise; none = refuse torchrun."""
    report_to: tuple[Sink, ...] = ("jsonl",)
    """Metric sinks; jsonl writes output_dir/metrics.jsonl."""
    run_name: str | None = None
    """Run name for tensorboard / wandb / trackio; None = the name of output_dir."""
    log_every: int = 1
    """Log metrics every this many steps."""
    resume: bool = False
    """Continue the run in output_dir from its newest checkpoint that loads. The config must match the run's config.yaml except steps, epochs, eval_every, save_every, log_every, progress, report_to, run_name, micro_batch_size, micro_batch_tokens, compile and parallelism (a changed steps/epochs re-times the learning-rate schedule from the resume point); any other difference is refused, listing each field. Without a checkpoint the run starts afresh (refused if it finished with a final/)."""
    overwrite: bool = False
    """Replace the run already in output_dir: its config.yaml, metrics.jsonl, samples/, checkpoints/, final/ and tensorboard/ are deleted once the new run has loaded its models (other files there are left alone). Without resume or overwrite, a non-empty run directory is refused."""
    progress: bool = True
    """Show a progress bar on the console."""

    def _check(self, where: str) -> None:
        _check_nonempty(where, "output_dir", self.output_dir, "a directory for the run")
        _check_resume_overwrite(where, self)
        _check_nonempty(where, "train_data", self.train_data, "a data file or directory")
        _check_nonempty(where, "eval_data", self.eval_data, "a data file or directory, or None")
        _check_range(where, "seed", self.seed, ge=0)
        _check_range(where, "learning_rate", self.learning_rate, gt=0)
        _check_range(where, "batch_size", self.batch_size, ge=1)
        if self.micro_batch_size is not None:
            _check_range(
                where, "micro_batch_size", self.micro_batch_size, ge=1, hint=" (or None for no accumulation)"
            )
        _check_range(where, "warmup_steps", self.warmup_steps, ge=0)
        _check_range(where, "weight_decay", self.weight_decay, ge=0)
        if self.max_grad_norm is not None:
            _check_range(where, "max_grad_norm", self.max_grad_norm, gt=0, hint=" (or None for no clipping)")
        _check_range(where, "eval_every", self.eval_every, ge=0)
        _check_range(where, "save_every", self.save_every, ge=0)
        _check_range(where, "log_every", self.log_every, ge=1)
        if len(set(self.report_to)) != len(self.report_to):
            raise ConfigError(f"{where}report_to={list(self.report_to)} names a sink twice; list each once")
        _check_nonempty(where, "run_name", self.run_name, "a name or None")
        if self.lora is not None:
            self.lora._check(f"{where}lora.")

    @property
    def effective_micro_batch_size(self) -> int:
        """Sequences per forward/backward pass (micro_batch_size, or the whole batch when it is None)."""
        return self.micro_batch_size or self.batch_size

    @property
    def grad_accum_steps(self) -> int:
        """Forward/backward passes per optimizer step."""
        return self.batch_size // self.effective_micro_batch_size


def _check_resume_overwrite(where: str, cfg: Any) -> None:
    if getattr(cfg, "resume", False) and cfg.overwrite:
        raise ConfigError(
            f"{where}resume and overwrite are both set; resume continues the run in output_dir, overwrite "
            "replaces it — choose one"
        )


def _check_batch_divides(where: str, cfg: "_TrainingConfig", unit: str) -> None:
    if cfg.micro_batch_size is not None:
        _check_divides(
            where,
            "micro_batch_size",
            cfg.micro_batch_size,
            cfg.batch_size,
            f"batch_size={cfg.batch_size} {unit}",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTConfig(_TrainingConfig):
    """Supervised fine-tuning: next-token loss on the response (assistant) tokens only."""

    COMMAND: ClassVar[str] = "sft"

    model: str
    """Initial weights: a hub id or a local directory of a causal LM."""
    epochs: int = 3
    """Passes over train_data."""
    max_length: int = 1024
    """Longest prompt + response in tokens."""
    packing: bool = False
    """Concatenate each micro-batch's examples into rows of up to max_length tokens instead of padding each one; position ids restart and attention stays within every example, so the loss and gradient are those of the unpacked batch (models that cannot keep packed examples apart are refused)."""
    learning_rate: float = 2e-5
    """Peak learning rate of AdamW."""
    batch_size: int = 32
    """Examples per optimizer step, over all ranks."""

    def _check(self, where: str) -> None:
        super()._check(where)
        _check_nonempty(where, "model", self.model, "a hub id or a model directory")
        _check_range(where, "epochs", self.epochs, ge=1)
        _check_range(where, "max_length", self.max_length, ge=2)
        _check_batch_divides(where, self, "examples")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RMConfig(_TrainingConfig):
    """Bradley–Terry reward model on preference pairs: loss −log σ(r_chosen − r_rejected [− margin])."""

    COMMAND: ClassVar[str] = "rm"

    model: str
    """Initial weights: a hub id or a local directory (a causal LM gets a fresh one-output score head)."""
    epochs: int = 1
    """Passes over train_data (reward models overfit after about one epoch)."""
    max_length: int = 1024
    """Longest prompt + response in tokens."""
    use_margin: bool = True
    """When a pair has a "margin" column, subtract it inside the sigmoid: −log σ(r_c − r_r − margin)."""
    center_rewards_coefficient: float | None = None
    """Weight of the auxiliary loss coef·mean((r_c + r_r)²) that keeps rewards centred at 0; None = off."""
    learning_rate: float = 1e-5
    """Peak learning rate of AdamW."""
    batch_size: int = 32
    """Preference pairs per optimizer step, over all ranks."""
    normalize_policy: str | None = None
    """After training, normalise the rewards: sample responses from this causal LM (hub id or directory; usually the SFT/reference policy) and store gain and bias with the model so their scores have mean 0 and std 1 for every consumer. None = no normalisation."""
    normalize_prompts: str | None = None
    """Prompts file ({"prompt"} or {"messages"} rows) to sample the normalisation responses for; None = the prompts of train_data."""
    normalize_samples: int = 256
    """How many responses the normalisation samples and scores (OAI: 256)."""
    normalize_max_new_tokens: int = 64
    """Longest normalisation response in tokens."""
    normalize_temperature: float = 1.0
    """Sampling temperature of the normalisation responses."""

    def _check(self, where: str) -> None:
        super()._check(where)
        _check_nonempty(where, "model", self.model, "a hub id or a model directory")
        _check_range(where, "epochs", self.epochs, ge=1)
        _check_range(where, "max_length", self.max_length, ge=2)
        if self.center_rewards_coefficient is not None:
            _check_range(where, "center_rewards_coefficient", self.center_rewards_coefficient, ge=0)
        _check_batch_divides(where, self, "pairs")
        _check_nonempty(
            where, "normalize_policy", self.normalize_policy, "a hub id or a model directory, or None"
        )
        _check_nonempty(where, "normalize_prompts", self.normalize_prompts, "a prompts file, or None")
        if self.normalize_prompts is not None and self.normalize_policy is None:
            raise ConfigError(
                f"{where}normalize_prompts is set but normalize_policy is None; set normalize_policy to the "
                "model whose responses the normalisation samples, or drop normalize_prompts"
            )
        _check_range(where, "normalize_samples", self.normalize_samples, ge=2, hint=" (a std needs two)")
        _check_range(where, "normalize_max_new_tokens", self.normalize_max_new_tokens, ge=1)
        _check_range(where, "normalize_temperature", self.normalize_temperature, gt=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _PolicyGradientConfig(_TrainingConfig):
    """Fields shared by ppo and grpo: the policy, the reward, sampling, the KL penalty and the clipped loss."""

    policy: str
    """Initial policy weights (usually the SFT model): a hub id or a local directory. Also the frozen reference for the KL penalty."""
    reward: RewardSource
    """Reward source: a reward-model directory, `path/file.py:function`, `package.module:function`, an http(s):// URL, or a list of {source, weight, name} (on the command line as YAML: '[{source: a.py:f, weight: 2}]')."""
    reward_aggregation: RewardAggregation = "sum"
    """How a reward list is combined: weighted sum, or gdpo (normalise each reward, sum, normalise the sum)."""
    steps: int = 500
    """Outer iterations: sample a batch, score it, update the policy."""
    max_prompt_length: int = 512
    """Longest prompt in tokens."""
    max_new_tokens: int = 64
    """Longest response in tokens; responses are cut at the stop token or here."""
    temperature: float = 0.7
    """Sampling temperature (log-probabilities for the loss use the same temperature)."""
    top_k: int = 0
    """Sample only from the k most likely tokens; 0 = off."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the smallest set of tokens with this much probability; 1.0 = off."""
    stop_token: str = "eos"
    """What ends a response: 'eos' (the tokenizer's end-of-sequence token) or a literal text such as '\\n'."""
    missing_eos_penalty: float | None = None
    """Penalty (≥ 0) for a response that hits max_new_tokens without the stop token; None = none."""
    missing_eos_mode: MissingEOSMode = "replace"
    """How the penalty applies: replace (score := −penalty) or subtract (score −= penalty)."""
    kl_coef: float = 0.05
    """β, the weight of the KL penalty against the reference policy (the initial value when adaptive)."""
    kl_estimator: KLEstimator = "k1"
    """Per-token KL estimator: k1 = log π − log π_ref, k2 = ½(log r)², k3 = (r − 1) − log r with r = π_ref/π."""
    kl_in: KLIn = "reward"
    """Where the KL penalty goes: into the per-token rewards (−β·KL with kl_estimator), or added to the loss (+β·k3, whatever kl_estimator says: k3 is the estimator whose value is non-negative per token)."""
    kl_control: KLControl = "fixed"
    """fixed β, or adaptive: β ← β·(1 + clip(KL/kl_target − 1, ±0.2)·batch/kl_horizon) after each iteration."""
    kl_target: float = 6.0
    """Target KL (nats per sequence) of the adaptive controller."""
    kl_horizon: int = 10000
    """Horizon (in sequences) of the adaptive controller."""
    clip_range: float = 0.2
    """ε of the clipped surrogate: the ratio is clipped to [1 − ε, 1 + clip_range_high]."""
    clip_range_high: float | None = None
    """Upper clip ε_high (DAPO clip-higher, e.g. 0.28); None = clip_range."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus subtracted from the loss."""
    whiten_rewards: bool = False
    """Rescale the per-token rewards of the batch to unit variance (mean kept) before the advantages."""
    whiten_advantages: bool = True
    """Normalise advantages to mean 0 and variance 1 over the batch's response tokens."""
    micro_batch_tokens: int | None = None
    """Token budget of a forward/backward pass: each minibatch's sequences, longest first, are cut into micro-batches of at most this many tokens when padded to their own longest sequence (with micro_batch_size, both limits hold). Bounds activation memory by tokens rather than sequences and cuts padding between sequences of unequal length. None = no budget (micro-batches of micro_batch_size sequences in order; their padding is still cut)."""
    compile: bool = False
    """torch.compile the transformer blocks of the policy, reference and critic: on the 2-core CPU benchmark the updates ran 9-10% faster (a PPO step 4-10%), after a one-time compile of 8-10 s with inductor's cache warm and about 35 s cold; it pays in runs of a few hundred steps. Needs a C++ compiler on CPU."""
    eval_every: int = 50
    """Sample the eval_data prompts into output_dir/samples/ every this many iterations; 0 = only at the end."""
    save_every: int = 100
    """Write a resumable checkpoint every this many iterations; 0 = only the final model."""

    def _check(self, where: str) -> None:
        super()._check(where)
        _check_nonempty(where, "policy", self.policy, "a hub id or a model directory")
        _check_reward(where, self.reward, self.reward_aggregation)
        _check_range(where, "steps", self.steps, ge=1)
        _check_sampling(where, self)
        if self.missing_eos_penalty is not None:
            _check_range(
                where, "missing_eos_penalty", self.missing_eos_penalty, ge=0, hint=" (or None for no penalty)"
            )
        _check_range(where, "kl_coef", self.kl_coef, ge=0, hint=" (0 turns the KL penalty off)")
        _check_range(where, "kl_target", self.kl_target, gt=0)
        _check_range(where, "kl_horizon", self.kl_horizon, ge=1)
        if self.kl_control == "adaptive" and self.kl_coef == 0:
            raise ConfigError(
                f"{where}kl_control='adaptive' scales kl_coef, which is 0 so it would stay 0; "
                "set kl_coef > 0 (e.g. 0.15) or use kl_control='fixed'"
            )
        _check_range(where, "clip_range", self.clip_range, gt=0, lt=1)
        if self.clip_range_high is not None:
            _check_range(
                where, "clip_range_high", self.clip_range_high, gt=0, hint=" (or None for clip_range)"
            )
        _check_range(where, "entropy_coef", self.entropy_coef, ge=0)
        if self.micro_batch_tokens is not None:
            _check_range(where, "micro_batch_tokens", self.micro_batch_tokens, ge=1, hint=" (or None for no budget)")

    @property
    def clip_range_upper(self) -> float:
        """ε_high: clip_range_high, or clip_range when it is None."""
        return self.clip_range if self.clip_range_high is None else self.clip_range_high


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOConfig(_PolicyGradientConfig):
    """PPO with a learned critic: per-token KL-shaped rewards, GAE advantages, clipped policy and value losses."""

    COMMAND: ClassVar[str] = "ppo"

    learning_rate: float = 3e-6
    """Peak learning rate of AdamW (policy and critic)."""
    batch_size: int = 64
    """Prompts per iteration (one response each), over all ranks."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward pass (gradient accumulation); must divide batch_size / num_minibatches. None = the whole minibatch in one pass."""
    ppo_epochs: int = 4
    """Passes over each rollout batch."""
    num_minibatches: int = 1
    """Minibatches per PPO epoch, one optimizer step each; must divide batch_size."""
    critic: Critic = "shared"
    """Value function: a zero-initialised head on the policy's trunk (shared: one forward gives log-probs and values), or a separate model (separate: initialised from the reward model when the reward is a model, else from the policy)."""
    vf_coef: float = 0.1
    """Weight of the value loss in the total loss."""
    value_clip_range: float = 0.2
    """ε_v: new values are clipped to old ± ε_v in the value loss."""
    gamma: float = 1.0
    """Discount γ of GAE."""
    lam: float = 0.95
    """λ of GAE."""
    score_position: ScorePosition = "after_eos"
    """Token that receives the sequence score: after_eos = the first padding after the EOS when there is room (TRL / N+ convention), else the last token; eos = the EOS (last real) token."""

    def _check(self, where: str) -> None:
        super()._check(where)
        _check_range(where, "ppo_epochs", self.ppo_epochs, ge=1)
        _check_range(where, "num_minibatches", self.num_minibatches, ge=1)
        _check_divides(
            where, "num_minibatches", self.num_minibatches, self.batch_size, f"batch_size={self.batch_size}"
        )
        if self.micro_batch_size is not None:
            _check_divides(
                where,
                "micro_batch_size",
                self.micro_batch_size,
                self.minibatch_size,
                f"the minibatch of {self.minibatch_size} sequences "
                f"(batch_size={self.batch_size} / num_minibatches={self.num_minibatches})",
            )
        _check_range(where, "vf_coef", self.vf_coef, gt=0, hint=" (the critic only learns through it)")
        _check_range(where, "value_clip_range", self.value_clip_range, gt=0)
        _check_range(where, "gamma", self.gamma, gt=0, le=1)
        _check_range(where, "lam", self.lam, ge=0, le=1)

    @property
    def minibatch_size(self) -> int:
        """Sequences per optimizer step: batch_size / num_minibatches."""
        return self.batch_size // self.num_minibatches

    @property
    def effective_micro_batch_size(self) -> int:
        """Sequences per forward/backward pass (micro_batch_size, or the whole minibatch when it is None)."""
        return self.micro_batch_size or self.minibatch_size

    @property
    def grad_accum_steps(self) -> int:
        """Forward/backward passes per optimizer step."""
        return self.minibatch_size // self.effective_micro_batch_size


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig(_PolicyGradientConfig):
    """The critic-free GRPO family: G samples per prompt, group-relative advantages (GRPO, Dr. GRPO, RLOO, REINFORCE++), the clipped per-token loss, optional DAPO overlong shaping and dynamic sampling."""

    COMMAND: ClassVar[str] = "grpo"

    learning_rate: float = 1e-6
    """Peak learning rate of AdamW."""
    batch_size: int = 16
    """Prompts per iteration (each sampled group_size times), over all ranks."""
    micro_batch_size: int | None = None
    """Sequences (completions) per forward/backward pass; must divide batch_size·group_size / num_minibatches. None = the whole minibatch in one pass."""
    max_new_tokens: int = 256
    """Longest response in tokens; responses are cut at the stop token or here."""
    temperature: float = 1.0
    """Sampling temperature (log-probabilities for the loss use the same temperature)."""
    kl_coef: float = 0.0
    """β, the weight of the KL penalty against the reference policy; 0 = no penalty (no reference model)."""
    kl_estimator: KLEstimator = "k3"
    """Per-token KL estimator: k1 = log π − log π_ref, k2 = ½(log r)², k3 = (r − 1) − log r with r = π_ref/π."""
    kl_in: KLIn = "loss"
    """Where the KL penalty goes: added to the loss (+β·k3, whatever kl_estimator says), or into the per-token rewards (−β·KL with kl_estimator)."""
    whiten_advantages: bool = False
    """Normalise the (already group-relative) advantages again over the batch."""
    group_size: int = 8
    """G, samples per prompt (≥ 2: advantages compare samples of the same prompt)."""
    estimator: Estimator = "grpo"
    """Advantage estimator: grpo (r − group mean, / group std), dr_grpo (r − group mean), rloo (leave-one-out baseline), reinforce_pp (r − group mean, / batch std)."""
    scale_rewards: ScaleRewards = "auto"
    """Divisor of grpo's advantages: group std, batch std or none; auto = the estimator's own. Other estimators fix their own scaling, so only 'auto' is allowed with them."""
    loss_aggregation: LossAggregation = "token-mean"
    """Reduction of the per-token loss: token-mean (all tokens of the batch), seq-mean-token-mean (GRPO paper), seq-mean-token-sum, seq-mean-token-sum-norm (Dr. GRPO: sum / max_new_tokens)."""
    num_iterations: int = 1
    """μ, passes over each sampled batch (1 = on-policy: the ratio is exactly 1 and clipping never applies)."""
    num_minibatches: int = 1
    """Minibatches per pass, one optimizer step each; must divide batch_size·group_size."""
    overlong_buffer: int = 0
    """DAPO overlong shaping: responses longer than max_new_tokens − overlong_buffer get a penalty growing linearly to −overlong_penalty_factor at max_new_tokens; 0 = off."""
    overlong_penalty_factor: float = 1.0
    """Largest overlong penalty (reached at max_new_tokens)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal (no signal) and sample more prompts until batch_size groups remain."""
    mask_truncated_completions: bool = False
    """Leave completions cut at max_new_tokens (no stop token) out of the loss (DAPO); they still count in the group statistics."""

    def _check(self, where: str) -> None:
        super()._check(where)
        _check_range(
            where, "group_size", self.group_size, ge=2, hint=" (advantages compare samples of a prompt)"
        )
        if self.estimator != "grpo" and self.scale_rewards != "auto":
            raise ConfigError(
                f"{where}scale_rewards={self.scale_rewards!r} applies to estimator='grpo' only; estimator="
                f"{self.estimator!r} scales by {_ESTIMATOR_SCALING[self.estimator]!r} itself, so leave "
                "scale_rewards='auto'"
            )
        _check_range(where, "num_iterations", self.num_iterations, ge=1)
        _check_range(where, "num_minibatches", self.num_minibatches, ge=1)
        _check_divides(
            where,
            "num_minibatches",
            self.num_minibatches,
            self.num_sequences,
            f"the {self.num_sequences} sequences of an iteration (batch_size={self.batch_size} × "
            f"group_size={self.group_size})",
        )
        if self.micro_batch_size is not None:
            _check_divides(
                where,
                "micro_batch_size",
                self.micro_batch_size,
                self.minibatch_size,
                f"the minibatch of {self.minibatch_size} sequences (batch_size={self.batch_size} × "
                f"group_size={self.group_size} / num_minibatches={self.num_minibatches})",
            )
        _check_range(
            where,
            "overlong_buffer",
            self.overlong_buffer,
            ge=0,
            lt=self.max_new_tokens,
            hint=" (below max_new_tokens)",
        )
        _check_range(where, "overlong_penalty_factor", self.overlong_penalty_factor, ge=0)

    @property
    def num_sequences(self) -> int:
        """Sequences sampled per iteration: batch_size · group_size."""
        return self.batch_size * self.group_size

    @property
    def minibatch_size(self) -> int:
        """Sequences per optimizer step: batch_size · group_size / num_minibatches."""
        return self.num_sequences // self.num_minibatches

    @property
    def effective_micro_batch_size(self) -> int:
        """Sequences per forward/backward pass (micro_batch_size, or the whole minibatch when it is None)."""
        return self.micro_batch_size or self.minibatch_size

    @property
    def grad_accum_steps(self) -> int:
        """Forward/backward passes per optimizer step."""
        return self.minibatch_size // self.effective_micro_batch_size

    @property
    def reward_scaling(self) -> str:
        """The advantage divisor actually used: 'group', 'batch' or 'none' (scale_rewards with 'auto' resolved)."""
        return _ESTIMATOR_SCALING[self.estimator] if self.scale_rewards == "auto" else self.scale_rewards


def _check_judge(where: str, field: str, judge: RewardSourceType | None, aggregation: str) -> None:
    """`_check_reward` for a reward source held in another field (`judge`), so messages name that field."""
    if judge is None:
        return
    if isinstance(judge, str):
        _check_reward_source(where, field, judge)
        if aggregation == "gdpo":
            raise ConfigError(
                f"{where}reward_aggregation='gdpo' combines several rewards but {field} is a single source; "
                f"give {field} as a list of {{source, weight, name}} or use reward_aggregation='sum'"
            )
        return
    if not judge:
        raise ConfigError(f"{where}{field} is an empty list; give at least one {{source, weight, name}}")
    seen: dict[str, int] = {}
    for i, spec in enumerate(judge):
        spec._check(f"{where}{field}[{i}].")
        if spec.name in seen:
            raise ConfigError(
                f"{where}{field}[{i}].name={spec.name!r} is already used by {field}[{seen[spec.name]}]; "
                "give each reward a distinct `name`"
            )
        seen[str(spec.name)] = i


@dataclasses.dataclass(frozen=True, kw_only=True)
class SampleConfig(_Config):
    """Sample num_samples completions per prompt and write them as candidates, pairs for labelling, judge-labelled preferences (for `rlhf rm`) or best-of-N demonstrations (for `rlhf sft`)."""

    COMMAND: ClassVar[str] = "sample"

    policy: str
    """Model to sample from: a hub id or a local directory."""
    prompts: str
    """Prompts file ({"prompt"} or {"messages"} rows; other keys are columns, passed to the judge): JSONL, JSON, Parquet or a `datasets` directory."""
    output: str
    """JSONL file to write; its rows depend on mode (candidates: {prompt, completions, [rewards]}; pairs: {prompt, a, b}; preferences: {prompt, chosen, rejected}; best_of_n: {prompt, response, reward})."""
    mode: Literal["candidates", "pairs", "preferences", "best_of_n"] = "candidates"
    """candidates: one row per prompt with its num_samples completions; pairs: completion pairs for human labelling; preferences: the judge's best and worst completion as chosen/rejected (prompts where they tie are skipped); best_of_n: the judge's best completion as an SFT demonstration (rejection-sampling fine-tuning)."""
    num_samples: int = 4
    """k, completions sampled per prompt (≥ 2 for pairs and preferences)."""
    pairing: Literal["adjacent", "all"] = "adjacent"
    """mode='pairs' only: adjacent = samples (1, 2), (3, 4), … (each completion in one pair, k // 2 pairs); all = every one of the k·(k−1)/2 pairs."""
    judge: OptionalRewardSource = None
    """Reward source that scores the completions (same forms as ppo's reward); needed by preferences and best_of_n, optional for candidates (adds rewards), not used by pairs."""
    reward_aggregation: RewardAggregation = "sum"
    """How a judge list is combined: weighted sum, or gdpo (normalised within the num_samples completions of a prompt)."""
    batch_size: int = 8
    """Prompts per generation call (each sampled num_samples times)."""
    max_prompt_length: int = 512
    """Longest prompt in tokens; longer prompts keep their end."""
    max_new_tokens: int = 128
    """Longest completion in tokens; completions end at the stop token or here."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_k: int = 0
    """Sample only from the k most likely tokens; 0 = off."""
    top_p: float = 1.0
    """Nucleus sampling threshold; 1.0 = off."""
    stop_token: str = "eos"
    """What ends a completion: 'eos' or a literal text that is one token."""
    seed: int = 0
    """Seed of sampling: the same seed, model, prompts and batch_size write the same file."""
    dtype: DType = "float32"
    """Model dtype."""
    summary: bool = False
    """Also write the run's counts, mean judge score and timings to <output>.summary.json (they always go to stderr)."""
    overwrite: bool = False
    """Replace output (and <output>.summary.json) if it exists; without it an existing file is refused before any sampling."""
    progress: bool = True
    """Show a progress bar on the console."""

    def _check(self, where: str) -> None:
        _check_nonempty(where, "policy", self.policy, "a hub id or a model directory")
        _check_nonempty(where, "prompts", self.prompts, "a prompts file")
        _check_nonempty(where, "output", self.output, "an output file")
        _check_range(where, "num_samples", self.num_samples, ge=1)
        if self.mode in ("pairs", "preferences"):
            hint = f" with mode='{self.mode}' (a pair needs two)"
            _check_range(where, "num_samples", self.num_samples, ge=2, hint=hint)
        if self.mode in ("preferences", "best_of_n") and self.judge is None:
            raise ConfigError(
                f"{where}mode='{self.mode}' needs a judge to rank the samples; set judge to a reward-model "
                "directory, file.py:function, module:function, URL or a list of {source, weight, name} "
                "(or use mode='pairs' to label pairs by hand)"
            )
        if self.mode == "pairs" and self.judge is not None:
            raise ConfigError(
                f"{where}judge is not used by mode='pairs' (pairs are written for human labelling); use "
                "mode='preferences' to let the judge pick chosen and rejected, or leave judge unset"
            )
        _check_judge(where, "judge", self.judge, self.reward_aggregation)
        _check_range(where, "batch_size", self.batch_size, ge=1)
        _check_sampling(where, self)
        _check_range(where, "seed", self.seed, ge=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig(_Config):
    """Generate on held-out prompts and score the completions with a reward; with a baseline, also the policy's win rate against it under a judge."""

    COMMAND: ClassVar[str] = "eval"

    policy: str
    """Model to evaluate: a hub id or a local directory (e.g. a run's final/)."""
    eval_data: str
    """Held-out prompts ({"prompt"} or {"messages"} rows; other keys are columns, passed to the reward)."""
    reward: RewardSource
    """Reward source (same forms as in ppo): reported as reward/mean, reward/std and reward/<name>/mean."""
    reward_aggregation: RewardAggregation = "sum"
    """How a reward (or judge) list is combined: weighted sum or gdpo."""
    baseline: str | None = None
    """Model B to compare the policy with (a hub id or a directory), sampled on the same prompts with the same seed; None = no comparison."""
    judge: OptionalRewardSource = None
    """Reward source that decides each policy-vs-baseline comparison (higher score wins, equal scores tie); None = reward. Needs baseline."""
    output: str | None = None
    """JSON file for the results; None = print them to stdout."""
    samples_output: str | None = None
    """JSONL file with one row per prompt: its completion(s) and scores; None = not written."""
    max_prompts: int | None = None
    """Evaluate only the first this many prompts; None = all."""
    batch_size: int = 16
    """Prompts per generation call."""
    max_prompt_length: int = 512
    """Longest prompt in tokens; longer prompts keep their end."""
    max_new_tokens: int = 128
    """Longest completion in tokens; completions end at the stop token or here."""
    temperature: float = 0.7
    """Sampling temperature."""
    top_k: int = 0
    """Sample only from the k most likely tokens; 0 = off."""
    top_p: float = 1.0
    """Nucleus sampling threshold; 1.0 = off."""
    stop_token: str = "eos"
    """What ends a completion: 'eos' or a literal text that is one token."""
    seed: int = 0
    """Seed of sampling (the policy and the baseline each start from it): the same seed gives the same results."""
    dtype: DType = "float32"
    """Model dtype."""
    overwrite: bool = False
    """Replace output and samples_output if they exist; without it an existing file is refused before any work."""
    progress: bool = True
    """Show a progress bar on the console."""

    def _check(self, where: str) -> None:
        _check_nonempty(where, "policy", self.policy, "a hub id or a model directory")
        _check_nonempty(where, "eval_data", self.eval_data, "a prompts file")
        _check_reward(where, self.reward, self.reward_aggregation)
        _check_nonempty(where, "baseline", self.baseline, "a hub id or a model directory, or None")
        if self.judge is not None and self.baseline is None:
            raise ConfigError(
                f"{where}judge decides the win rate against baseline, which is not set; set baseline "
                "(model B) or leave judge unset"
            )
        _check_judge(where, "judge", self.judge, self.reward_aggregation)
        _check_nonempty(where, "output", self.output, "a JSON file, or None for stdout")
        _check_nonempty(where, "samples_output", self.samples_output, "a JSONL file or None")
        if self.output is not None and self.output == self.samples_output:
            raise ConfigError(
                f"{where}output and samples_output are both {self.output!r}; give them different files"
            )
        if self.max_prompts is not None:
            _check_range(where, "max_prompts", self.max_prompts, ge=1, hint=" (or None for all)")
        _check_range(where, "batch_size", self.batch_size, ge=1)
        _check_sampling(where, self)
        _check_range(where, "seed", self.seed, ge=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoConfig(_Config):
    """The whole RLHF pipeline on a built-in advice task, offline: pretrain → SFT → sample → gold-judged pairs → reward model → PPO and GRPO → held-out evaluation under the gold judge."""

    COMMAND: ClassVar[str] = "demo"

    output_dir: str = "runs/demo"
    """Directory for the demo: one run directory per stage, summary.json."""
    preset: Preset = "small"
    """Size of the demo (sizes in rlhf.demo.pipeline.PRESETS): tiny (seconds; a smoke test of every stage) or small (a few CPU minutes; PPO learns to beat SFT under the gold judge)."""
    steps: int | None = None
    """Iterations of both PPO and GRPO; None = the preset's own."""
    seed: int = 0
    """Seed for every random number generator."""
    overwrite: bool = False
    """Replace a demo already in output_dir (its stage directories, data/, summary.json and report.html; other files are left alone); without it such a directory is refused."""
    progress: bool = True
    """Show a progress bar on the console."""

    def _check(self, where: str) -> None:
        _check_nonempty(where, "output_dir", self.output_dir, "a directory")
        if self.steps is not None:
            _check_range(where, "steps", self.steps, ge=1, hint=" (or None for the preset's own)")
        _check_range(where, "seed", self.seed, ge=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReportConfig(_Config):
    """A self-contained HTML report of a ppo/grpo run, or of an rlhf demo directory: training curves, reward against KL, held-out answers, the config. `rlhf report RUN_DIR` is short for --run_dir RUN_DIR."""

    COMMAND: ClassVar[str] = "report"

    run_dir: str
    """The output_dir of a ppo or grpo run (config.yaml, metrics.jsonl, samples/), or of rlhf demo."""
    output: str | None = None
    """Where to write the HTML file; None = RUN_DIR/report.html."""
    max_samples: int = 12
    """Held-out prompts shown in the answers table."""

    def _check(self, where: str) -> None:
        _check_nonempty(where, "run_dir", self.run_dir, "a run directory")
        _check_range(where, "max_samples", self.max_samples, ge=1)


COMMANDS: dict[str, type[_Config]] = {
    "sft": SFTConfig,
    "rm": RMConfig,
    "ppo": PPOConfig,
    "grpo": GRPOConfig,
    "sample": SampleConfig,
    "eval": EvalConfig,
    "demo": DemoConfig,
    "report": ReportConfig,
}
"""Command name → its config class."""

AnyConfig = (
    SFTConfig | RMConfig | PPOConfig | GRPOConfig | SampleConfig | EvalConfig | DemoConfig | ReportConfig
)


def config_class(command: str) -> type[_Config]:
    """The config class of `command`; ConfigError (with the closest command) when there is no such command."""
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"unknown command '{command}'{hint} (commands: {', '.join(COMMANDS)})")
    return COMMANDS[command]


# ---------------------------------------------------------------------------------------------------------------
# YAML in and out, and the one way a config is assembled: defaults < YAML < command line.
# ---------------------------------------------------------------------------------------------------------------


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_to_plain(item) for item in value]
    return value


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain YAML/JSON data: nested configs as mappings, tuples as lists, in field order."""
    return _to_plain(cfg)


def config_to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text that `load_config(<command>, file)` reads back into an equal config."""
    header = f"# rlhf {cfg.COMMAND}: resolved config (defaults < --config file < command line)\n"
    return header + yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True, width=110)


def read_yaml(cls: type[_Config], path: str | Path) -> dict[str, Any]:
    """The fields set in a YAML file, type-checked and converted; cross-field checks wait for the final config.

    Raises ConfigError naming the file: missing file, invalid YAML (with its line), not a mapping, an unknown
    key (with the closest valid one) or a value of the wrong type (with the expected type).
    """
    path = Path(path)
    where = f"{cls.COMMAND}: {path}: "
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
            f"{where}expected a mapping of field: value at the top level, got {type(data).__name__}"
        )
    with _checks_deferred():
        return _values_from_mapping(cls, data, where)


def config_from_dict(command: str, values: Mapping[str, Any]) -> Any:
    """A checked config of `command` from plain data (as in a YAML file): the Python form of load_config."""
    cls = config_class(command)
    with _checks_deferred():
        converted = _values_from_mapping(cls, values, f"{command}: ")
    return cls(**{name: MISSING for name in _required_fields(cls)} | converted)


def _mentions(args: Sequence[str], name: str) -> bool:
    """Whether the command-line `args` set field `name` (as --name or --name=…, dashes or underscores)."""
    return any(arg.startswith("--") and arg[2:].split("=", 1)[0].replace("-", "_") == name for arg in args)


def _description(cls: type[_Config]) -> str:
    summary = " ".join((cls.__doc__ or "").split())
    return (
        f"{summary}\n\nUsage: rlhf {cls.COMMAND} --config FILE.yaml [--<field> <value> ...]. "
        "Each field below can be set in the YAML file or with its flag; the flag wins. "
        "The defaults shown include the file's values."
    )


def load_config(command: str, path: str | Path | None = None, overrides: Sequence[str] = ()) -> Any:
    """The checked config of `command`: dataclass defaults < YAML file `path` < command-line `overrides`.

    `overrides` are flags as typed on the command line, e.g. ``["--steps", "10", "--no-progress"]``; every
    check runs once, on the merged result. Raises ConfigError for a bad file, a missing required field or an
    impossible value or combination. A malformed flag is reported by tyro, which exits with SystemExit(2)
    (``--help`` exits with 0 after printing the help).
    """
    cls = config_class(command)
    overrides = list(overrides)
    values = read_yaml(cls, path) if path is not None else {}
    wants_help = any(arg in ("-h", "--help") for arg in overrides)
    required = _required_fields(cls)
    missing = [name for name in required if name not in values and not _mentions(overrides, name)]
    if missing and not wants_help:
        flags = " ".join(f"--{name} …" for name in missing)
        raise ConfigError(
            f"{command}: missing required field{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
            f"set {'them' if len(missing) > 1 else 'it'} in the --config YAML file or pass {flags}"
        )
    with _checks_deferred():
        default = cls(**{name: MISSING for name in required} | values)
        parsed = tyro.cli(
            cls,
            default=default,
            args=overrides,
            prog=f"rlhf {command}",
            description=_description(cls),
            use_underscores=True,
        )
    return dataclasses.replace(parsed)  # constructs once more with checks on: the merged config is validated
