"""Config dataclasses and `load_config`: YAML in, precedence defaults < YAML < flags, refusals, round trip.

Everything here is in-process and takes milliseconds; the subprocess checks live in test_cli.py.
"""

import ast
import dataclasses
import inspect
import math
from pathlib import Path

import pytest
import yaml

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
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    load_config,
)

# The least each command needs (its required fields).
REQUIRED: dict[str, dict[str, object]] = {
    "sft": {"model": "models/base", "train_data": "data/sft.jsonl", "output_dir": "runs/sft"},
    "rm": {"model": "models/sft", "train_data": "data/prefs.jsonl", "output_dir": "runs/rm"},
    "ppo": {
        "policy": "models/sft",
        "reward": "models/rm",
        "train_data": "data/p.jsonl",
        "output_dir": "runs/ppo",
    },
    "grpo": {
        "policy": "models/sft",
        "reward": "rewards.py:score",
        "train_data": "p.jsonl",
        "output_dir": "runs/g",
    },
    "sample": {"policy": "models/sft", "prompts": "data/p.jsonl", "output": "samples.jsonl"},
    "eval": {"policy": "runs/ppo/final", "eval_data": "data/heldout.jsonl", "reward": "models/rm"},
    "demo": {},
    "report": {"run_dir": "runs/ppo"},
}


def write_yaml(tmp_path: Path, data: object, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return path


def ppo_yaml(tmp_path: Path, **fields: object) -> Path:
    return write_yaml(tmp_path, {**REQUIRED["ppo"], **fields})


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
        tmp_path, "policy: m\nreward: r\ntrain_data: d\noutput_dir: o\nlearning_rate: 1e-5\nkl_coef: 1\n"
    )
    cfg = load_config("ppo", path)
    assert isinstance(cfg, PPOConfig)
    assert cfg.learning_rate == 1e-5 and isinstance(cfg.learning_rate, float)
    assert cfg.kl_coef == 1.0 and isinstance(cfg.kl_coef, float)
    assert (cfg.policy, cfg.reward, cfg.train_data, cfg.output_dir) == ("m", "r", "d", "o")


def test_precedence_defaults_then_yaml_then_command_line(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, steps=7, ppo_epochs=2)
    cfg = load_config("ppo", path, ["--ppo_epochs", "3"])
    assert cfg.kl_coef == PPOConfig.__dataclass_fields__["kl_coef"].default  # untouched: the default
    assert cfg.steps == 7  # YAML over the default
    assert cfg.ppo_epochs == 3  # the flag over YAML


def test_command_line_alone_is_enough() -> None:
    cfg = load_config(
        "sft", None, ["--model", "m", "--train_data", "d", "--output_dir", "o", "--epochs", "2"]
    )
    assert (cfg.model, cfg.train_data, cfg.output_dir, cfg.epochs) == ("m", "d", "o", 2)


def test_flags_accept_dashes_and_underscores_and_boolean_pairs(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path)
    cfg = load_config(
        "ppo", path, ["--learning-rate", "2e-6", "--max_new_tokens=16", "--no-progress", "--resume"]
    )
    assert (cfg.learning_rate, cfg.max_new_tokens, cfg.progress, cfg.resume) == (2e-6, 16, False, True)
    assert load_config("ppo", path, ["--no_progress"]).progress is False


def test_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    cfg = load_config("demo", write_yaml(tmp_path, ""))
    assert cfg == DemoConfig()


def test_missing_required_fields_are_named() -> None:
    message = error_of("ppo", None, ["--policy", "m"])
    assert "missing required fields output_dir, train_data, reward" in message
    assert "--reward" in message


# ---------------------------------------------------------------------------------------------------------------
# Refusals in the YAML file: unknown key, wrong type, bad YAML
# ---------------------------------------------------------------------------------------------------------------


def test_unknown_key_names_the_key_the_file_and_the_closest_field(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, kl_coeff=0.1)
    message = error_of("ppo", path)
    assert "unknown key 'kl_coeff'" in message
    assert str(path) in message
    assert "did you mean 'kl_coef'?" in message


