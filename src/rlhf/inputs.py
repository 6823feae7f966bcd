"""Pre-flight checks of a command's model inputs, before any weights are loaded.

Each command's ``run`` calls :func:`check_inputs` with its checked config before anything loads, so a model path
that cannot work fails in a second, with one message naming the config field, the path and what would be
valid — not after minutes of loading, nor as a transformers traceback ("Repo id must be in the form…"). What
is read of a model directory or hub id: the README's 'Errors, --debug and --verbose'. Reward and judge sources
that are Python functions are imported here too (as the run would), so a missing file or function names its
field; the ``sampling.stop`` text is checked against the policy's tokenizer (`stop_token_ids`).
"""

from __future__ import annotations

import json
import operator
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlhf.config import CommandConfig, ConfigError, llm_judge

CAUSAL_LM = "a causal LM"
REWARD_MODEL = "a reward model"
CLASSIFIER_BASE = "a causal LM or an encoder to train as a reward model"

# Which config fields hold models, per command, and what each must be.
MODEL_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    **dict.fromkeys(("sft", "dpo", "ppo", "grpo", "sample"), (("model.name", CAUSAL_LM),)),
    "rm": (("model.name", CLASSIFIER_BASE), ("normalize.policy", CAUSAL_LM)),
    "eval": (("model.name", CAUSAL_LM), ("baseline", CAUSAL_LM), ("reference", CAUSAL_LM)),
}
REWARD_FIELDS: dict[str, tuple[str, ...]] = {
    "ppo": ("reward.source",),
    "grpo": ("reward.source",),
    "sample": ("judge.source",),
    "eval": ("reward.source", "judge.source", "best_of.source"),
}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)
# huggingface_hub's rule for repo ids: `name` or `namespace/name`, no '--' or '..', at most 96 characters
HUB_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")
VALID_MODEL = (
    "a model directory written by save_pretrained, with config.json, weights and tokenizer, or a hub id 'org/name'"
)


def check_inputs(config: CommandConfig) -> None:
    """Every model path and reward source of ``config`` (any command), then its stop token; ConfigError."""
    command = config.COMMAND
    try:
        for field, kind in MODEL_FIELDS.get(command, ()):
            value = operator.attrgetter(field)(config)
            if value is not None:
                check_model(field, value, kind)
        for field in REWARD_FIELDS.get(command, ()):
            for where, source in reward_sources(field, operator.attrgetter(field)(config)):
                check_reward_source(where, source)
        if hasattr(config, "sampling") and config.sampling.stop != "eos":
            check_stop_token(config.model.name, config.sampling.stop)
    except ConfigError as e:
        raise ConfigError(f"{command}: {e}") from None


def reward_sources(field: str, value: Any) -> Iterator[tuple[str, str]]:
    """(field name for messages, source) of a reward value: ``reward.source``, or ``reward.source[1].source``."""
    if isinstance(value, str):
        yield field, value
    elif value is not None:
        for i, spec in enumerate(value):
            yield f"{field}[{i}].source", spec.source


def check_reward_source(field: str, source: str) -> None:
    """A reward-model source is checked as a model (an ensemble's: its manifest, then each member);
    ``file.py:function`` / ``module:function`` is imported."""
    spec = source.strip()
    if is_reward_model(spec):
        from rlhf.rollout.rewards import RewardError
        from rlhf.rollout.rewards.ensemble import is_ensemble, member_paths

        path = Path(spec).expanduser()
        if not is_ensemble(path):
            check_model(field, spec, REWARD_MODEL)
            return
        try:
            members = member_paths(path)
        except RewardError as e:
            raise ConfigError(f"{field}={spec!r}: {e}") from None
        for member in members:
            check_model(f"{field} (ensemble member {member.name})", str(member), REWARD_MODEL)
        return
    # the episodes' own rewards (rollout.environment, checked with the config); an LLM judge or HTTP reward is only
    # reachable or not when asked: its own errors name the URL
    if spec == "environment" or llm_judge(spec) is not None or spec.lower().startswith(("http://", "https://")):
        return
    from rlhf.rollout.rewards import FunctionReward, RewardError

    try:
        FunctionReward.load(spec)
    except RewardError as e:
        message = str(e)
        for prefix in (f"reward {spec!r}: ", f"reward spec {spec!r}: "):  # the field says which reward
            message = message.removeprefix(prefix)
        raise ConfigError(f"{field}={spec!r}: {message}") from None


def is_reward_model(source: str) -> bool:
    """Whether a reward source is a reward model (a directory or a hub id) rather than a function, an HTTP
    reward or an LLM judge: the same dispatch as `rlhf.rollout.rewards.load_reward_source`."""
    spec = source.strip()
    if spec == "environment" or llm_judge(spec) is not None or spec.lower().startswith(("http://", "https://")):
        return False
    return Path(spec).expanduser().is_dir() or ":" not in spec


