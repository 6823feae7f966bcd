"""Config dataclasses and `load_config`: YAML in, precedence defaults < YAML < flags, refusals, round trip.

Everything here is in-process and takes milliseconds; the subprocess checks live in test_cli.py.
"""

import ast
import dataclasses
import inspect
import math
import sys
from pathlib import Path

import pydantic
import pytest
import yaml

from configs import merged
from rlhf import config as config_module
from rlhf.config import (
    COMMANDS,
    ConfigError,
    DemoConfig,
    GRPOConfig,
    LoRAConfig,
    PPOConfig,
    RewardSpec,
    SFTConfig,
    base,
    commands,
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    load_config,
    sections,
    training,
)
from rlhf.core.choices import KLEstimator

# The least each command needs (its required fields).
REQUIRED: dict[str, dict[str, object]] = {
    "sft": {"model": {"name": "models/base"}, "data": {"train": "data/sft.jsonl"}, "output_dir": "runs/sft"},
    "rm": {"model": {"name": "models/sft"}, "data": {"train": "data/prefs.jsonl"}, "output_dir": "runs/rm"},
    "ppo": {
        "model": {"name": "models/sft"},
        "reward": {"source": "models/rm"},
        "data": {"train": "data/p.jsonl"},
        "output_dir": "runs/ppo",
    },
    "grpo": {
        "model": {"name": "models/sft"},
        "reward": {"source": "rewards.py:score"},
        "data": {"train": "p.jsonl"},
        "output_dir": "runs/g",
    },
    "sample": {"model": {"name": "models/sft"}, "prompts": "data/p.jsonl", "output": "samples.jsonl"},
    "eval": {"model": {"name": "runs/ppo/final"}, "eval_data": "data/heldout.jsonl", "reward": {"source": "models/rm"}},
    "demo": {},
    "report": {"run_dir": "runs/ppo"},
    "doctor": {"run_dir": "runs/ppo"},
    "label": {"pairs": "pairs.jsonl", "out": "prefs.jsonl"},
    "dpo": {"output_dir": "runs/dpo", "model": {"name": "runs/sft/final"}, "data": {"train": "data/prefs.jsonl"}},
}


