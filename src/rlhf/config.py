"""One frozen, typed config per command, built from shared sections — what ``rlhf <command>`` accepts.

| command  | class          | runs                                              |
|----------|----------------|---------------------------------------------------|
| `sft`    | `SFTConfig`    | supervised fine-tuning                            |
| `rm`     | `RMConfig`     | Bradley–Terry reward model                        |
| `dpo`    | `DPOConfig`    | DPO, cDPO, robust DPO, IPO, SimPO                 |
| `ppo`    | `PPOConfig`    | PPO with a critic                                 |
| `grpo`   | `GRPOConfig`   | GRPO / Dr. GRPO / RLOO / REINFORCE++              |
| `sample` | `SampleConfig` | candidates, pairs, judged preferences, best-of-N  |
| `eval`   | `EvalConfig`   | held-out rewards; win rate vs a baseline          |
| `demo`   | `DemoConfig`   | a tiny end-to-end run                             |
| `report` | `ReportConfig` | an HTML report of a run                           |
| `label`  | `LabelConfig`  | label pairs in the browser or by an LLM; stats    |

A config is nested the way its YAML is: ``model``, ``data``, ``sampling``, ``reward``, ``kl``, ``optim``,
``batch`` and ``run`` are section types that every command needing them shares, and each trainer has one
section of its own (``ppo:``, ``grpo:``, ``sft:``, ``rm:``). On the command line a field is ``--section.field``.

Values are resolved in one order: defaults < the ``--config`` YAML file < command-line flags (`load_config`).
pydantic checks every field's type and range when a section is built (the field docstrings are the
``--help`` text, which tyro reads); the command's ``_check`` then checks every rule that spans fields, once,
on the merged config. Every refusal is a `ConfigError` naming the field's path, the value and what is
allowed. The flat keys of version 0.1 (``learning_rate``, ``kl_coef``, …) are still read, with a
`FutureWarning` naming the new key (`FLAT_KEYS`).

Batch sizes are global (all ranks together); trainers split them over ``torchrun`` ranks.

This module must stay light: no torch, no transformers (``import rlhf.cli`` is checked not to load torch).
"""

import contextlib
import contextvars
import dataclasses
import difflib
import functools
import urllib.parse
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NoReturn

import pydantic
import pydantic_core
import tyro
import yaml
from pydantic import AfterValidator, BeforeValidator, Field
from tyro.constructors import PrimitiveConstructorSpec

from rlhf.core.choices import (
    DPOLoss,
    GroupEstimator,
    KLControl,
    KLEstimator,
    KLPlacement,
    LossAggregation,
    MissingEosPenalty,
    ScoreConvention,
)

__all__ = [
    "COMMANDS",
    "FLAT_KEYS",
    "ConfigError",
    "DemoConfig",
    "DoctorConfig",
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
    "flat_config",
    "load_config",
    "read_yaml",
]


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
        nargs=1, metavar=metavar, instance_from_str=lambda args: parse(args[0]),
        is_instance=is_instance, str_from_instance=to_str,
    )  # fmt: skip


def _is_null(text: str) -> bool:
    return text.strip() in ("None", "null", "none", "~", "")


# ---------------------------------------------------------------------------------------------------------------
# LoRA adapters and reward sources.
# ---------------------------------------------------------------------------------------------------------------


@section
class LoRAConfig(_Section):
    """LoRA adapters (peft) instead of full fine-tuning. YAML: a mapping under ``model.lora``."""

    r: Count = 8
    """Rank of the adapter matrices."""
    alpha: Positive = 16.0
    """Scaling numerator: the adapter's update is multiplied by alpha / r."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    """Dropout on the adapter input, in [0, 1)."""
    target_modules: Annotated[tuple[Text, ...], Field(min_length=1)] | None = None
    """Module names to adapt; None = peft's default for the architecture, or every linear layer of the decoder (not the output head) where peft has none (e.g. Phi-3); ['all-linear'] = every linear layer except the output head. Names that match no module are refused, listing the model's linear layers."""


def _lora_from_text(text: str) -> LoRAConfig | None:
    if _is_null(text):
        return None
    value = _yaml_flag(text, "--model.lora")
    if not isinstance(value, Mapping):
        raise ValueError(f"--model.lora: expected a mapping like '{{r: 16, alpha: 32}}' or null, got {text!r}")
    return _validate(LoRAConfig, value, "--model.lora: ")


OptionalLoRA = Annotated[
    LoRAConfig | None,
    _flag("None|{r,alpha,dropout,target_modules}", _lora_from_text, lambda v: v is None or isinstance(v, LoRAConfig)),
]


def _default_reward_name(source: str) -> str:
    """A short, readable name for a reward source (used for the `reward/<name>/mean` metric)."""
    text = source.strip().rstrip("/")
    if text.startswith(("http://", "https://")):
        return urllib.parse.urlsplit(text).hostname or text
    if ":" in text:  # path/file.py:function or package.module:function
        return text.rsplit(":", 1)[1]
    return Path(text).name or text


def _source(text: str) -> str:
    if text.strip().endswith(".py"):
        raise ValueError(f"names a file but no function; write '{text}:function_name'")
    return text


Source = Annotated[Text, AfterValidator(_source)]


@section
class RewardSpec(_Section):
    """One entry of a reward list: a source, its weight in the combination, and the name it is logged under."""

    source: Source
    """A reward-model directory, `path/file.py:function`, `package.module:function` or an http(s):// URL."""
    weight: float = 1.0
    """Weight of this reward in the combination."""
    name: Text | None = None
    """Metric name (`reward/<name>/mean`); null = derived from the source (function name, directory name or host)."""

    def __post_init__(self) -> None:
        if self.name is None:
            object.__setattr__(self, "name", _default_reward_name(self.source))


def _reward_shape(value: Any) -> Any:
    """A list entry may be a source string alone; anything but a string or a list is refused here."""
    if isinstance(value, list | tuple):
        return tuple({"source": item} if isinstance(item, str) else item for item in value)
    if not isinstance(value, str):
        raise ValueError("expected a source string or a list of {source, weight, name}")
    return value


def _sources_from_text(text: str) -> Any:
    if not text.lstrip().startswith(("[", "{")):
        return text
    value = _yaml_flag(text, "reward source")
    return _validate(RewardSources, [value] if isinstance(value, Mapping) else value, "reward source: ")


