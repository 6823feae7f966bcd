"""The flat keys of version 0.1 (``learning_rate``, ``kl_coef``, …), read for one more release with a
`FutureWarning` naming each key's section. Nothing else depends on this module's contents: deleting it, and
its two calls in `rlhf.config.loading`, ends the old keys."""

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from rlhf.config.base import ConfigError, _merge

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


def _migrate(cls: type, data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`data` with every flat key of version 0.1 moved to its section; one warning names the moves."""
    moves = FLAT_KEYS.get(cls.COMMAND, {})
    sections = {f.name for f in dataclasses.fields(cls) if dataclasses.is_dataclass(f.type)}
    nested: dict[str, Any] = {}
    moved = []
    for key, value in data.items():
        # a key that is both old and new (`model`, `reward`, `lora` …) is old only when its value is not a mapping
        if key not in moves or (key in sections and isinstance(value, Mapping)):
            nested[key] = _merge(nested.get(key, {}), value) if isinstance(value, Mapping) else value
            continue
        targets = (moves[key],) if isinstance(moves[key], str) else moves[key]
        moved.append(f"{key} → {' and '.join(targets) or '(dropped: it had no effect)'}")
        for target in targets:
            head, name = target.split(".")
            nested.setdefault(head, {})[name] = value
    _warn(f"{where}flat keys of rlhf 0.1, read for one more release; write them in their sections: ", moved, 4)
    return nested


def _flag_moves(cls: type, args: Sequence[str]) -> list[str]:
    """Command-line flags with a flat key of version 0.1 rewritten to its section (``--kl_coef`` → ``--kl.coef``)."""
    moves = FLAT_KEYS.get(cls.COMMAND, {})
    out, moved = [], []
    for arg in args:
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        name = name.replace("-", "_")
        negated = name.startswith("no_") and name[3:] in moves
        target = moves.get(name[3:] if negated else name)
        if target is None:  # a section is never a bare flag, so `--reward X` can only be the old form
            out.append(arg)
            continue
        if not target:
            raise ConfigError(f"{cls.COMMAND}: --{name} had no effect in rlhf 0.1 and is no longer a flag; drop it")
        head, field = (target if isinstance(target, str) else target[0]).split(".")
        new = f"--{head}.{'no_' if negated else ''}{field}"
        out.append(new + eq + value)
        moved.append(f"--{name} → {new}")
    _warn(f"{cls.COMMAND}: flat flags of rlhf 0.1, read for one more release; write: ", moved, 3)
    return out


def _warn(text: str, moved: list[str], stacklevel: int) -> None:
    """One FutureWarning naming the moves, `stacklevel` counted from the caller (the user's call of load_config or
    config_from_dict)."""
    if moved:
        warnings.warn(text + ", ".join(moved), FutureWarning, stacklevel=stacklevel + 1)