def write_yaml(tmp_path: Path, data: object, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return path


def with_required(command: str, overrides: dict[str, object] | None = None) -> dict[str, object]:
    return merged(REQUIRED[command], overrides)


def ppo_yaml(tmp_path: Path, overrides: dict[str, object] | None = None) -> Path:
    return write_yaml(tmp_path, with_required("ppo", overrides))


def error_of(command: str, path: Path | None = None, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(command, path, overrides or [])
    return str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# YAML loading and precedence
# ---------------------------------------------------------------------------------------------------------------


def test_yaml_values_are_loaded_and_converted(tmp_path: Path) -> None:
    # `1e-5` without a dot is a *string* for PyYAML (YAML 1.1); an int is fine for a float field.
    path = write_yaml(
        tmp_path,
        "model: {name: m}\nreward: {source: r}\ndata: {train: d}\noutput_dir: o\n"
        "optim: {learning_rate: 1e-5}\nkl: {coef: 1, estimator: k3}\n",
    )
    cfg = load_config("ppo", path)
    assert isinstance(cfg, PPOConfig)
    assert cfg.optim.learning_rate == 1e-5 and isinstance(cfg.optim.learning_rate, float)
    assert cfg.kl.coef == 1.0 and isinstance(cfg.kl.coef, float)
    assert cfg.kl.estimator is KLEstimator.K3 and cfg.kl.estimator == "k3"  # the core enum, equal to its text
    assert (cfg.model.name, cfg.reward.source, cfg.data.train, cfg.output_dir) == ("m", "r", "d", "o")


def test_a_section_in_yaml_keeps_the_commands_other_defaults(tmp_path: Path) -> None:
    # grpo's own sampling default (256 new tokens) survives a file that sets only the temperature
    cfg = load_config("grpo", write_yaml(tmp_path, with_required("grpo", {"sampling.temperature": 0.9})))
    assert (cfg.sampling.temperature, cfg.sampling.max_new_tokens) == (0.9, 256)
    assert (cfg.kl.coef, cfg.kl.add_to, cfg.batch.size, cfg.grpo.whiten_advantages) == (0.0, "loss", 16, False)


def test_precedence_defaults_then_yaml_then_command_line(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, {"ppo.steps": 7, "ppo.epochs": 2})
    cfg = load_config("ppo", path, ["--ppo.epochs", "3"])
    assert cfg.kl.coef == 0.05  # untouched: ppo's default
    assert cfg.steps == 7  # YAML over the default
    assert cfg.ppo.epochs == 3  # the flag over YAML


def test_command_line_alone_is_enough() -> None:
    cfg = load_config("sft", None, ["--model.name", "m", "--data.train", "d", "--output_dir", "o", "--sft.epochs", "2"])
    assert (cfg.model.name, cfg.data.train, cfg.output_dir, cfg.sft.epochs) == ("m", "d", "o", 2)


def test_flags_accept_dashes_and_underscores_and_boolean_pairs(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path)
    cfg = load_config(
        "ppo", path,
        ["--optim.learning-rate", "2e-6", "--sampling.max_new_tokens=16", "--run.no-progress", "--run.resume"],
    )  # fmt: skip
    assert (cfg.optim.learning_rate, cfg.sampling.max_new_tokens, cfg.run.progress, cfg.run.resume) == (
        2e-6, 16, False, True,
    )  # fmt: skip
    assert load_config("ppo", path, ["--run.no_progress"]).run.progress is False


@pytest.mark.parametrize(
    ("args", "progress", "resume"),
    [
        (["--run.progress", "false", "--run.resume", "true"], False, True),
        (["--run.progress=False", "--run.resume=yes"], False, True),
        (["--run.progress", "0", "--ppo.steps", "3"], False, False),  # the value is taken, the next flag stays
        (["--run.progress", "--run.resume"], True, True),  # bare flags, as before
        (["--run.no_progress"], False, False),
    ],
)
def test_a_boolean_takes_a_value_like_every_other_field(tmp_path: Path, args, progress, resume) -> None:
    cfg = load_config("ppo", ppo_yaml(tmp_path), args)
    assert (cfg.run.progress, cfg.run.resume) == (progress, resume)


def test_a_boolean_refuses_other_words(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--run.progress='maybe': expected true or false"):
        load_config("ppo", ppo_yaml(tmp_path), ["--run.progress=maybe"])
    assert load_config("demo", None, ["--overwrite", "true"]).overwrite is True  # a top-level boolean too


def test_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    cfg = load_config("demo", write_yaml(tmp_path, ""))
    assert cfg == DemoConfig()


def test_missing_required_fields_are_named() -> None:
    message = error_of("ppo", None, ["--model.name", "m"])
    assert "missing required fields output_dir, data.train, reward.source" in message
    assert "--reward.source" in message
    with pytest.raises(ConfigError, match="missing required field model.name"):
        config_from_dict("sft", {"output_dir": "o", "data": {"train": "d"}})


# ---------------------------------------------------------------------------------------------------------------
# The flat keys of version 0.1: still read, with a warning naming the new key
# ---------------------------------------------------------------------------------------------------------------


def test_flat_yaml_keys_are_read_with_a_warning_naming_the_new_key(tmp_path: Path) -> None:
    flat = {"policy": "m", "reward": ["a.py:f", "b.py:g"], "reward_aggregation": "gdpo", "train_data": "d",
            "output_dir": "o", "kl_coef": 0.1, "kl_in": "loss", "ppo_epochs": 2, "batch_size": 8,
            "micro_batch_size": 4, "no_such": None}  # fmt: skip
    del flat["no_such"]
    path = write_yaml(tmp_path, flat)
    with pytest.warns(FutureWarning, match="flat keys of rlhf 0.1") as caught:
        cfg = load_config("ppo", path)
    message = str(caught[0].message)
    assert "kl_coef → kl.coef" in message and "ppo_epochs → ppo.epochs" in message and str(path) in message
    nested = load_config("ppo", write_yaml(tmp_path, {
        "model": {"name": "m"}, "data": {"train": "d"}, "output_dir": "o",
        "reward": {"source": ["a.py:f", "b.py:g"], "aggregation": "gdpo"},
        "kl": {"coef": 0.1, "add_to": "loss"}, "ppo": {"epochs": 2}, "batch": {"size": 8, "micro_size": 4},
    }, name="nested.yaml"))  # fmt: skip
    assert cfg == nested


def test_flat_flags_and_eval_aggregation_move_to_every_section(tmp_path: Path) -> None:
    with pytest.warns(FutureWarning, match=r"--kl_coef → --kl\.coef.*--no_progress → --run\.no_progress"):
        cfg = load_config("ppo", ppo_yaml(tmp_path), ["--kl_coef", "0.3", "--no-progress", "--steps=4"])
    assert (cfg.kl.coef, cfg.run.progress, cfg.steps) == (0.3, False, 4)
    with pytest.warns(FutureWarning):
        ev = config_from_dict("eval", {"policy": "p", "eval_data": "e", "reward": ["a.py:f", "b.py:g"],
                                       "baseline": "b", "judge": ["c.py:h", "d.py:i"], "reward_aggregation": "gdpo"})  # fmt: skip
    assert ev.reward.aggregation == ev.judge.aggregation == "gdpo"


def test_flat_keys_of_sft_and_rm_move_too() -> None:
    with pytest.warns(FutureWarning):
        sft = config_from_dict("sft", {"model": "m", "train_data": "d", "output_dir": "o", "epochs": 2,
                                       "lora": {"r": 4}, "max_length": 32})  # fmt: skip
    assert (sft.model.name, sft.sft.epochs, sft.model.lora.r, sft.data.max_length) == ("m", 2, 4, 32)
    with pytest.warns(FutureWarning):
        rm = config_from_dict("rm", {"model": "m", "train_data": "d", "output_dir": "o", "normalize_policy": "p"})
    assert rm.normalize.policy == "p"


# ---------------------------------------------------------------------------------------------------------------
# Refusals in the YAML file: unknown key, wrong type, bad YAML
# ---------------------------------------------------------------------------------------------------------------


def test_unknown_key_names_the_key_the_file_and_the_closest_field(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, {"kl.coeff": 0.1})
    message = error_of("ppo", path)
    assert "unknown key 'kl.coeff'" in message
    assert str(path) in message
    assert "did you mean 'kl.coef'?" in message
    assert "unknown key 'samplng'; did you mean 'sampling'?" in error_of("ppo", ppo_yaml(tmp_path, {"samplng": {}}))


def test_unknown_key_inside_nested_mappings(tmp_path: Path) -> None:
    assert "unknown key 'model.lora.rank'" in error_of("ppo", ppo_yaml(tmp_path, {"model.lora": {"rank": 8}}))
    message = error_of("ppo", ppo_yaml(tmp_path, {"reward.source": [{"source": "a.py:f", "wieght": 2}]}))
    assert "unknown key 'reward.source[0].wieght'; did you mean 'reward.source[0].weight'?" in message
    message = error_of("ppo", ppo_yaml(tmp_path, {"grpo": {"group_size": 4}}))
    assert "unknown key 'grpo'" in message  # grpo's section is not ppo's


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("batch.size", "eight", "batch.size='eight': input should be a valid integer"),
        ("batch.size", 8.5, "batch.size=8.5: input should be a valid integer"),
        ("optim.learning_rate", "fast", "optim.learning_rate='fast': input should be a valid number"),
        ("run.resume", "maybe", "run.resume='maybe': input should be a valid boolean"),
        ("ppo.critic", "both", "ppo.critic='both': input should be 'auto', 'shared' or 'separate'"),
        ("run.report_to", ["jsonl", "mlflow"], "run.report_to[1]='mlflow': input should be 'jsonl', 'tensorboard'"),
        ("model.lora", 5, "model.lora=5: input should be a dictionary or an instance of LoRAConfig"),
        ("reward.source", 3, "reward.source=3: expected a source string or a list of {source, weight, name}"),
        ("data.eval", 3, "data.eval=3: input should be a valid string"),
        ("kl.estimator", "k4", "kl.estimator='k4': input should be 'k1', 'k2' or 'k3'"),
    ],
)
def test_wrong_type_names_the_key_the_expected_type_and_the_value(
    tmp_path: Path, key: str, value: object, expected: str
) -> None:
    path = ppo_yaml(tmp_path, {key: value})
    message = error_of("ppo", path)
    assert message.startswith(f"ppo: {path}: {key}")
    assert expected in message


def test_invalid_yaml_and_non_mapping_and_missing_file(tmp_path: Path) -> None:
    assert "invalid YAML" in error_of("ppo", write_yaml(tmp_path, "model: [unclosed\n"))
    assert "expected a mapping of field: value" in error_of("ppo", write_yaml(tmp_path, "- a\n- b\n"))
    assert "does not exist" in error_of("ppo", tmp_path / "nope.yaml")


# ---------------------------------------------------------------------------------------------------------------
# Impossible values and combinations: ranges when a section is built, cross-field rules on the final config
# ---------------------------------------------------------------------------------------------------------------

IMPOSSIBLE = [
    (
        "ppo",
        {"batch.size": 8, "ppo.num_minibatches": 3},
        "ppo: ppo.num_minibatches=3 does not divide batch.size=8; choose a divisor of 8 (1, 2, 4, 8)",
    ),
    (
        "ppo",
        {"batch.size": 8, "ppo.num_minibatches": 2, "batch.micro_size": 3},
        "ppo: batch.micro_size=3 does not divide the minibatch of 4 sequences",
    ),
    ("ppo", {"optim.learning_rate": -1e-5}, "optim.learning_rate=-1e-05: input should be greater than 0"),
    ("ppo", {"sampling.temperature": 0.0}, "sampling.temperature=0.0: input should be greater than 0"),
    ("ppo", {"sampling.top_p": 1.5}, "sampling.top_p=1.5: input should be less than or equal to 1"),
    ("ppo", {"ppo.clip_range": 1.5}, "ppo.clip_range=1.5: input should be less than 1"),
    ("ppo", {"kl.control": "adaptive", "kl.coef": 0.0}, "kl.control='adaptive' scales kl.coef"),
    ("ppo", {"reward.aggregation": "gdpo"}, "give reward.source as a list"),
    ("ppo", {"reward.source": []}, "reward.source is an empty list"),
    ("ppo", {"reward.source": "rewards.py"}, "names a file but no function"),
    (
        "ppo",
        {"reward.source": [{"source": "a.py:score"}, {"source": "b.py:score"}]},
        "ppo: reward.source[1].name='score' is already used by reward.source[0]; give each reward a distinct",
    ),
    ("ppo", {"reward.source": [{"source": "a.py:f", "weight": math.inf}]}, "reward.source[0].weight=inf"),
    ("ppo", {"model.lora": {"r": 0}}, "model.lora.r=0: input should be greater than or equal to 1"),
    ("ppo", {"run.resume": True, "run.overwrite": True}, "run.resume and run.overwrite are both set"),
    ("grpo", {"grpo.group_size": 1}, "grpo.group_size=1: input should be greater than or equal to 2"),
    ("grpo", {"grpo.estimator": "rloo", "grpo.scale_rewards": "batch"}, "applies to grpo.estimator='grpo' only"),
    (
        "grpo",
        {"batch.size": 3, "grpo.group_size": 2, "grpo.num_minibatches": 4},
        "grpo: grpo.num_minibatches=4 does not divide the 6 sequences of an iteration",
    ),
    ("grpo", {"grpo.overlong_buffer": 300, "sampling.max_new_tokens": 256}, "grpo.overlong_buffer=300 must be below"),
    ("sft", {"batch.size": 10, "batch.micro_size": 4}, "sft: batch.micro_size=4 does not divide batch.size=10"),
    ("rm", {"rm.epochs": 0}, "rm: rm.epochs=0: input should be greater than or equal to 1"),
    ("rm", {"normalize.prompts": "p.jsonl"}, "normalize.prompts is set but normalize.policy is None"),
    ("sample", {"num_samples": 0}, "sample: num_samples=0: input should be greater than or equal to 1"),
    ("sample", {"mode": "pairs", "num_samples": 1}, "num_samples=1 is out of range; it must be ≥ 2 with mode='pairs'"),
    ("sample", {"mode": "preferences"}, "mode='preferences' needs a judge"),
    ("eval", {"sampling.top_k": -1}, "eval: sampling.top_k=-1: input should be greater than or equal to 0"),
    ("eval", {"judge.source": "j.py:f"}, "judge decides the win rate against baseline, which is not set"),
    ("demo", {"steps": 0}, "demo: steps=0: input should be greater than or equal to 1"),
    ("ppo", {"sampling.vllm.url": "http://h:8000"}, "sampling: vllm.url set, but engine is 'auto': set engine: vllm"),
    ("sample", {"sampling.vllm.memory_fraction": 0.5}, "vllm.memory_fraction set, but engine is 'auto'"),
    (
        "grpo",
        {"sampling.engine": "vllm", "sampling.vllm.url": "http://h:8000", "sampling.vllm.sleep": True},
        "sampling: vllm.sleep is for a vLLM engine in this process; a server (vllm.url) manages its own",
    ),
    ("ppo", {"sampling.is_cap": 0.5}, "ppo: sampling.is_cap=0.5: input should be greater than or equal to 1"),
]


@pytest.mark.parametrize(("command", "fields", "expected"), IMPOSSIBLE)
def test_impossible_values_are_refused_with_the_field_named(
    tmp_path: Path, command: str, fields: dict[str, object], expected: str
) -> None:
    path = write_yaml(tmp_path, with_required(command, fields))
    message = error_of(command, path)
    assert message.startswith(f"{command}: ") and expected.removeprefix(f"{command}: ") in message
    with pytest.raises(ConfigError) as info:
        config_from_dict(command, with_required(command, fields))
    assert expected.removeprefix(f"{command}: ") in str(info.value)


def test_bad_choice_on_the_command_line_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:  # tyro prints the valid choices and exits 2
        load_config("ppo", ppo_yaml(tmp_path), ["--kl.estimator", "k4"])
    assert info.value.code == 2


def test_yaml_invalid_but_fixed_on_the_command_line_succeeds(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, {"batch.size": 8, "ppo.num_minibatches": 3})
    assert "ppo.num_minibatches=3" in error_of("ppo", path)
    cfg = load_config("ppo", path, ["--ppo.num_minibatches", "2"])
    assert (cfg.ppo.num_minibatches, cfg.minibatch_size) == (2, 4)


def test_yaml_valid_but_broken_on_the_command_line_is_refused(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, {"batch.size": 8, "ppo.num_minibatches": 2})
    message = error_of("ppo", path, ["--batch.size", "5"])
    assert "ppo.num_minibatches=2 does not divide batch.size=5" in message


def test_direct_construction_checks_types_and_ranges() -> None:
    cfg = config_from_dict("ppo", with_required("ppo", {"batch.size": 8}))
    with pytest.raises(pydantic.ValidationError, match="size"):
        dataclasses.replace(cfg.batch, size="eight")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ppo.num_minibatches=3 does not divide batch.size=8"):
        dataclasses.replace(cfg, ppo=dataclasses.replace(cfg.ppo, num_minibatches=3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.output_dir = "elsewhere"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="dropout"):
        LoRAConfig(dropout=1.0)


# ---------------------------------------------------------------------------------------------------------------
# Structured fields: reward.source (string or list) and model.lora (mapping)
# ---------------------------------------------------------------------------------------------------------------


def test_reward_as_a_string(tmp_path: Path) -> None:
    cfg = load_config("ppo", ppo_yaml(tmp_path, {"reward.source": "https://scores.example.com/v1"}))
    assert cfg.reward.source == "https://scores.example.com/v1"


def test_reward_as_a_list_of_mappings(tmp_path: Path) -> None:
    reward = [
        {"source": "models/rm", "weight": 0.5, "name": "helpful"},
        {"source": "rewards.py:length_penalty", "weight": 1},
        "my_pkg.rewards:format_ok",  # a bare source is shorthand for {source: ...}
        {"source": "http://localhost:8000/score", "weight": -0.25},
    ]
    cfg = load_config("grpo", write_yaml(tmp_path, with_required("grpo", {"reward.source": reward})))
    assert cfg.reward.source == (
        RewardSpec(source="models/rm", weight=0.5, name="helpful"),
        RewardSpec(source="rewards.py:length_penalty", weight=1.0, name="length_penalty"),
        RewardSpec(source="my_pkg.rewards:format_ok", weight=1.0, name="format_ok"),
        RewardSpec(source="http://localhost:8000/score", weight=-0.25, name="localhost"),
    )
    assert all(isinstance(spec.weight, float) for spec in cfg.reward.source)


def test_reward_on_the_command_line_as_string_or_yaml_list(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, {"reward": {"source": [{"source": "a.py:f"}], "aggregation": "gdpo"}})
    flag = "[{source: a.py:f, weight: 2}, {source: b.py:g, name: gee}]"
    cfg = load_config("ppo", path, ["--reward.source", flag])
    assert cfg.reward.source == (RewardSpec(source="a.py:f", weight=2.0), RewardSpec(source="b.py:g", name="gee"))
    only = load_config("ppo", path, ["--reward.source", "rm_dir", "--reward.aggregation", "sum"])
    assert only.reward.source == "rm_dir"


def test_lora_nested_mapping_in_yaml_and_on_the_command_line(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, {"model.lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}})
    cfg = load_config("ppo", path)
    assert cfg.model.lora == LoRAConfig(r=4, alpha=8.0, dropout=0.05, target_modules=("q_proj", "v_proj"))
    assert load_config("ppo", path, ["--model.lora", "None"]).model.lora is None  # full fine-tuning
    assert load_config("ppo", path, ["--model.lora", "{r: 16}"]).model.lora == LoRAConfig(r=16)
    assert load_config("ppo", ppo_yaml(tmp_path)).model.lora is None  # the default


# ---------------------------------------------------------------------------------------------------------------
# Round trip and derived sizes
# ---------------------------------------------------------------------------------------------------------------

NON_DEFAULTS: dict[str, dict[str, object]] = {
    "sft": {
        "model.lora": {"r": 4},
        "batch.micro_size": 8,
        "run.report_to": ["jsonl", "tensorboard"],
        "data.eval": "e.jsonl",
        "sft.packing": True,
    },
    "rm": {"rm.center_rewards_coefficient": 0.01, "rm.use_margin": False, "optim.max_grad_norm": None},
    "ppo": {
        "reward": {
            "source": [{"source": "models/rm", "weight": 0.7, "name": "rm"}, "rewards.py:fmt"],
            "aggregation": "gdpo",
            "missing_eos_penalty": 1.0,
        },
        "model.lora": {"r": 8, "target_modules": ["all-linear"]},
        "batch": {"size": 16, "micro_size": 2},
        "ppo.num_minibatches": 4,
        "sampling.stop": "\n",
        "ppo.clip_range_high": 0.28,
        "kl.control": "adaptive",
        "ppo.critic": "separate",
        "optim.learning_rate": 1.41e-5,
    },  # fmt: skip
    "grpo": {
        "grpo.estimator": "dr_grpo",
        "grpo.loss_aggregation": "seq-mean-token-sum-norm",
        "grpo.overlong_buffer": 32,
    },
    "sample": {"judge.source": [{"source": "models/rm"}], "mode": "best_of_n", "num_samples": 8, "pairing": "all"},
    "eval": {"output": "eval.jsonl", "max_prompts": 100},
    "demo": {"preset": "small", "steps": 3},
    "report": {"output": "out/report.html", "max_samples": 4},
    "doctor": {"json": True},
    "dpo": {"dpo": {"loss": "robust", "beta": 0.2, "label_smoothing": 0.1}, "batch.size": 16},
    "label": {
        "pairs": "pairs.jsonl",
        "out": "prefs.jsonl",
        "labels_per_pair": 3,
        "host": "0.0.0.0",
        "judge.source": "openai:http://127.0.0.1:8000/v1#m",
        "judge.llm": {"both_orders": False, "tries": 2},
    },
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_config_to_yaml_round_trips(tmp_path: Path, command: str) -> None:
    cfg = load_config(command, write_yaml(tmp_path, with_required(command, NON_DEFAULTS[command])))
    text = config_to_yaml(cfg)
    assert text.startswith(f"# rlhf {command}:")
    assert yaml.safe_load(text) == config_to_dict(cfg)
    again = load_config(command, write_yaml(tmp_path, text, name="resolved.yaml"))
    assert again == cfg
    assert type(again) is COMMANDS[command]


def test_derived_sizes() -> None:
    def passes(config: training.TrainingConfig) -> int:  # forward/backward passes per optimizer step
        return config.minibatch_size // config.effective_micro_batch_size

    ppo = config_from_dict(
        "ppo", with_required("ppo", {"batch": {"size": 64, "micro_size": 4}, "ppo.num_minibatches": 4})
    )
    assert (ppo.minibatch_size, ppo.effective_micro_batch_size, passes(ppo)) == (16, 4, 4)
    ppo_whole = config_from_dict("ppo", with_required("ppo", {"batch.size": 64, "ppo.num_minibatches": 2}))
    assert (ppo_whole.minibatch_size, passes(ppo_whole)) == (32, 1)
    grpo = config_from_dict("grpo", with_required("grpo", {
        "batch": {"size": 4, "micro_size": 2}, "grpo": {"group_size": 4, "num_minibatches": 2},
    }))  # fmt: skip
    assert (grpo.num_sequences, grpo.minibatch_size, passes(grpo)) == (16, 8, 4)
    assert grpo.reward_scaling == "group" and grpo.clip_range_upper == grpo.grpo.clip_range
    assert dataclasses.replace(grpo, grpo=dataclasses.replace(grpo.grpo, estimator="dr_grpo")).reward_scaling == "none"
    sft = config_from_dict("sft", with_required("sft", {"batch": {"size": 32, "micro_size": 8}}))
    assert passes(sft) == 4


def test_defaults_follow_the_references() -> None:
    """PPO defaults of the reference implementations (docs/ppo_checklist.md Part 1 §I); GRPO's of TRL."""
    ppo = config_from_dict("ppo", REQUIRED["ppo"])
    assert (ppo.ppo.epochs, ppo.ppo.clip_range, ppo.ppo.value_clip_range, ppo.ppo.vf_coef) == (4, 0.2, 0.2, 0.1)
    assert (ppo.ppo.gamma, ppo.ppo.lam, ppo.sampling.temperature, ppo.ppo.num_minibatches) == (1.0, 0.95, 0.7, 1)
    assert (ppo.kl.estimator, ppo.kl.add_to, ppo.ppo.whiten_rewards, ppo.ppo.whiten_advantages) == (
        "k1", "reward", False, True,
    )  # fmt: skip
    grpo = config_from_dict("grpo", REQUIRED["grpo"])
    assert (grpo.grpo.group_size, grpo.kl.coef, grpo.sampling.temperature, grpo.grpo.num_iterations) == (8, 0.0, 1.0, 1)
    assert (grpo.grpo.scale_rewards, grpo.grpo.loss_type, grpo.loss_aggregation, grpo.grpo.clip_range_high) == (
        "auto",
        "dapo",  # TRL's default: the clip, token-mean
        "token-mean",
        None,
    )
    assert (grpo.grpo.importance_sampling_level, grpo.grpo.top_entropy_quantile) == ("token", 1.0)
    assert (grpo.grpo.sapo_temperature_pos, grpo.grpo.sapo_temperature_neg) == (1.0, 1.05)  # TRL's


@pytest.mark.parametrize(
    ("loss_type", "objective", "aggregation", "clip_high"),
    [
        ("dapo", "clip", "token-mean", 0.2),
        ("bnpo", "clip", "token-mean", 0.2),
        ("grpo", "clip", "seq-mean-token-mean", 0.2),
        ("dr_grpo", "clip", "seq-mean-token-sum-norm", 0.2),
        ("cispo", "cispo", "token-mean", 4.0),  # a cap of 5 unless clip_range_high says otherwise
        ("sapo", "sapo", "seq-mean-token-mean", 0.2),
    ],
)
def test_grpo_loss_types_translate_trls(loss_type, objective, aggregation, clip_high) -> None:
    grpo = config_from_dict("grpo", REQUIRED["grpo"] | {"grpo": {"loss_type": loss_type}})
    assert (grpo.policy_objective, grpo.loss_aggregation, grpo.clip_range_upper) == (objective, aggregation, clip_high)
    explicit = config_from_dict(
        "grpo", REQUIRED["grpo"] | {"grpo": {"loss_type": loss_type, "loss_aggregation": "seq-mean-token-sum"}}
    )
    assert explicit.loss_aggregation == "seq-mean-token-sum"  # verl's loss_agg_mode overrides
    assert (
        config_from_dict(
            "grpo", REQUIRED["grpo"] | {"grpo": {"loss_type": loss_type, "clip_range_high": 0.28}}
        ).clip_range_upper
        == 0.28
    )
    ppo = config_from_dict("ppo", REQUIRED["ppo"] | {"ppo": {"loss_type": "cispo"}})
    assert (ppo.policy_objective, ppo.loss_aggregation, ppo.clip_range_upper) == ("cispo", "token-mean", 4.0)


# ---------------------------------------------------------------------------------------------------------------
# Every field is documented (tyro shows the string literal under a field as its --help text)
# ---------------------------------------------------------------------------------------------------------------


def _documented_fields(cls: type) -> set[str]:
    """Names of the annotated fields of `cls` followed directly by a string literal in the source."""
    tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    documented = set()
    for statement, following in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
            and following.value.value.strip()
        ):
            documented.add(statement.target.id)
    return documented


def _is_ours(cls: object) -> bool:
    return isinstance(cls, type) and cls.__module__.startswith("rlhf.config.") and dataclasses.is_dataclass(cls)


# every section and command config of the package, public or not (a base class holds fields too)
SECTIONS = list(
    {id(c): c for m in (base, sections, training, commands) for c in vars(m).values() if _is_ours(c)}.values()
)


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda cls: cls.__name__)
def test_every_field_has_a_docstring(cls: type) -> None:
    for klass in cls.__mro__:
        if not _is_ours(klass):
            continue
        own = {name for name in klass.__dict__.get("__annotations__", {}) if name != "COMMAND"}
        assert own <= _documented_fields(klass), f"{klass.__name__}: undocumented {own - _documented_fields(klass)}"


def test_user_facing_field_names_exist() -> None:
    """The field names users write in their configs (README, examples/): renaming one breaks them."""

    def names(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    sections = {"output_dir", "model", "data", "optim", "batch", "run"}
    assert sections | {"sft"} <= names(SFTConfig) and sections | {"rm", "normalize"} <= names(config_module.RMConfig)
    assert sections | {"reward", "sampling", "kl", "ppo"} <= names(PPOConfig)
    assert sections | {"reward", "sampling", "kl", "grpo"} <= names(GRPOConfig)
    assert {"steps", "epochs", "num_minibatches", "critic"} <= names(config_module.PPOSection)
    assert {"steps", "group_size", "estimator"} <= names(config_module.GRPOSection)
    assert {"coef", "estimator", "add_to", "control"} <= names(config_module.KLSection)
    assert {"learning_rate", "scheduler"} <= names(config_module.OptimSection)
    assert {"size", "micro_size", "micro_tokens"} <= names(config_module.PolicyBatch)
    assert SFTConfig.COMMAND == "sft" and GRPOConfig.COMMAND == "grpo"


def test_every_flat_key_of_version_0_1_has_a_home() -> None:
    """Each old key moves to a field that exists, so reading an old file never fails on the move itself."""
    for command, moves in config_module.FLAT_KEYS.items():
        cls = COMMANDS[command]
        for old, targets in moves.items():
            for target in (targets,) if isinstance(targets, str) else targets:
                section, name = target.split(".")
                field = {f.name: f for f in dataclasses.fields(cls)}[section]
                assert name in {f.name for f in dataclasses.fields(field.type)}, (command, old, target)