RewardSources = Annotated[
    Source | tuple[RewardSpec, ...], BeforeValidator(_reward_shape),
    _flag("SOURCE|[{source,weight,name},...]", _sources_from_text, lambda v: isinstance(v, str | tuple)),
]  # fmt: skip
OptionalRewardSources = Annotated[
    RewardSources | None,
    _flag("SOURCE|[{source,weight,name},...]|None", lambda t: None if _is_null(t) else _sources_from_text(t),
          lambda v: v is None or isinstance(v, str | tuple)),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Sections shared by the commands. A section whose defaults differ between commands gets them from the
# command's field (`_defaults`); YAML then overrides single keys of those defaults, not the whole section.
# ---------------------------------------------------------------------------------------------------------------


@section
class ModelSection(_Section):
    """The model a command loads."""

    name: Text
    """A hub id or a local model directory."""
    dtype: DType = "float32"
    """Parameter and compute dtype."""


@section
class TrainModel(ModelSection):
    """The model a trainer starts from, trained whole or through LoRA adapters."""

    lora: OptionalLoRA = None
    """LoRA adapters instead of full fine-tuning: a mapping {r, alpha, dropout, target_modules} (on the command line as YAML, e.g. --model.lora '{r: 16, alpha: 32}'); None = full fine-tuning."""


@section
class PolicyModel(TrainModel):
    """The policy of ppo and grpo; the reference starts as a frozen copy of it."""

    reference_dtype: DType | None = None
    """dtype of the frozen reference copy; None = dtype. bfloat16 halves the copy's memory; its log-probs then differ from float32's by about 0.01 nats per token (python benchmarks/reference_precision.py measures it), and CPUs without bf16 units run it several times slower. Not with lora: the reference is then the policy's own base weights, no copy."""

    def __post_init__(self) -> None:
        if self.reference_dtype is not None and self.lora is not None:
            raise ValueError(
                "reference_dtype: with lora the reference is the policy's own base weights (the adapter switched "
                "off), not a copy, so it has no dtype of its own; drop reference_dtype or lora"
            )

    compile: bool = False
    """torch.compile the transformer blocks of the policy, reference and critic: on the 2-core CPU benchmark the updates ran 9-10% faster (a PPO step 4-10%), after a one-time compile of 8-10 s with inductor's cache warm and about 35 s cold; it pays in runs of a few hundred steps. Needs a C++ compiler on CPU."""


@section
class DataSection(_Section):
    """Training and held-out data: a JSONL, JSON or Parquet file, or a `datasets` directory."""

    train: Text
    """Training data: a file or directory of the command's records (prompts; prompt/response; chosen/rejected pairs)."""
    eval: Text | None = None
    """Held-out data in the same format as train; None = no evaluation."""


@section
class TextData(DataSection):
    """Training and held-out examples, each prompt + response."""

    max_length: Annotated[int, Field(ge=2)] = 1024
    """Longest prompt + response in tokens."""


@section
class SamplingSection(_Section):
    """How responses are generated."""

    max_prompt_length: Count = 512
    """Longest prompt in tokens; longer prompts keep their end."""
    max_new_tokens: Count = 128
    """Longest response in tokens; responses end at the stop token or here."""
    temperature: Positive = 1.0
    """Sampling temperature (log-probabilities for a loss use the same temperature); 1.0 samples the model as is."""
    top_k: NonNegativeInt = 0
    """Sample only from the k most likely tokens; 0 = off."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling: sample from the smallest set of tokens with this much probability; 1.0 = off."""
    stop: Annotated[str, Field(min_length=1)] = "eos"
    """What ends a response: 'eos' (the tokenizer's end-of-sequence token) or a literal text such as '\\n'."""


@section
class JudgeSection(_Section):
    """A reward source that scores or compares responses, and how a list of them is combined."""

    source: OptionalRewardSources = None
    """A reward-model directory, file.py:function, module:function, URL, or a list of {source, weight, name} (on the command line as YAML); None = none."""
    aggregation: RewardAggregation = "sum"
    """How a list is combined: weighted sum, or gdpo (normalise each reward, sum, normalise the sum)."""


@section
class BestOfSection(JudgeSection):
    """Best-of-N sampling: n answers per prompt, of which the one this source scores highest is kept."""

    n: Count = 1
    """Answers sampled per prompt; the source's highest-scored one becomes the model's answer (ties, and all unscored: the earliest sample); 1 = one sample. Sampling and selection cost n times one sample."""
    source: OptionalRewardSources = None
    """Picks the best of n: a reward-model directory, file.py:function, module:function, URL or a list of {source, weight, name}; None = reward.source."""


LLM_JUDGE_PREFIX = "openai:"


def llm_judge(source: Any) -> tuple[str, str] | None:
    """(chat-completions URL, model) of an LLM judge source ``openai:URL#MODEL``; None for any other source.

    URL is the API's base (``http://host:8000/v1``; ``/chat/completions`` is added) or the full endpoint.
    """
    if not isinstance(source, str) or not source.startswith(LLM_JUDGE_PREFIX):
        return None
    url, _, model = source[len(LLM_JUDGE_PREFIX):].partition("#")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not model.strip():
        raise ConfigError(
            f"LLM judge {source!r} must look like openai:http://host:port/v1#model-name (an OpenAI-compatible "
            "chat-completions server and the model it serves)"
        )
    url = url.rstrip("/")
    return (url if url.endswith("/chat/completions") else url + "/chat/completions"), model.strip()


@section
class LLMJudgeSection(_Section):
    """How an LLM judge (a judge source openai:URL#MODEL) is asked, over any OpenAI-compatible chat-completions API."""

    template: Text | None = None
    """A text file with the judge's prompt, holding {prompt}, {answer_a} and {answer_b}, asking for A, B or tie; None = the built-in template (docs/labelling.md)."""
    system: str | None = None
    """The system message; None = the built-in one (an impartial judge)."""
    api_key_env: Text = "OPENAI_API_KEY"
    """Environment variable holding the API key (sent as a Bearer token); unset = no key (a local server)."""
    both_orders: bool = True
    """Ask with the answers in both orders and record a tie when the verdicts disagree (controls position bias)."""
    timeout: Positive = 60.0
    """Seconds to wait for each reply."""
    tries: Count = 4
    """Attempts per request: timeouts, refused connections, 408/429/5xx and unreadable replies are retried."""
    backoff: NonNegative = 1.0
    """Seconds before the second try, doubled before each further one."""
    concurrency: Count = 4
    """Requests in flight at once."""
    max_tokens: Count = 16
    """Longest reply in tokens (the verdict is one word)."""
    temperature: NonNegative = 0.0
    """Sampling temperature of the judge."""
    cache: Text | None = None
    """JSONL file of the judge's verdicts, appended as they arrive, so an interrupted run resumes without asking twice; None = <output>.judge-cache.jsonl."""


@section
class SampleJudgeSection(JudgeSection):
    """A judge of sampled answers: a reward source that scores each one, or an LLM that compares two (openai:URL#MODEL)."""

    source: OptionalRewardSources = None
    """A reward-model directory, file.py:function, module:function, URL or a list of {source, weight, name} that scores each answer; or openai:URL#MODEL, an LLM over an OpenAI-compatible API that compares two; None = none."""
    llm: LLMJudgeSection = _defaults(LLMJudgeSection)
    """How the LLM judge is asked (source openai:URL#MODEL only)."""


@section
class RewardSection(_Section):
    """The reward: one source or a weighted list, and how a list is combined."""

    source: RewardSources
    """A reward-model directory, file.py:function, module:function, URL, or a list of {source, weight, name} (on the command line as YAML, e.g. --reward.source '[{source: rewards.py:f, weight: 2}]')."""
    aggregation: RewardAggregation = "sum"
    """How a list is combined: weighted sum, or gdpo (normalise each reward, sum, normalise the sum)."""


@section
class PolicyReward(RewardSection):
    """The reward of ppo and grpo, with the penalty for a response that never stops."""

    missing_eos_penalty: NonNegative | None = None
    """Penalty (≥ 0) for a response that hits max_new_tokens without the stop token; None = none."""
    missing_eos_mode: MissingEosPenalty = MissingEosPenalty.REPLACE
    """How the penalty applies: replace (score := −penalty) or subtract (score −= penalty)."""


@section
class KLSection(_Section):
    """The KL penalty against the frozen reference policy."""

    coef: NonNegative = 0.05
    """β, the weight of the penalty (the initial value when adaptive); 0 turns it off (no reference model)."""
    estimator: KLEstimator = KLEstimator.K1
    """Per-token estimator: k1 = log π − log π_ref, k2 = ½(log r)², k3 = (r − 1) − log r with r = π_ref/π."""
    add_to: KLPlacement = KLPlacement.REWARD
    """Where the penalty goes: into the per-token rewards (−β·KL with the estimator), or added to the loss (+β·k3, whatever the estimator: k3 is the one whose value is non-negative per token)."""
    control: KLControl = KLControl.FIXED
    """fixed β, or adaptive: β ← β·(1 + clip(KL/target − 1, ±0.2)·batch/horizon) after each iteration."""
    target: Positive = 6.0
    """Target KL (nats per sequence) of the adaptive controller."""
    horizon: Count = 10000
    """Horizon (in sequences) of the adaptive controller."""
    reference_ema: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Move the reference towards the policy after each iteration: θ_ref ← d·θ_ref + (1 − d)·θ with d = reference_ema (0.9: the reference lags about ten iterations). The penalty then limits how fast the policy moves rather than how far it may go from the SFT model (Xu et al. 2024). None = the frozen SFT model (default: docs/ppo_study.md measures both). Needs a reference copy: not with model.lora or kl.coef 0."""


@section
class OptimSection(_Section):
    """AdamW and its learning-rate schedule."""

    learning_rate: Positive = 1e-5
    """Peak learning rate."""
    scheduler: LRScheduler = "linear"
    """Schedule after warm-up: constant, linear decay to 0, or cosine decay to 0."""
    warmup_steps: NonNegativeInt = 0
    """Optimizer steps of linear warm-up from 0 to learning_rate."""
    weight_decay: NonNegative = 0.0
    """Decoupled weight decay."""
    max_grad_norm: Positive | None = 1.0
    """Clip the global gradient norm to this value; None = no clipping (the norm is still logged)."""


@section
class BatchSection(_Section):
    """How many examples make an optimizer step, and how many go through one forward/backward pass."""

    size: Count = 32
    """Examples per optimizer step, over all ranks."""
    micro_size: Count | None = None
    """Sequences per forward/backward pass (gradient accumulation when smaller than the batch); must divide it. None = the whole batch in one pass."""


@section
class PolicyBatch(BatchSection):
    """The rollout batch of ppo and grpo, and how it is cut for the updates."""

    size: Count = 64
    """Prompts per iteration, over all ranks (grpo samples each group_size times)."""
    micro_size: Count | None = None
    """Sequences per forward/backward pass (gradient accumulation); must divide the minibatch (the iteration's sequences / num_minibatches). None = the whole minibatch in one pass."""
    micro_tokens: Count | None = None
    """Token budget of a forward/backward pass: each minibatch's sequences, longest first, are cut into micro-batches of at most this many tokens when padded to their own longest sequence (with micro_size, both limits hold). Bounds activation memory by tokens rather than sequences and cuts padding between sequences of unequal length. None = no budget."""


@section
class DoctorSection(_Section):
    """Live alarms: the training doctor's rules read every logged step (README "Training doctor")."""

    alarms: bool = True
    """Say each finding once when it starts and when it clears (console, and output_dir/doctor.jsonl), and show what holds under the progress bar."""
    stop_on: Literal["never", "warning", "critical"] = "never"
    """Stop the run at the step where a finding at least this severe starts: a checkpoint is saved and final/ holds the policy of that step (resume with --doctor.stop_on never to go on)."""


@section
class RunSection(_Section):
    """Seeding, logging, checkpoints, resuming and how torchrun ranks share the work."""

    seed: NonNegativeInt = 0
    """Seed for every random number generator (data order, dropout, sampling)."""
    eval_every: NonNegativeInt = 100
    """Evaluate every this many optimizer steps (iterations for ppo/grpo), before training and at the end; 0 = only then."""
    save_every: NonNegativeInt = 500
    """Write a resumable checkpoint every this many optimizer steps (iterations for ppo/grpo); 0 = only the final model."""
    log_every: Count = 1
    """Log metrics every this many steps."""
    report_to: tuple[Sink, ...] = ("jsonl",)
    """Metric sinks; jsonl writes output_dir/metrics.jsonl."""
    name: Text | None = None
    """Run name for tensorboard / wandb / trackio; None = the name of output_dir."""
    resume: bool = False
    """Continue the run in output_dir from its newest checkpoint that loads. The config must match the run's config.yaml except the fields listed in rlhf.runlog.rundir.SAFE_ON_RESUME (steps, epochs, logging, checkpoints, micro-batching, compile, parallelism; a changed steps/epochs re-times the learning-rate schedule from the resume point); any other difference is refused, listing each field. Without a checkpoint the run starts afresh (refused if it finished with a final/)."""
    overwrite: bool = False
    """Replace the run already in output_dir: its config.yaml, metrics.jsonl, samples/, checkpoints/, final/ and tensorboard/ are deleted once the new run has loaded its models (other files there are left alone). Without resume or overwrite, a non-empty run directory is refused."""
    progress: bool = True
    """Show a progress bar on the console."""
    parallelism: Parallelism = "auto"
    """How the ranks of a torchrun launch share the work (batch sizes stay global): ddp = every rank holds the models and trains on its share of each batch, gradients are averaged; fsdp = FSDP2, parameters, gradients and optimizer state sharded per decoder layer; auto = ddp under torchrun, one process otherwise; none = refuse torchrun."""


# ---------------------------------------------------------------------------------------------------------------
# The trainers' own sections.
# ---------------------------------------------------------------------------------------------------------------


@section
class SFTSection(_Section):
    """Supervised fine-tuning on demonstrations."""

    epochs: Count = 3
    """Passes over the training data."""
    packing: bool = False
    """Concatenate each micro-batch's examples into rows of up to max_length tokens instead of padding each one; position ids restart and attention stays within every example, so the loss and gradient are those of the unpacked batch (models that cannot keep packed examples apart are refused)."""


@section
class RMSection(_Section):
    """The Bradley–Terry reward model."""

    epochs: Count = 1
    """Passes over the training data (reward models overfit after about one epoch)."""
    use_margin: bool = True
    """When a pair has a "margin" column, subtract it inside the sigmoid: −log σ(r_c − r_r − margin)."""
    center_rewards_coefficient: NonNegative | None = None
    """Weight of the auxiliary loss coef·mean((r_c + r_r)²) that keeps rewards centred at 0; None = off."""


@section
class DPOSection(_Section):
    """Direct preference optimisation: the loss and its strength (formulas in docs/dpo.md)."""

    epochs: Count = 1
    """Passes over the training pairs."""
    loss: DPOLoss = DPOLoss.SIGMOID
    """sigmoid (DPO; with label_smoothing > 0 conservative DPO), robust (unbiased under label noise), ipo (squared loss on length-normalised log-ratios) or simpo (reference-free, length-normalised, margin simpo_gamma)."""
    beta: Positive = 0.1
    """β: how far from the reference the policy may move (larger = closer); SimPO is usually run with β ≈ 2."""
    label_smoothing: Annotated[float, Field(ge=0, lt=0.5)] = 0.0
    """ε, the assumed share of flipped labels (sigmoid: conservative DPO; robust: its noise rate); 0 = none."""
    simpo_gamma: NonNegative = 0.5
    """γ, SimPO's target margin between the length-normalised rewards (loss simpo only)."""


@section
class NormalizeSection(_Section):
    """Reward normalisation after training: gain and bias so the policy's responses score mean 0, std 1."""

    policy: Text | None = None
    """Causal LM (hub id or directory; usually the SFT/reference policy) whose responses are sampled and scored; the gain and bias are stored with the model for every consumer. None = no normalisation."""
    prompts: Text | None = None
    """Prompts file ({"prompt"} or {"messages"} rows) to sample the responses for; None = the prompts of the training data."""
    samples: Annotated[int, Field(ge=2)] = 256
    """How many responses are sampled and scored (OAI: 256; a std needs two)."""
    max_new_tokens: Count = 64
    """Longest response in tokens."""
    temperature: Positive = 1.0
    """Sampling temperature of the responses."""


@section
class PolicyGradientSection(_Section):
    """The outer loop and the clipped surrogate shared by ppo and grpo."""

    steps: Count = 500
    """Outer iterations: sample a batch, score it, update the policy."""
    num_minibatches: Count = 1
    """Minibatches per pass over a batch, one optimizer step each; must divide the iteration's sequences."""
    clip_range: Annotated[float, Field(gt=0, lt=1)] = 0.2
    """ε of the clipped surrogate: the ratio is clipped to [1 − ε, 1 + clip_range_high]."""
    clip_range_high: Positive | None = None
    """Upper clip ε_high (DAPO clip-higher, e.g. 0.28); None = clip_range."""
    entropy_coef: NonNegative = 0.0
    """Weight of the entropy bonus subtracted from the loss."""
    whiten_advantages: bool = True
    """Normalise advantages to mean 0 and variance 1 over the batch's response tokens (grpo: again, after the group-relative ones)."""
    warmup_pg_steps: NonNegativeInt = 0
    """Vanilla policy-gradient warm-up: the first N steps use the unclipped loss −A·ratio (REINFORCE with the advantages' baseline; same rollouts, advantages, KL and logging), then the clipped surrogate takes over; 0 = clipped from the start. Logged as policy/clipped (0 or 1)."""


@section
class PPOSection(PolicyGradientSection):
    """PPO with a learned critic: GAE advantages, clipped policy and value losses."""

    epochs: Count = 4
    """Passes over each rollout batch."""
    whiten_rewards: bool = False
    """Rescale the per-token rewards of the batch to unit variance (mean kept) before GAE."""
    critic: Critic = "auto"
    """Value function: a zero-initialised head on the policy's trunk (shared: one forward gives log-probs and values, no second model), or a separate model (separate: initialised from the reward model when the reward is a model that reads the policy's tokens, else from the policy); auto = separate when such a reward model can start it, else shared. Over 10 runs of the demo (docs/ppo_study.md) the critic started from the reward model gave a higher gold score at a lower KL than the shared head, which starts knowing nothing; it costs a second model's memory and its forward and backward in every update."""
    vf_coef: Positive = 0.1
    """Weight of the value loss in the total loss (the critic only learns through it)."""
    critic_warmup_steps: NonNegativeInt = 0
    """Value-only iterations before the policy moves (OpenRLHF's freezing_actor_steps, verl's critic_warmup): the first N steps sample, score and fit the value function (the shared head, or the separate critic) on their rollouts while the policy's parameters are held, so the policy's first updates get advantages from a critic that has learnt something. Logged as policy/frozen (1, then 0); 0 = the policy trains from the first step."""
    value_clip_range: Positive = 0.2
    """ε_v: new values are clipped to old ± ε_v in the value loss."""
    gamma: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Discount γ of GAE."""
    lam: Annotated[float, Field(ge=0, le=1)] = 0.95
    """λ of GAE."""
    score_position: ScoreConvention = ScoreConvention.AFTER_EOS
    """Token that receives the sequence score: after_eos = the first padding after the EOS when there is room (TRL / N+ convention), else the last token; eos = the EOS (last real) token."""


@section
class GRPOSection(PolicyGradientSection):
    """The critic-free GRPO family: group-relative advantages, DAPO's overlong shaping and dynamic sampling."""

    group_size: Annotated[int, Field(ge=2)] = 8
    """G, samples per prompt (≥ 2: advantages compare samples of the same prompt)."""
    estimator: GroupEstimator = GroupEstimator.GRPO
    """Advantage estimator: grpo (r − group mean, / group std), dr_grpo (r − group mean), rloo (leave-one-out baseline), reinforce_pp (r − group mean, / batch std)."""
    scale_rewards: Literal["auto", "group", "batch", "none"] = "auto"
    """Divisor of grpo's advantages: group std, batch std or none; auto = the estimator's own. Other estimators fix their own scaling, so only 'auto' is allowed with them."""
    loss_aggregation: LossAggregation = LossAggregation.TOKEN_MEAN
    """Reduction of the per-token loss: token-mean (all tokens of the batch), seq-mean-token-mean (GRPO paper), seq-mean-token-sum, seq-mean-token-sum-norm (Dr. GRPO: sum / max_new_tokens)."""
    num_iterations: Count = 1
    """μ, passes over each sampled batch (1 = on-policy: the ratio is exactly 1 and clipping never applies)."""
    overlong_buffer: NonNegativeInt = 0
    """DAPO overlong shaping: responses longer than max_new_tokens − overlong_buffer get a penalty growing linearly to −overlong_penalty_factor at max_new_tokens; 0 = off."""
    overlong_penalty_factor: NonNegative = 1.0
    """Largest overlong penalty (reached at max_new_tokens)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal (no signal) and sample more prompts until the batch is full."""
    mask_truncated_completions: bool = False
    """Leave completions cut at max_new_tokens (no stop token) out of the loss (DAPO); they still count in the group statistics."""


# ---------------------------------------------------------------------------------------------------------------
# Rules that span fields, checked once on the final config. Each raises ConfigError naming the fields.
# ---------------------------------------------------------------------------------------------------------------


def _divisors(n: int) -> str:
    found = [d for d in range(1, n + 1) if n % d == 0]
    return ", ".join(str(d) for d in found[:12]) + (", …" if len(found) > 12 else "")


def _check_divides(where: str, name: str, value: int | None, total: int, total_text: str) -> None:
    """`value` (field `name`; None = unset) must divide `total` (described by `total_text`)."""
    if value is not None and total % value != 0:
        raise ConfigError(
            f"{where}{name}={value} does not divide {total_text}; choose a divisor of {total} ({_divisors(total)})"
        )


def _check_sources(where: str, name: str, scorer: Any, pairwise: bool = False) -> None:
    """A reward list has unique names; gdpo needs a list; an LLM judge only where pairs are compared."""
    if scorer.source is None:
        return
    sources = [scorer.source] if isinstance(scorer.source, str) else [spec.source for spec in scorer.source]
    for source in sources:
        try:
            is_llm = llm_judge(source) is not None
        except ConfigError as error:
            raise ConfigError(f"{where}{name}.source: {error}") from None
        if is_llm and (not pairwise or not isinstance(scorer.source, str)):
            raise ConfigError(
                f"{where}{name}.source={source!r} is an LLM judge, which compares two answers; "
                + ("give it alone, not in a list" if pairwise else "here each answer needs a score of its own: use "
                   "it with `rlhf sample --mode preferences` or `rlhf label --judge.source`")
            )
    if isinstance(scorer.source, str):
        if scorer.aggregation == "gdpo":
            raise ConfigError(
                f"{where}{name}.aggregation='gdpo' combines several rewards but {name}.source is a single "
                f"source; give {name}.source as a list of {{source, weight, name}} or use aggregation='sum'"
            )
        return
    if not scorer.source:
        raise ConfigError(f"{where}{name}.source is an empty list; give at least one {{source, weight, name}}")
    seen: dict[str, int] = {}
    for i, spec in enumerate(scorer.source):
        if spec.name in seen:
            raise ConfigError(
                f"{where}{name}.source[{i}].name={spec.name!r} is already used by {name}.source[{seen[spec.name]}]; "
                "give each reward a distinct `name`"
            )
        seen[spec.name] = i


# ---------------------------------------------------------------------------------------------------------------
# Command configs.
# ---------------------------------------------------------------------------------------------------------------


@section
class _Config(_Section):
    """Base of every command config: after pydantic's field checks, `_check` runs the cross-field rules."""

    COMMAND: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if not _DEFER_CHECKS.get():
            self._check(f"{self.COMMAND}: ")

    def _check(self, where: str) -> None:
        """Rules that span fields; `where` prefixes every message."""


@section
class _TrainingConfig(_Config):
    """Sections shared by the four training commands (sft, rm, ppo, grpo)."""

    output_dir: Text
    """Run directory: config.yaml, metrics.jsonl, samples/, checkpoints/ and final/ are written here."""
    model: TrainModel
    """The model to start from."""
    data: DataSection
    """Training and held-out data."""
    optim: OptimSection = _defaults(OptimSection)
    """AdamW and its schedule."""
    batch: BatchSection = _defaults(BatchSection)
    """Batch and micro-batch sizes."""
    run: RunSection = _defaults(RunSection)
    """Seed, logging, checkpoints, resuming, parallelism."""

    def _check(self, where: str) -> None:
        if self.run.resume and self.run.overwrite:
            raise ConfigError(
                f"{where}run.resume and run.overwrite are both set; resume continues the run in output_dir, "
                "overwrite replaces it — choose one"
            )
        _check_divides(where, "batch.micro_size", self.batch.micro_size, self.minibatch_size, self._minibatch_text)

    @property
    def minibatch_size(self) -> int:
        """Sequences per optimizer step."""
        return self.batch.size

    @property
    def _minibatch_text(self) -> str:
        return f"batch.size={self.batch.size}"

    @property
    def effective_micro_batch_size(self) -> int:
        """Sequences per forward/backward pass (batch.micro_size, or the whole minibatch when it is None)."""
        return self.batch.micro_size or self.minibatch_size

    @property
    def grad_accum_steps(self) -> int:
        """Forward/backward passes per optimizer step."""
        return self.minibatch_size // self.effective_micro_batch_size


@section
class SFTConfig(_TrainingConfig):
    """Supervised fine-tuning: next-token loss on the response (assistant) tokens only."""

    COMMAND: ClassVar[str] = "sft"

    data: TextData
    """Demonstrations ({"prompt", "response"} or {"messages"} rows)."""
    optim: OptimSection = _defaults(OptimSection, learning_rate=2e-5)
    """AdamW and its schedule."""
    sft: SFTSection = _defaults(SFTSection)
    """Epochs and packing."""


@section
class RMConfig(_TrainingConfig):
    """Bradley–Terry reward model on preference pairs: loss −log σ(r_chosen − r_rejected [− margin])."""

    COMMAND: ClassVar[str] = "rm"

    model: TrainModel
    """The model to start from (a causal LM gets a fresh one-output score head)."""
    data: TextData
    """Preference pairs ({"prompt", "chosen", "rejected"} rows; batch.size counts pairs)."""
    rm: RMSection = _defaults(RMSection)
    """Epochs, margin and centring."""
    normalize: NormalizeSection = _defaults(NormalizeSection)
    """Reward normalisation after training."""

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.normalize.prompts is not None and self.normalize.policy is None:
            raise ConfigError(
                f"{where}normalize.prompts is set but normalize.policy is None; set normalize.policy to the "
                "model whose responses the normalisation samples, or drop normalize.prompts"
            )


@section
class DPOConfig(_TrainingConfig):
    """Direct preference optimisation of a causal LM on preference pairs, against its own starting point as the reference: DPO, conservative DPO, robust DPO, IPO or SimPO."""

    COMMAND: ClassVar[str] = "dpo"

    model: TrainModel
    """The policy to train (usually the SFT model); its log-probs before training are the reference's."""
    data: TextData
    """Preference pairs ({"prompt", "chosen", "rejected"} rows, or a labels file of rlhf label; batch.size counts pairs)."""
    dpo: DPOSection = _defaults(DPOSection)
    """The loss."""

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.dpo.label_smoothing > 0 and self.dpo.loss == DPOLoss.IPO:
            raise ConfigError(
                f"{where}dpo.label_smoothing={self.dpo.label_smoothing} has no meaning for dpo.loss='ipo'; "
                "use loss sigmoid or robust for noisy labels, or set label_smoothing: 0"
            )


@section
class _PolicyGradientConfig(_TrainingConfig):
    """Sections shared by ppo and grpo: the policy, the reward, sampling, the KL penalty."""

    model: PolicyModel
    """The policy to train (usually the SFT model); the reference starts as a frozen copy of it."""
    data: DataSection
    """Prompts ({"prompt"} or {"messages"} rows; other keys are columns, passed to the reward); eval = held-out prompts sampled into output_dir/samples/."""
    reward: PolicyReward
    """The reward and the missing-EOS penalty."""
    sampling: SamplingSection = _defaults(SamplingSection, max_new_tokens=64, temperature=0.7)
    """Response generation."""
    kl: KLSection = _defaults(KLSection)
    """The KL penalty against the reference."""
    batch: PolicyBatch = _defaults(PolicyBatch)
    """Rollout batch and micro-batch sizes."""
    run: RunSection = _defaults(RunSection, eval_every=50, save_every=100)
    """Seed, logging, checkpoints, resuming, parallelism."""
    doctor: DoctorSection = _defaults(DoctorSection)
    """Live alarms of the training doctor, and whether a finding stops the run."""

    @property
    def algorithm(self) -> Any:
        """The command's own section (``ppo`` or ``grpo``)."""
        return getattr(self, self.COMMAND)

    @property
    def steps(self) -> int:
        """Outer iterations."""
        return self.algorithm.steps

    @property
    def clip_range_upper(self) -> float:
        """ε_high: clip_range_high, or clip_range when it is None."""
        high = self.algorithm.clip_range_high
        return self.algorithm.clip_range if high is None else high

    @property
    def num_sequences(self) -> int:
        """Sequences sampled per iteration."""
        return self.batch.size

    @property
    def minibatch_size(self) -> int:
        """Sequences per optimizer step: the iteration's sequences / num_minibatches."""
        return self.num_sequences // self.algorithm.num_minibatches

    def _check(self, where: str) -> None:
        _check_sources(where, "reward", self.reward)
        if self.kl.control == "adaptive" and self.kl.coef == 0:
            raise ConfigError(
                f"{where}kl.control='adaptive' scales kl.coef, which is 0 so it would stay 0; "
                "set kl.coef > 0 (e.g. 0.15) or use kl.control='fixed'"
            )
        if self.kl.reference_ema is not None and (self.kl.coef == 0 or self.model.lora is not None):
            why = "kl.coef is 0, so there is no reference" if self.kl.coef == 0 else (
                "with model.lora the reference is the policy's own base weights (the adapter switched off), not a copy")  # fmt: skip
            raise ConfigError(f"{where}kl.reference_ema moves the reference towards the policy, but {why}; "
                              "drop kl.reference_ema, or train without lora and with kl.coef > 0")  # fmt: skip
        name = f"{self.COMMAND}.num_minibatches"
        _check_divides(where, name, self.algorithm.num_minibatches, self.num_sequences, self._sequences_text)
        super()._check(where)

    @property
    def _sequences_text(self) -> str:
        return f"batch.size={self.batch.size}"

    @property
    def _minibatch_text(self) -> str:
        return f"the minibatch of {self.minibatch_size} sequences ({self._sequences_text} / " \
               f"{self.COMMAND}.num_minibatches={self.algorithm.num_minibatches})"  # fmt: skip


@section
class PPOConfig(_PolicyGradientConfig):
    """PPO with a learned critic: per-token KL-shaped rewards, GAE advantages, clipped policy and value losses."""

    COMMAND: ClassVar[str] = "ppo"

    optim: OptimSection = _defaults(OptimSection, learning_rate=3e-6)
    """AdamW and its schedule (policy and critic)."""
    ppo: PPOSection = _defaults(PPOSection)
    """Epochs, clipping, the critic and GAE."""


@section
class GRPOConfig(_PolicyGradientConfig):
    """The critic-free GRPO family: G samples per prompt, group-relative advantages (GRPO, Dr. GRPO, RLOO, REINFORCE++), the clipped per-token loss, optional DAPO overlong shaping and dynamic sampling."""

    COMMAND: ClassVar[str] = "grpo"

    optim: OptimSection = _defaults(OptimSection, learning_rate=1e-6)
    """AdamW and its schedule."""
    sampling: SamplingSection = _defaults(SamplingSection, max_new_tokens=256)
    """Response generation."""
    kl: KLSection = _defaults(KLSection, coef=0.0, estimator="k3", add_to="loss")
    """The KL penalty against the reference; coef 0 = no penalty and no reference model."""
    batch: PolicyBatch = _defaults(PolicyBatch, size=16)
    """Rollout batch (prompts; each sampled group_size times) and micro-batch sizes."""
    grpo: GRPOSection = _defaults(GRPOSection, whiten_advantages=False)
    """Group size, estimator, loss aggregation, DAPO options."""

    @property
    def num_sequences(self) -> int:
        """Sequences sampled per iteration: batch.size · grpo.group_size."""
        return self.batch.size * self.grpo.group_size

    @property
    def reward_scaling(self) -> str:
        """The advantage divisor actually used: 'group', 'batch' or 'none' (scale_rewards with 'auto' resolved)."""
        scale = self.grpo.scale_rewards
        return _ESTIMATOR_SCALING[self.grpo.estimator] if scale == "auto" else scale

    @property
    def _sequences_text(self) -> str:
        return f"the {self.num_sequences} sequences of an iteration (batch.size={self.batch.size} × " \
               f"grpo.group_size={self.grpo.group_size})"  # fmt: skip

    def _check(self, where: str) -> None:
        if self.grpo.estimator != "grpo" and self.grpo.scale_rewards != "auto":
            raise ConfigError(
                f"{where}grpo.scale_rewards={self.grpo.scale_rewards!r} applies to grpo.estimator='grpo' only; "
                f"estimator={str(self.grpo.estimator)!r} scales by {_ESTIMATOR_SCALING[self.grpo.estimator]!r} "
                "itself, so leave scale_rewards='auto'"
            )
        if self.grpo.overlong_buffer >= self.sampling.max_new_tokens:
            raise ConfigError(
                f"{where}grpo.overlong_buffer={self.grpo.overlong_buffer} must be below "
                f"sampling.max_new_tokens={self.sampling.max_new_tokens}"
            )
        super()._check(where)


@section
class SampleConfig(_Config):
    """Sample num_samples completions per prompt and write them as candidates, pairs for labelling, judge-labelled preferences (for `rlhf rm`) or best-of-N demonstrations (for `rlhf sft`)."""

    COMMAND: ClassVar[str] = "sample"

    model: ModelSection
    """The model to sample from."""
    prompts: Text
    """Prompts file ({"prompt"} or {"messages"} rows; other keys are columns, passed to the judge): JSONL, JSON, Parquet or a `datasets` directory."""
    output: Text
    """JSONL file to write; its rows depend on mode (candidates: {prompt, completions, [rewards]}; pairs: {prompt, a, b}; preferences: {prompt, chosen, rejected}; best_of_n: {prompt, response, reward})."""
    mode: Literal["candidates", "pairs", "preferences", "best_of_n"] = "candidates"
    """candidates: one row per prompt with its num_samples completions; pairs: completion pairs for human labelling; preferences: the judge's best and worst completion as chosen/rejected (prompts where they tie are skipped); best_of_n: the judge's best completion as an SFT demonstration (rejection-sampling fine-tuning)."""
    num_samples: Count = 4
    """k, completions sampled per prompt (≥ 2 for pairs and preferences)."""
    pairing: Literal["adjacent", "all"] = "adjacent"
    """mode='pairs', and preferences with an LLM judge: adjacent = samples (1, 2), (3, 4), … (each completion in one pair, k // 2 pairs); all = every one of the k·(k−1)/2 pairs."""
    judge: SampleJudgeSection = _defaults(SampleJudgeSection)
    """Scores the completions (needed by preferences and best_of_n, optional for candidates, not used by pairs), or compares them (an LLM judge, mode preferences: each pair of `pairing` in both orders)."""
    sampling: SamplingSection = _defaults(SamplingSection)
    """Completion generation."""
    batch_size: Count = 8
    """Prompts per generation call (each sampled num_samples times)."""
    seed: NonNegativeInt = 0
    """Seed of sampling: the same seed, model, prompts and batch_size write the same file."""
    summary: bool = False
    """Also write the run's counts, mean judge score and timings to <output>.summary.json (they always go to stderr)."""
    overwrite: bool = False
    """Replace output (and <output>.summary.json) if it exists; without it an existing file is refused before any sampling."""
    progress: bool = True
    """Show a progress bar on the console."""

    def _check(self, where: str) -> None:
        if self.mode in ("pairs", "preferences") and self.num_samples < 2:
            raise ConfigError(
                f"{where}num_samples={self.num_samples} is out of range; it must be ≥ 2 with mode='{self.mode}' "
                "(a pair needs two)"
            )
        if self.mode in ("preferences", "best_of_n") and self.judge.source is None:
            raise ConfigError(
                f"{where}mode='{self.mode}' needs a judge to rank the samples; set judge.source to a reward-model "
                "directory, file.py:function, module:function, URL or a list of {source, weight, name} "
                "(or use mode='pairs' to label pairs by hand)"
            )
        if self.mode == "pairs" and self.judge.source is not None:
            raise ConfigError(
                f"{where}judge is not used by mode='pairs' (pairs are written for human labelling); use "
                "mode='preferences' to let the judge pick chosen and rejected, or leave judge.source unset"
            )
        _check_sources(where, "judge", self.judge, pairwise=True)
        if llm_judge(self.judge.source) is not None and self.mode != "preferences":
            raise ConfigError(
                f"{where}judge.source={self.judge.source!r} is an LLM judge, which compares pairs: it labels "
                f"mode='preferences' only (mode='{self.mode}' needs a score per answer)"
            )


@section
class EvalConfig(_Config):
    """Generate on held-out prompts and score the completions with a reward; with a baseline, also the policy's win rate against it under a judge."""

    COMMAND: ClassVar[str] = "eval"

    model: ModelSection
    """The model to evaluate (e.g. a run's final/)."""
    eval_data: Text
    """Held-out prompts ({"prompt"} or {"messages"} rows; other keys are columns, passed to the reward)."""
    reward: RewardSection
    """Reported as reward/mean, reward/std and reward/<name>/mean."""
    baseline: Text | None = None
    """Model B to compare the policy with (a hub id or a directory), sampled on the same prompts with the same seed; None = no comparison."""
    judge: JudgeSection = _defaults(JudgeSection)
    """Decides each policy-vs-baseline comparison (higher score wins, equal scores tie); source None = the reward. Needs baseline."""
    reference: Text | None = None
    """Measure the KL of the policy's answers from this model (usually the one it was trained from; same tokenizer): kl/mean = the mean over answers of Σ_t log π(y_t) − log π_ref(y_t) at the sampling temperature; None = not measured."""
    best_of: BestOfSection = _defaults(BestOfSection)
    """Best-of-N: the policy's answer to a prompt is the best of best_of.n samples under best_of.source (the baseline still answers once)."""
    sampling: SamplingSection = _defaults(SamplingSection, temperature=0.7)
    """Completion generation."""
    output: Text | None = None
    """JSON file for the results; None = print them to stdout."""
    samples_output: Text | None = None
    """JSONL file with one row per prompt: its completion(s) and scores; None = not written."""
    max_prompts: Count | None = None
    """Evaluate only the first this many prompts; None = all."""
    batch_size: Count = 16
    """Prompts per generation call."""
    seed: NonNegativeInt = 0
    """Seed of sampling (the policy and the baseline each start from it): the same seed gives the same results."""
    overwrite: bool = False
    """Replace output and samples_output if they exist; without it an existing file is refused before any work."""
    progress: bool = True
    """Show a progress bar on the console."""

    def _check(self, where: str) -> None:
        _check_sources(where, "reward", self.reward)
        if self.judge.source is not None and self.baseline is None:
            raise ConfigError(
                f"{where}judge decides the win rate against baseline, which is not set; set baseline "
                "(model B) or leave judge.source unset"
            )
        _check_sources(where, "judge", self.judge)
        _check_sources(where, "best_of", self.best_of)
        if self.reference is not None and self.best_of.n > 1:
            raise ConfigError(
                f"{where}reference measures the KL of the policy's own samples, and a best-of-{self.best_of.n} "
                "answer is not one (its KL from the sampled model is at most log n − (n−1)/n, reported as "
                "kl/best_of_n_bound); drop reference or set best_of.n to 1"
            )
        if self.output is not None and self.output == self.samples_output:
            raise ConfigError(f"{where}output and samples_output are both {self.output!r}; give them different files")


@section
class DemoConfig(_Config):
    """The whole RLHF pipeline on a built-in advice task, offline: pretrain → SFT → sample → gold-judged pairs → reward model and DPO → PPO (and PPO without its KL penalty, to show what the penalty prevents) and GRPO → SFT, best-of-N, DPO, PPO and GRPO compared on the same held-out prompts under the gold judge → report.html."""

    COMMAND: ClassVar[str] = "demo"

    output_dir: Text = "runs/demo"
    """Directory for the demo: one run directory per stage, summary.json."""
    preset: Preset = "small"
    """Size of the demo (sizes in rlhf.demo.pipeline.PRESETS): tiny (seconds; a smoke test of every stage) or small (a few CPU minutes; every method beats SFT under the gold judge)."""
    steps: Count | None = None
    """Iterations of both PPO and GRPO; None = the preset's own."""
    seed: NonNegativeInt = 0
    """Seed for every random number generator."""
    overwrite: bool = False
    """Replace a demo already in output_dir (its stage directories, data/, summary.json and report.html; other files are left alone); without it such a directory is refused."""
    progress: bool = True
    """Show a progress bar on the console."""


@section
class ReportConfig(_Config):
    """A self-contained HTML report of a ppo/grpo run, or of an rlhf demo directory: training curves, reward against KL, held-out answers, the config. `rlhf report RUN_DIR` is short for --run_dir RUN_DIR."""

    COMMAND: ClassVar[str] = "report"

    run_dir: Text
    """The output_dir of a ppo or grpo run (config.yaml, metrics.jsonl, samples/), or of rlhf demo."""
    output: Text | None = None
    """Where to write the HTML file; None = RUN_DIR/report.html."""
    max_samples: Count = 12
    """Held-out prompts shown in the answers table."""


@section
class DoctorConfig(_Config):
    """The training doctor: replay its rules over a run's metrics (finished, crashed or running) and print a verdict — healthy, or each finding with its steps, evidence and the fix to try. Exit code 0 healthy, 1 warnings, 2 critical. `rlhf doctor RUN_DIR` is short for --run_dir RUN_DIR."""

    COMMAND: ClassVar[str] = "doctor"

    run_dir: Text
    """The output_dir of an sft, rm, dpo, ppo or grpo run (config.yaml, metrics.jsonl), or a directory of runs such as rlhf demo's."""
    json: bool = False
    """Print the verdict as JSON (status, exit_code, and per run its findings with steps, evidence and fix)."""


@section
class LabelConfig(_Config):
    """Label pairs: in the browser (a local web page, one or several people), or with an LLM judge; or print the statistics of labels files. `rlhf label PAIRS.jsonl --out PREFS.jsonl` is short for --pairs PAIRS.jsonl --out PREFS.jsonl."""

    COMMAND: ClassVar[str] = "label"

    pairs: Text | None = None
    """The pairs to label: what `rlhf sample` writes with mode pairs ({prompt, a, b}) or candidates ({prompt, completions}: every pair of them)."""
    out: Text | None = None
    """The labels file, appended to (a restart continues it): preference rows that `rlhf rm` trains on, plus ties, skips and undos."""
    stats: tuple[Text, ...] = ()
    """Instead of labelling: print the statistics of these labels files (counts per labeller, tie and skip rates, position bias, agreement)."""
    json: bool = False
    """With stats: print them as JSON."""
    host: Text = "127.0.0.1"
    """Address to listen on; anything but loopback (e.g. 0.0.0.0, for other machines) requires an access token."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8765
    """Port to listen on; 0 = any free one (the URL printed says which)."""
    token: str | None = None
    """Access token required on every request; None = $RLHF_LABEL_TOKEN, else generated when host is not loopback (and printed in the URL), else none."""
    labels_per_pair: Count = 1
    """How many different labellers decide each pair (agreement needs ≥ 2); a pair is never shown twice to one labeller."""
    lease_seconds: Positive = 600.0
    """How long a pair shown to a labeller is kept for them before another labeller may get it."""
    ratings: bool = True
    """Show the optional 👍 😐 👎 rating under each answer."""
    judge: SampleJudgeSection = _defaults(SampleJudgeSection)
    """Label the pairs with an LLM judge (source openai:URL#MODEL) instead of the web page."""

    def _check(self, where: str) -> None:
        if self.stats:
            if self.pairs is not None or self.judge.source is not None:
                raise ConfigError(f"{where}stats prints the statistics of labels files; leave pairs and judge.source unset")
            return
        if self.pairs is None or self.out is None:
            missing = " and ".join(name for name in ("pairs", "out") if getattr(self, name) is None)
            raise ConfigError(
                f"{where}{missing} not set: `rlhf label PAIRS.jsonl --out PREFS.jsonl` labels pairs, "
                "`rlhf label --stats PREFS.jsonl` prints statistics"
            )
        if self.judge.source is not None:
            _check_sources(where, "judge", self.judge, pairwise=True)
            if llm_judge(self.judge.source) is None:
                raise ConfigError(
                    f"{where}judge.source={self.judge.source!r}: labelling pairs takes an LLM judge "
                    "(openai:URL#MODEL); to rank answers with a reward model use `rlhf sample --mode preferences`"
                )


COMMANDS: dict[str, type[_Config]] = {
    "sft": SFTConfig, "rm": RMConfig, "dpo": DPOConfig, "ppo": PPOConfig, "grpo": GRPOConfig,
    "sample": SampleConfig, "eval": EvalConfig, "demo": DemoConfig, "report": ReportConfig, "label": LabelConfig,
    "doctor": DoctorConfig,
}  # fmt: skip
"""Command name → its config class."""


def config_class(command: str) -> type[_Config]:
    """The config class of `command`; ConfigError (with the closest command) when there is no such command."""
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"unknown command '{command}'{hint} (commands: {', '.join(COMMANDS)})")
    return COMMANDS[command]


# ---------------------------------------------------------------------------------------------------------------
# The flat keys of version 0.1, read for one more release: old key → new dotted path, per command.
# ---------------------------------------------------------------------------------------------------------------

_TRAINING_KEYS = {
    "seed": "run.seed", "train_data": "data.train", "eval_data": "data.eval",
    "learning_rate": "optim.learning_rate", "lr_scheduler": "optim.scheduler", "warmup_steps": "optim.warmup_steps",
    "weight_decay": "optim.weight_decay", "max_grad_norm": "optim.max_grad_norm", "batch_size": "batch.size",
    "micro_batch_size": "batch.micro_size", "eval_every": "run.eval_every", "save_every": "run.save_every",
    "lora": "model.lora", "dtype": "model.dtype", "parallelism": "run.parallelism", "report_to": "run.report_to",
    "run_name": "run.name", "log_every": "run.log_every", "resume": "run.resume", "overwrite": "run.overwrite",
    "progress": "run.progress",
}  # fmt: skip
_SAMPLING_KEYS = {
    "max_prompt_length": "sampling.max_prompt_length", "max_new_tokens": "sampling.max_new_tokens",
    "temperature": "sampling.temperature", "top_k": "sampling.top_k", "top_p": "sampling.top_p",
    "stop_token": "sampling.stop",
}  # fmt: skip
_POLICY_KEYS = _TRAINING_KEYS | _SAMPLING_KEYS | {
    "policy": "model.name", "compile": "model.compile", "reward": "reward.source",
    "reward_aggregation": "reward.aggregation", "missing_eos_penalty": "reward.missing_eos_penalty",
    "missing_eos_mode": "reward.missing_eos_mode", "kl_coef": "kl.coef", "kl_estimator": "kl.estimator",
    "kl_in": "kl.add_to", "kl_control": "kl.control", "kl_target": "kl.target", "kl_horizon": "kl.horizon",
    "micro_batch_tokens": "batch.micro_tokens",
}  # fmt: skip
_ALGORITHM_KEYS = ("steps", "num_minibatches", "clip_range", "clip_range_high", "entropy_coef", "whiten_advantages")
_GRPO_KEYS = (
    "group_size", "estimator", "scale_rewards", "loss_aggregation", "num_iterations", "overlong_buffer",
    "overlong_penalty_factor", "dynamic_sampling", "mask_truncated_completions",
)  # fmt: skip

FLAT_KEYS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "sft": _TRAINING_KEYS | {"model": "model.name", "max_length": "data.max_length", "epochs": "sft.epochs",
                             "packing": "sft.packing"},
    "rm": _TRAINING_KEYS | {"model": "model.name", "max_length": "data.max_length", "epochs": "rm.epochs",
                            "use_margin": "rm.use_margin",
                            "center_rewards_coefficient": "rm.center_rewards_coefficient"}
          | {f"normalize_{k}": f"normalize.{k}" for k in ("policy", "prompts", "samples", "max_new_tokens", "temperature")},
    "ppo": _POLICY_KEYS | {k: f"ppo.{k}" for k in _ALGORITHM_KEYS} | {"ppo_epochs": "ppo.epochs"}
           | {k: f"ppo.{k}" for k in ("whiten_rewards", "critic", "vf_coef", "value_clip_range", "gamma", "lam",
                                      "score_position")},
    "grpo": _POLICY_KEYS | {k: f"grpo.{k}" for k in _ALGORITHM_KEYS + _GRPO_KEYS} | {"whiten_rewards": ()},
    "sample": _SAMPLING_KEYS | {"policy": "model.name", "dtype": "model.dtype", "judge": "judge.source",
                                "reward_aggregation": "judge.aggregation"},
    "eval": _SAMPLING_KEYS | {"policy": "model.name", "dtype": "model.dtype", "reward": "reward.source",
                              "judge": "judge.source", "reward_aggregation": ("reward.aggregation", "judge.aggregation")},
}  # fmt: skip
"""Per command: each flat key of version 0.1 → the dotted path(s) it now lives at; () = dropped (grpo never
read whiten_rewards; a run directory of 0.1 still records it)."""


def _is_section(cls: type, name: str) -> bool:
    field = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    return field is not None and dataclasses.is_dataclass(field.type)


def _migrate(cls: type, data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`data` with every flat key of version 0.1 moved to its section; one warning names the moves."""
    moves = FLAT_KEYS.get(cls.COMMAND, {})
    nested: dict[str, Any] = {}
    moved = []
    for key, value in data.items():
        # a key that is both old and new (`model`, `reward`, `lora` …) is old only when its value is not a mapping
        if key not in moves or (_is_section(cls, key) and isinstance(value, Mapping)):
            nested[key] = _merge(nested.get(key, {}), value) if isinstance(value, Mapping) else value
            continue
        targets = (moves[key],) if isinstance(moves[key], str) else moves[key]
        moved.append(f"{key} → {' and '.join(targets) or '(dropped: it had no effect)'}")
        for target in targets:
            head, name = target.split(".")
            nested.setdefault(head, {})[name] = value
    if moved:
        warnings.warn(
            f"{where}flat keys of rlhf 0.1, read for one more release; write them in their sections: "
            + ", ".join(moved), FutureWarning, stacklevel=4,
        )  # fmt: skip
    return nested


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on top, mapping by mapping."""
    out = dict(base)
    for key, value in over.items():
        is_map = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merge(out[key], value) if is_map else value
    return out


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


# ---------------------------------------------------------------------------------------------------------------
# YAML in and out, and the one way a config is assembled: defaults < YAML < command line.
# ---------------------------------------------------------------------------------------------------------------


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_to_plain(item) for item in value]
    if isinstance(value, str):
        return str(value)  # a StrEnum member as its plain string
    return value


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


def read_yaml(cls: type[_Config], path: str | Path) -> dict[str, Any]:
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


def _flag_moves(cls: type, args: Sequence[str]) -> list[str]:
    """Command-line flags with a flat key of version 0.1 rewritten to its section (``--kl_coef`` → ``--kl.coef``)."""
    moves = FLAT_KEYS.get(cls.COMMAND, {})
    out, moved = [], []
    for arg in args:
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        name = name.replace("-", "_")
        negated = name.startswith("no_") and name[3:] in moves
        key = name[3:] if negated else name
        target = moves.get(key)
        if target is None:  # a section is never a bare flag, so `--reward X` can only be the old form
            out.append(arg)
            continue
        if not target:
            raise ConfigError(f"{cls.COMMAND}: --{name} had no effect in rlhf 0.1 and is no longer a flag; drop it")
        head, field = (target if isinstance(target, str) else target[0]).split(".")
        out.append(f"--{head}.{'no_' if negated else ''}{field}{eq}{value}")
        moved.append(f"--{name} → {out[-1].partition('=')[0]}")
    if moved:
        warnings.warn(
            f"{cls.COMMAND}: flat flags of rlhf 0.1, read for one more release; write: " + ", ".join(moved),
            FutureWarning, stacklevel=3,
        )  # fmt: skip
    return out


def _description(cls: type[_Config]) -> str:
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
    overrides = _flag_moves(cls, list(overrides))
    where = f"{command}: {path}: " if path is not None else f"{command}: "
    values = _merge(_section_defaults(cls), read_yaml(cls, path) if path is not None else {})
    _check_required(cls, values, overrides)
    with _checks_deferred():
        default = _validate(cls, _placeholder(cls, values), where)
        parsed = tyro.cli(
            cls, default=default, args=overrides, prog=f"rlhf {command}", description=_description(cls),
            use_underscores=True, config=(tyro.conf.EnumChoicesFromValues,),
        )  # fmt: skip
    return _build(cls, config_to_dict(parsed), f"{command}: ")  # the merged config, checked once