def check_model(field: str, spec: str, kind: str) -> None:
    """``spec`` (a directory or a hub id) can be loaded as ``kind``; ConfigError naming ``field`` if not."""
    path = Path(spec).expanduser()
    where = f"{field}={spec!r}"
    if path.is_dir():
        _check_model_dir(where, path, kind)
    elif path.exists():
        raise ConfigError(f"{where} is a file; expected {VALID_MODEL}")
    elif not HUB_ID.match(spec):
        raise ConfigError(f"{where}: no such directory ({path.resolve()}); expected {VALID_MODEL}")
    else:
        try:
            config = _load_config(where, spec)
        except ConfigError as e:
            raise ConfigError(
                f"{where}: no local directory {path.resolve()}, and as a hub id {str(e).removeprefix(where + ': ')} "
                f"(expected {VALID_MODEL})"
            ) from None
        _check_kind(where, config.to_dict(), kind)


def _load_config(where: str, source: str) -> Any:
    """``AutoConfig.from_pretrained(source)``; its failure as a ConfigError with its first line."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source)
    except Exception as e:  # OSError offline or for an unknown repo, ValueError for an unknown model type, …
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{where}: it cannot be loaded: {reason}") from None


def _check_model_dir(where: str, path: Path, kind: str) -> None:
    if (path / "adapter_config.json").exists() and not (path / "config.json").exists():
        return  # a peft adapter directory: transformers loads its base model; nothing cheap to check here
    config = _read_config(where, path)
    _load_config(where, str(path))  # what transformers makes of it: an unknown model_type, a bad value
    _check_kind(where, config, kind)
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"{where}: {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the tokenizer "
            "beside the model (tokenizer.save_pretrained(directory))"
        )
    weights = [name for name in WEIGHT_FILES if (path / name).exists()]
    if not weights:
        raise ConfigError(f"{where}: {path} has no weights (none of {', '.join(WEIGHT_FILES[:3])})")
    for file in _safetensors_files(where, path, weights):
        _check_safetensors(where, file)


def _read_config(where: str, path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.exists():
        raise ConfigError(f"{where}: {path} is not a model directory (no config.json); expected {VALID_MODEL}")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where}: {file} is not valid JSON ({e})") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ConfigError(f"{where}: {file} has no model_type; it is not a transformers model config")
    return config


def _check_kind(where: str, config: dict[str, Any], kind: str) -> None:
    """The model type has the head ``kind`` needs (transformers' auto mappings); a reward model one output."""
    from transformers.models.auto import modeling_auto

    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if kind == CAUSAL_LM:
        if model_type not in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise ConfigError(f"{where}: a {model_type!r} model has no causal-LM head; expected {kind}")
        if architectures and all("ForSequenceClassification" in a for a in architectures):
            raise ConfigError(
                f"{where} is a sequence classifier ({', '.join(architectures)}), such as a reward model; "
                f"expected {kind} (e.g. …ForCausalLM): its language-model head would start random"
            )
        return
    if model_type not in modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        raise ConfigError(
            f"{where}: a {model_type!r} model cannot have a sequence-classification head; expected {kind}"
        )
    labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)
    if kind == REWARD_MODEL and labels != 1:
        raise ConfigError(
            f"{where} has {labels} outputs (num_labels); a reward model has exactly one (a causal LM or a "
            "classifier is not a reward model: train one with `rlhf rm`)"
        )


def _safetensors_files(where: str, path: Path, weights: list[str]) -> list[Path]:
    files = [path / name for name in weights if name.endswith(".safetensors")]
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{where}: {index} is not a valid shard index ({type(e).__name__}: {e})") from None
        for shard in shards:
            if not (path / shard).exists():
                raise ConfigError(f"{where}: {index} lists {shard}, which is missing from {path}")
        files += [path / shard for shard in shards]
    return files


def _check_safetensors(where: str, file: Path) -> None:
    """The header of a safetensors file parses and its tensors fit in the file (not truncated, not garbage). Layout: an
    8-byte little-endian header size N, N bytes of JSON {name: {dtype, shape, data_offsets}}, then the data; the largest
    end offset must be the size of the data."""
    size = file.stat().st_size

    def corrupt(problem: str) -> ConfigError:
        return ConfigError(f"{where}: {file} is corrupt ({problem}); save or download the model again")

    with file.open("rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if n is None or n > size - 8:
            raise corrupt("its header is cut off or it is not a safetensors file")
        try:
            header = json.loads(f.read(n))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError):
            raise corrupt("its header is not valid safetensors JSON") from None
    if 8 + n + end > size:
        raise corrupt(f"it is truncated: {size} bytes, its header describes {8 + n + end}")


def check_stop_token(policy: str, stop_token: str) -> None:
    """A ``stop_token`` other than 'eos' is one token of the policy's tokenizer (before any weights load)."""
    from transformers import AutoTokenizer

    from rlhf.data.tokenization import stop_token_ids

    try:
        tokenizer = AutoTokenizer.from_pretrained(policy)
    except Exception as e:  # the model checks passed, so this is the tokenizer files themselves
        raise ConfigError(f"model.name={policy!r}: cannot load its tokenizer: {type(e).__name__}: {e}") from None
    stop_token_ids(tokenizer, stop_token)