def test_unknown_key_of_another_command_says_whose_it_is(tmp_path: Path) -> None:
    message = error_of("ppo", ppo_yaml(tmp_path, group_size=4))
    assert "unknown key 'group_size'" in message and "rlhf grpo" in message


def test_unknown_key_inside_nested_mappings(tmp_path: Path) -> None:
    assert "unknown key 'lora.rank'" in error_of("ppo", ppo_yaml(tmp_path, lora={"rank": 8}))
    message = error_of("ppo", ppo_yaml(tmp_path, reward=[{"source": "a.py:f", "wieght": 2}]))
    assert "unknown key 'reward[0].wieght'; did you mean 'reward[0].weight'?" in message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("batch_size", "eight", "expected an integer, got 'eight'"),
        ("batch_size", 8.5, "expected an integer, got 8.5"),
        ("learning_rate", "fast", "expected a number, got 'fast'"),
        ("resume", "yes", "expected true or false, got 'yes'"),
        ("seed", True, "expected an integer, got True"),
        ("critic", "both", "expected one of 'shared', 'separate', got 'both'"),
        ("report_to", ["jsonl", "mlflow"], "report_to[1]: expected one of 'jsonl', 'tensorboard'"),
        ("lora", 5, "lora: expected a mapping with keys r, alpha, dropout, target_modules or null, got 5"),
        ("reward", 3, "reward: expected a string or a list of"),
        ("eval_data", 3, "eval_data: expected a string or null, got 3"),
    ],
)
def test_wrong_type_names_the_key_the_expected_type_and_the_value(
    tmp_path: Path, key: str, value: object, expected: str
) -> None:
    path = ppo_yaml(tmp_path, **{key: value})
    message = error_of("ppo", path)
    assert message.startswith(f"ppo: {path}: {key}")
    assert expected in message


def test_invalid_yaml_and_non_mapping_and_missing_file(tmp_path: Path) -> None:
    assert "invalid YAML" in error_of("ppo", write_yaml(tmp_path, "policy: [unclosed\n"))
    assert "expected a mapping of field: value" in error_of("ppo", write_yaml(tmp_path, "- a\n- b\n"))
    assert "does not exist" in error_of("ppo", tmp_path / "nope.yaml")


# ---------------------------------------------------------------------------------------------------------------
# Impossible values and combinations (checked in __post_init__, on the final config)
# ---------------------------------------------------------------------------------------------------------------

IMPOSSIBLE = [
    (
        "ppo",
        {"batch_size": 8, "num_minibatches": 3},
        "ppo: num_minibatches=3 does not divide batch_size=8; choose a divisor of 8 (1, 2, 4, 8)",
    ),
    (
        "ppo",
        {"batch_size": 8, "num_minibatches": 2, "micro_batch_size": 3},
        "ppo: micro_batch_size=3 does not divide the minibatch of 4 sequences",
    ),
    ("ppo", {"learning_rate": -1e-5}, "ppo: learning_rate=-1e-05 is out of range; it must be > 0"),
    ("ppo", {"temperature": 0.0}, "ppo: temperature=0.0 is out of range; it must be > 0"),
    ("ppo", {"top_p": 1.5}, "top_p=1.5 is out of range; it must be > 0 and ≤ 1"),
    ("ppo", {"clip_range": 1.5}, "clip_range=1.5 is out of range"),
    ("ppo", {"kl_control": "adaptive", "kl_coef": 0.0}, "kl_control='adaptive' scales kl_coef"),
    ("ppo", {"reward_aggregation": "gdpo"}, "give reward as a list"),
    ("ppo", {"reward": []}, "reward is an empty list"),
    ("ppo", {"reward": "rewards.py"}, "names a file but no function"),
    (
        "ppo",
        {"reward": [{"source": "a.py:score"}, {"source": "b.py:score"}]},
        "ppo: reward[1].name='score' is already used by reward[0]; give each reward a distinct `name`",
    ),
    ("ppo", {"reward": [{"source": "a.py:f", "weight": math.inf}]}, "reward[0].weight=inf is out of range"),
    ("ppo", {"lora": {"r": 0}}, "ppo: lora.r=0 is out of range; it must be ≥ 1"),
    ("ppo", {"report_to": ["jsonl", "jsonl"]}, "names a sink twice"),
    ("grpo", {"group_size": 1}, "grpo: group_size=1 is out of range; it must be ≥ 2"),
    ("grpo", {"estimator": "rloo", "scale_rewards": "batch"}, "applies to estimator='grpo' only"),
    (
        "grpo",
        {"batch_size": 3, "group_size": 2, "num_minibatches": 4},
        "grpo: num_minibatches=4 does not divide the 6 sequences of an iteration",
    ),
    ("grpo", {"overlong_buffer": 300, "max_new_tokens": 256}, "overlong_buffer=300 is out of range"),
    (
        "sft",
        {"batch_size": 10, "micro_batch_size": 4},
        "sft: micro_batch_size=4 does not divide batch_size=10",
    ),
    ("rm", {"epochs": 0}, "rm: epochs=0 is out of range; it must be ≥ 1"),
    ("sample", {"num_samples": 0}, "sample: num_samples=0 is out of range"),
    ("eval", {"top_k": -1}, "eval: top_k=-1 is out of range; it must be ≥ 0"),
    ("demo", {"steps": 0}, "demo: steps=0 is out of range"),
]


@pytest.mark.parametrize(("command", "fields", "expected"), IMPOSSIBLE)
def test_impossible_values_are_refused_with_the_field_named(
    tmp_path: Path, command: str, fields: dict[str, object], expected: str
) -> None:
    path = write_yaml(tmp_path, {**REQUIRED[command], **fields})
    assert expected in error_of(command, path)
    with pytest.raises(ConfigError, match="out of range|divide|adaptive|list|file|name|sink|estimator"):
        config_from_dict(command, {**REQUIRED[command], **fields})


def test_bad_choice_on_the_command_line_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:  # tyro prints the valid choices and exits 2
        load_config("ppo", ppo_yaml(tmp_path), ["--kl_estimator", "k4"])
    assert info.value.code == 2


def test_yaml_invalid_but_fixed_on_the_command_line_succeeds(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, batch_size=8, num_minibatches=3)
    assert "num_minibatches=3" in error_of("ppo", path)
    cfg = load_config("ppo", path, ["--num_minibatches", "2"])
    assert (cfg.num_minibatches, cfg.minibatch_size) == (2, 4)


def test_yaml_valid_but_broken_on_the_command_line_is_refused(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, batch_size=8, num_minibatches=2)
    assert "num_minibatches=2 does not divide batch_size=5" in error_of("ppo", path, ["--batch_size", "5"])


def test_direct_construction_checks_types_and_ranges() -> None:
    with pytest.raises(ConfigError, match="ppo: batch_size: expected an integer, got '8'"):
        PPOConfig(**REQUIRED["ppo"], batch_size="8")  # type: ignore[arg-type]
    cfg = PPOConfig(**REQUIRED["ppo"], batch_size=8)
    with pytest.raises(ConfigError, match="num_minibatches=3 does not divide batch_size=8"):
        dataclasses.replace(cfg, num_minibatches=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 4  # type: ignore[misc]
    with pytest.raises(ConfigError, match=r"lora\.dropout=1\.0 is out of range"):
        LoRAConfig(dropout=1.0)


# ---------------------------------------------------------------------------------------------------------------
# Structured fields: reward (string or list) and lora (mapping)
# ---------------------------------------------------------------------------------------------------------------


def test_reward_as_a_string(tmp_path: Path) -> None:
    cfg = load_config("ppo", ppo_yaml(tmp_path, reward="https://scores.example.com/v1"))
    assert cfg.reward == "https://scores.example.com/v1"


def test_reward_as_a_list_of_mappings(tmp_path: Path) -> None:
    reward = [
        {"source": "models/rm", "weight": 0.5, "name": "helpful"},
        {"source": "rewards.py:length_penalty", "weight": 1},
        "my_pkg.rewards:format_ok",  # a bare source is shorthand for {source: ...}
        {"source": "http://localhost:8000/score", "weight": -0.25},
    ]
    cfg = load_config("grpo", write_yaml(tmp_path, {**REQUIRED["grpo"], "reward": reward}))
    assert cfg.reward == (
        RewardSpec(source="models/rm", weight=0.5, name="helpful"),
        RewardSpec(source="rewards.py:length_penalty", weight=1.0, name="length_penalty"),
        RewardSpec(source="my_pkg.rewards:format_ok", weight=1.0, name="format_ok"),
        RewardSpec(source="http://localhost:8000/score", weight=-0.25, name="localhost"),
    )
    assert all(isinstance(spec.weight, float) for spec in cfg.reward)


def test_reward_on_the_command_line_as_string_or_yaml_list(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, reward=[{"source": "a.py:f"}], reward_aggregation="gdpo")
    cfg = load_config("ppo", path, ["--reward", "[{source: a.py:f, weight: 2}, {source: b.py:g, name: gee}]"])
    assert cfg.reward == (RewardSpec(source="a.py:f", weight=2.0), RewardSpec(source="b.py:g", name="gee"))
    assert load_config("ppo", path, ["--reward", "rm_dir", "--reward_aggregation", "sum"]).reward == "rm_dir"


def test_lora_nested_mapping_in_yaml_and_on_the_command_line(tmp_path: Path) -> None:
    path = ppo_yaml(tmp_path, lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    cfg = load_config("ppo", path)
    assert cfg.lora == LoRAConfig(r=4, alpha=8.0, dropout=0.05, target_modules=("q_proj", "v_proj"))
    assert load_config("ppo", path, ["--lora", "None"]).lora is None  # full fine-tuning
    assert load_config("ppo", path, ["--lora", "{r: 16}"]).lora == LoRAConfig(r=16)
    assert load_config("ppo", ppo_yaml(tmp_path)).lora is None  # the default


# ---------------------------------------------------------------------------------------------------------------
# Round trip and derived sizes
# ---------------------------------------------------------------------------------------------------------------

NON_DEFAULTS: dict[str, dict[str, object]] = {
    "sft": {
        "lora": {"r": 4},
        "micro_batch_size": 8,
        "report_to": ["jsonl", "tensorboard"],
        "eval_data": "e.jsonl",
    },
    "rm": {"center_rewards_coefficient": 0.01, "use_margin": False, "max_grad_norm": None},
    "ppo": {
        "reward": [{"source": "models/rm", "weight": 0.7, "name": "rm"}, "rewards.py:fmt"],
        "reward_aggregation": "gdpo",
        "lora": {"r": 8, "target_modules": ["all-linear"]},
        "batch_size": 16,
        "num_minibatches": 4,
        "micro_batch_size": 2,
        "stop_token": "\n",
        "missing_eos_penalty": 1.0,
        "clip_range_high": 0.28,
        "kl_control": "adaptive",
        "critic": "separate",
        "learning_rate": 1.41e-5,
    },
    "grpo": {"estimator": "dr_grpo", "loss_aggregation": "seq-mean-token-sum-norm", "overlong_buffer": 32},
    "sample": {"judge": [{"source": "models/rm"}], "mode": "best_of_n", "num_samples": 8, "pairing": "all"},
    "eval": {"output": "eval.jsonl", "max_prompts": 100},
    "demo": {"preset": "small", "steps": 3},
    "report": {"output": "out/report.html", "max_samples": 4},
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_config_to_yaml_round_trips(tmp_path: Path, command: str) -> None:
    cfg = load_config(command, write_yaml(tmp_path, {**REQUIRED[command], **NON_DEFAULTS[command]}))
    text = config_to_yaml(cfg)
    assert text.startswith(f"# rlhf {command}:")
    assert yaml.safe_load(text) == config_to_dict(cfg)
    again = load_config(command, write_yaml(tmp_path, text, name="resolved.yaml"))
    assert again == cfg
    assert type(again) is COMMANDS[command]


def test_derived_sizes() -> None:
    ppo = config_from_dict(
        "ppo", {**REQUIRED["ppo"], "batch_size": 64, "num_minibatches": 4, "micro_batch_size": 4}
    )
    assert (ppo.minibatch_size, ppo.effective_micro_batch_size, ppo.grad_accum_steps) == (16, 4, 4)
    ppo_whole = config_from_dict("ppo", {**REQUIRED["ppo"], "batch_size": 64, "num_minibatches": 2})
    assert (ppo_whole.minibatch_size, ppo_whole.grad_accum_steps) == (32, 1)
    grpo = config_from_dict(
        "grpo",
        {**REQUIRED["grpo"], "batch_size": 4, "group_size": 4, "num_minibatches": 2, "micro_batch_size": 2},
    )
    assert (grpo.num_sequences, grpo.minibatch_size, grpo.grad_accum_steps) == (16, 8, 4)
    assert grpo.reward_scaling == "group" and grpo.clip_range_upper == grpo.clip_range
    assert dataclasses.replace(grpo, estimator="dr_grpo").reward_scaling == "none"
    sft = config_from_dict("sft", {**REQUIRED["sft"], "batch_size": 32, "micro_batch_size": 8})
    assert sft.grad_accum_steps == 4


def test_defaults_follow_the_references() -> None:
    """PPO defaults of the reference implementations (ppo_checklist.md Part 1 §I); GRPO's of TRL."""
    ppo = config_from_dict("ppo", REQUIRED["ppo"])
    assert (ppo.ppo_epochs, ppo.clip_range, ppo.value_clip_range, ppo.vf_coef) == (4, 0.2, 0.2, 0.1)
    assert (ppo.gamma, ppo.lam, ppo.temperature, ppo.num_minibatches) == (1.0, 0.95, 0.7, 1)
    assert (ppo.kl_estimator, ppo.kl_in, ppo.whiten_rewards, ppo.whiten_advantages) == (
        "k1",
        "reward",
        False,
        True,
    )
    grpo = config_from_dict("grpo", REQUIRED["grpo"])
    assert (grpo.group_size, grpo.kl_coef, grpo.temperature, grpo.num_iterations) == (8, 0.0, 1.0, 1)
    assert (grpo.scale_rewards, grpo.loss_aggregation, grpo.clip_range_high) == ("auto", "token-mean", None)


# ---------------------------------------------------------------------------------------------------------------
# Every field is documented (tyro shows the string literal under a field as its --help text)
# ---------------------------------------------------------------------------------------------------------------


def _documented_fields(cls: type) -> set[str]:
    """Names of the annotated fields of `cls` followed directly by a string literal in the source."""
    tree = ast.parse(inspect.getsource(config_module))
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


@pytest.mark.parametrize("cls", [*COMMANDS.values(), LoRAConfig, RewardSpec], ids=lambda cls: cls.__name__)
def test_every_field_has_a_docstring(cls: type) -> None:
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass) or klass.__module__ != config_module.__name__:
            continue
        own = {name for name in klass.__dict__.get("__annotations__", {}) if name != "COMMAND"}
        assert own <= _documented_fields(klass), (
            f"{klass.__name__}: undocumented {own - _documented_fields(klass)}"
        )


def test_user_facing_field_names_exist() -> None:
    """The field names users write in their configs (README): renaming one breaks them."""
    training = {"output_dir", "seed", "learning_rate", "batch_size", "train_data", "eval_data"}
    rl = {"policy", "reward", "steps", "max_new_tokens", "temperature", "kl_coef", "eval_every", "save_every"}
    names = {command: {f.name for f in dataclasses.fields(cls)} for command, cls in COMMANDS.items()}
    assert training | {"model", "epochs"} <= names["sft"] & names["rm"]
    assert training | rl | {"reward_aggregation"} <= names["ppo"] & names["grpo"]
    assert {"ppo_epochs", "num_minibatches", "critic"} <= names["ppo"]
    assert {"group_size", "estimator"} <= names["grpo"]
    assert SFTConfig.COMMAND == "sft" and GRPOConfig.COMMAND == "grpo"
