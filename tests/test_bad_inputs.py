"""The bad-input corpus: every command ends a bad input with one message naming the field or ``file:line``.

Each case runs ``rlhf.cli.main`` in-process on real files and the tiny fixture models, and checks the exit
code (2), that stderr starts with ``error:``, holds the expected text (the field or the file and line, and
what is wrong) and has no traceback. Most cases fail before any weights load (`rlhf.inputs`, data
validation), so the whole table runs in seconds. Cases already in tests/test_cli.py (unknown keys, wrong
types, divisibility, the invalid ``"prompt": 3`` line) are not repeated here.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlhf import cli
from rlhf.config import ConfigError

# What a valid run of each command looks like; a case appends flags (the last value of a flag wins).
BASE = {
    "ppo": "ppo --model.name {policy} --reward.source {fn} --data.train {prompts} --output_dir {tmp}/out --ppo.steps 1 "
    "--batch.size 2 --sampling.max_new_tokens 2 --run.no_progress",
    "grpo": "grpo --model.name {policy} --reward.source {fn} --data.train {prompts} --output_dir {tmp}/out --grpo.steps 1 "
    "--batch.size 2 --grpo.group_size 2 --sampling.max_new_tokens 2 --run.no_progress",
    "sft": "sft --model.name {policy} --data.train {sft} --output_dir {tmp}/out --sft.epochs 1 --run.no_progress",
    "rm": "rm --model.name {policy} --data.train {prefs} --output_dir {tmp}/out --rm.epochs 1 --run.no_progress",
    "sample": "sample --model.name {policy} --prompts {prompts} --output {tmp}/out.jsonl --num_samples 1 "
    "--sampling.max_new_tokens 2 --no_progress",
    "eval": "eval --model.name {policy} --eval_data {prompts} --reward.source {fn} --output {tmp}/eval.json "
    "--sampling.max_new_tokens 2 --no_progress",
}

PROMPTS = b'{"prompt": "what is 1 + 2?"}\n{"prompt": "what is 3 + 4?"}\n'
REWARD_PY = b"def f(prompts, completions, **columns):\n    return [float(len(c)) for c in completions]\n"


@dataclass(frozen=True)
class Case:
    """``rlhf <BASE[command]> <flags>`` after writing ``files`` (name → bytes) and running ``setup``."""

    command: str
    flags: str
    expected: str  # formatted with the same placeholders as the command line
    files: dict[str, bytes] = field(default_factory=dict)
    setup: str | None = None


def _model_copy(tmp: Path, policy: Path) -> Path:
    return Path(shutil.copytree(policy, tmp / "model"))


def _truncate_weights(tmp: Path, policy: Path) -> None:
    weights = _model_copy(tmp, policy) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _garbage_weights(tmp: Path, policy: Path) -> None:
    (_model_copy(tmp, policy) / "model.safetensors").write_bytes(b"\x89PNG not tensors at all" * 10)


def _no_tokenizer(tmp: Path, policy: Path) -> None:
    model = _model_copy(tmp, policy)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()


def _broken_config(tmp: Path, policy: Path) -> None:
    (_model_copy(tmp, policy) / "config.json").write_text('{"model_type": "llama",')


def _unknown_model_type(tmp: Path, policy: Path) -> None:
    config = _model_copy(tmp, policy) / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "llama9000"}))


def _missing_shard(tmp: Path, policy: Path) -> None:
    model = _model_copy(tmp, policy)
    (model / "model.safetensors").unlink()
    index = {"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))


SETUPS: dict[str, Callable[[Path, Path], None]] = {
    "truncated weights": _truncate_weights,
    "garbage weights": _garbage_weights,
    "no tokenizer": _no_tokenizer,
    "broken config.json": _broken_config,
    "missing shard": _missing_shard,
    "unknown model_type": _unknown_model_type,
}

NOT_UTF8 = b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n'

CASES: dict[str, Case] = {
    # --- data files -------------------------------------------------------------------------------------
    "prompts not UTF-8 (latin-1)": Case(
        "ppo", "--data.train {tmp}/p.jsonl", "{tmp}/p.jsonl:2: not UTF-8 text (byte 0xe9 at column 16)",
        {"p.jsonl": NOT_UTF8},
    ),
    "prompts UTF-16": Case(
        "sample", "--prompts {tmp}/p.jsonl", "{tmp}/p.jsonl:1: not UTF-8 text (byte 0xff at column 1)",
        {"p.jsonl": '{"prompt": "x"}\n'.encode("utf-16")},
    ),
    "sft JSON not UTF-8": Case(
        "sft", "--data.train {tmp}/d.json", "{tmp}/d.json:3: not UTF-8 text",
        {"d.json": b'[\n {"prompt": "a", "response": "b"},\n {"prompt": "\xff", "response": "c"}\n]\n'},
    ),
    "malformed JSON line": Case(
        "grpo", "--data.train {tmp}/p.jsonl", "{tmp}/p.jsonl:2: invalid JSON",
        {"p.jsonl": b'{"prompt": "a"}\n{"prompt": "b"\n'},
    ),
    "preference missing a field": Case(
        "rm", "--data.train {tmp}/prefs.jsonl", '{tmp}/prefs.jsonl:1: missing "rejected" (keys present: prompt, chosen)',
        {"prefs.jsonl": b'{"prompt": "a", "chosen": "b"}\n'},
    ),
    "sft response of the wrong type": Case(
        "sft", "--data.train {tmp}/d.jsonl", '{tmp}/d.jsonl:1: "response" must be a non-empty string, got int',
        {"d.jsonl": b'{"prompt": "a", "response": 7}\n'},
    ),
    "empty prompts file": Case(
        "eval", "--eval_data {tmp}/e.jsonl", "{tmp}/e.jsonl: the file holds no records", {"e.jsonl": b"\n\n"},
    ),
    "data file of an unknown type": Case(
        "ppo", "--data.train {tmp}/p.txt", "{tmp}/p.txt: unsupported file type '.txt'", {"p.txt": b"hello\n"},
    ),
    "data file that does not exist": Case(
        "sample", "--prompts {tmp}/nope.jsonl", "{tmp}/nope.jsonl: no such file or directory",
    ),
    # --- config values ----------------------------------------------------------------------------------
    "config file not UTF-8": Case(
        "ppo", "--config {tmp}/c.yaml", "config file '{tmp}/c.yaml' is not UTF-8 text", {"c.yaml": b"seed: \xe9\n"},
    ),
    "temperature 0": Case("grpo", "--sampling.temperature 0", "sampling.temperature=0.0: input should be greater than 0"),
    "preferences without a judge": Case("sample", "--mode preferences --num_samples 2", "mode='preferences' needs a judge"),
    "judge without a baseline": Case("eval", "--judge.source {fn}", "judge decides the win rate against baseline"),
    "empty stop_token": Case("ppo", "--sampling.stop ''", "sampling.stop='': string should have at least 1 character"),
    # --- model paths ------------------------------------------------------------------------------------
    "policy: no such directory": Case(
        "ppo", "--model.name ./nope", "ppo: model.name='./nope': no such directory ({cwd}/nope)"
    ),
    "policy: hub id, offline": Case(
        "grpo", "--model.name org/no-such-model", "grpo: model.name='org/no-such-model': no local directory"
    ),
    "policy: a file": Case("sample", "--model.name {prompts}", "sample: model.name='{prompts}' is a file"),
    "model: a directory that is not a model": Case(
        "sft", "--model.name {tmp}", "sft: model.name='{tmp}': {tmp} is not a model directory (no config.json)"
    ),
    "model: a reward model where a causal LM is needed": Case(
        "sft", "--model.name {rm}", "sft: model.name='{rm}' is a sequence classifier (LlamaForSequenceClassification)"
    ),
    "policy: truncated safetensors": Case(
        "ppo", "--model.name {tmp}/model", "ppo: model.name='{tmp}/model': {tmp}/model/model.safetensors is corrupt",
        setup="truncated weights",
    ),
    "model: garbage safetensors": Case(
        "rm", "--model.name {tmp}/model", "rm: model.name='{tmp}/model': {tmp}/model/model.safetensors is corrupt",
        setup="garbage weights",
    ),
    "policy: no tokenizer": Case(
        "eval", "--model.name {tmp}/model", "eval: model.name='{tmp}/model': {tmp}/model has no tokenizer",
        setup="no tokenizer",
    ),
    "policy: broken config.json": Case(
        "ppo", "--model.name {tmp}/model", "{tmp}/model/config.json is not valid JSON", setup="broken config.json"
    ),
    "policy: unknown model_type": Case(
        "sample", "--model.name {tmp}/model", "has model type `llama9000` but Transformers does not recognize",
        setup="unknown model_type",
    ),
    "policy: a shard is missing": Case(
        "grpo", "--model.name {tmp}/model", "lists model-00001-of-00002.safetensors, which is missing",
        setup="missing shard",
    ),
    "baseline: no such directory": Case(
        "eval", "--baseline /no/such/baseline", "eval: baseline='/no/such/baseline': no such directory"
    ),
    "normalize_policy: hub id, offline": Case(
        "rm", "--normalize.policy nobody/nothing", "rm: normalize.policy='nobody/nothing': no local directory"
    ),
    "reward: a causal LM is not a reward model": Case(
        "ppo", "--reward.source {policy}", "ppo: reward.source='{policy}' has 2 outputs (num_labels)"
    ),
    "reward[1].source: no such model": Case(
        "grpo", "--reward.source '[{fn}, {{source: ./no_rm, weight: 0.5}}]'", "grpo: reward.source[1].source='./no_rm': no such directory"
    ),
    "judge: not a model directory": Case(
        "sample", "--mode preferences --num_samples 2 --judge.source {tmp}", "sample: judge.source='{tmp}': {tmp} is not a model directory"
    ),
    # --- reward functions -------------------------------------------------------------------------------
    "reward: no such file": Case("ppo", "--reward.source {tmp}/nope.py:f", "ppo: reward.source='{tmp}/nope.py:f': no such file"),
    "reward: no such function": Case(
        "eval", "--reward.source {tmp}/r.py:g", "eval: reward.source='{tmp}/r.py:g': {tmp}/r.py has no attribute 'g'; its callables: f"
    ),
    "reward: no such module": Case(
        "grpo", "--reward.source no_such_module_xyz:f", "grpo: reward.source='no_such_module_xyz:f'"
    ),
    "reward: a .py file without a function": Case("ppo", "--reward.source {tmp}/r.py", "names a file but no function"),
    # --- stop_token -------------------------------------------------------------------------------------
    "stop_token of several tokens (ppo)": Case(
        "ppo", "--sampling.stop 'the end'", "sampling.stop='the end' is 5 tokens for the policy's tokenizer (270='the', 226='Ġ'"
    ),
    "stop_token of several tokens (sample)": Case(
        "sample", "--sampling.stop 'xyz xyz'", "it must be exactly one token: 'eos' (the tokenizer's '<|eos|>')"
    ),
}  # fmt: skip


@pytest.fixture
def placeholders(tmp_path: Path, tiny_llama_dir: Path, tiny_reward_model_dir: Path, monkeypatch) -> dict[str, str]:
    """The values of {tmp}, {policy}, … with valid data files and a reward function written in tmp_path."""
    monkeypatch.chdir(tmp_path)
    # no network: a hub id fails at once (and the same way on every machine) instead of after retries
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    (tmp_path / "prompts.jsonl").write_bytes(PROMPTS)
    (tmp_path / "sft.jsonl").write_text('{"prompt": "what is 1 + 2?", "response": " 3"}\n' * 4)
    (tmp_path / "prefs.jsonl").write_text('{"prompt": "what is 1 + 2?", "chosen": " 3", "rejected": " 4"}\n' * 4)
    (tmp_path / "r.py").write_bytes(REWARD_PY)
    return {
        "tmp": str(tmp_path), "cwd": str(tmp_path), "policy": str(tiny_llama_dir), "rm": str(tiny_reward_model_dir),
        "prompts": str(tmp_path / "prompts.jsonl"), "sft": str(tmp_path / "sft.jsonl"),
        "prefs": str(tmp_path / "prefs.jsonl"), "fn": f"{tmp_path / 'r.py'}:f",
    }  # fmt: skip


def argv(case: Case, values: dict[str, str]) -> list[str]:
    return shlex.split(f"{BASE[case.command]} {case.flags}".format(**values))


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_naming_the_field_or_file(
    name: str, placeholders: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES[name]
    tmp = Path(placeholders["tmp"])
    for file, content in case.files.items():
        (tmp / file).write_bytes(content)
    if case.setup:
        SETUPS[case.setup](tmp, Path(placeholders["policy"]))
    code = cli.main(argv(case, placeholders))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: "), err
    assert case.expected.format(**placeholders) in " ".join(err.split()), err
    assert "Traceback" not in err


def test_debug_shows_the_traceback_of_a_bad_input(placeholders: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="model.name='./nope'"):
        cli.main([*argv(CASES["policy: no such directory"], placeholders), "--debug"])


# ---------------------------------------------------------------------------------------------------------------
# Inputs that run, with a warning of ours (printed even though the libraries are kept quiet)
# ---------------------------------------------------------------------------------------------------------------

LONG = b'{"prompt": "what is 1 + 2? and then what is 3 + 4? and after that what is 5 + 6?"}\n'


def test_overlong_prompts_are_counted_once_on_stderr(
    placeholders: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp = Path(placeholders["tmp"])
    (tmp / "long.jsonl").write_bytes(PROMPTS + LONG)
    flags = "--prompts {tmp}/long.jsonl --sampling.max_prompt_length 12".format(**placeholders)
    assert cli.main([*shlex.split(BASE["sample"].format(**placeholders)), *shlex.split(flags)]) == 0
    err = capsys.readouterr().err
    expected = f"warning: {tmp}/long.jsonl: 1 of 3 prompts are longer than sampling.max_prompt_length=12 tokens"
    assert err.count(expected) == 1, err
    assert "keep only their last tokens" in err
    assert "Loading weights" not in err and "Traceback" not in err


def test_sft_examples_cut_to_max_length_are_counted(
    placeholders: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    long = Path(placeholders["tmp"]) / "long.jsonl"
    long.write_text(
        '{"prompt": "count", "response": " 1 2 3 4 5 6 7 8 9 10 11 12"}\n' + Path(placeholders["sft"]).read_text()
    )
    flags = ["--data.train", str(long), "--data.max_length", "12", "--batch.size", "5"]
    assert cli.main([*shlex.split(BASE["sft"].format(**placeholders)), *flags]) == 0
    err = capsys.readouterr().err
    assert f"warning: {long}: 1 of 5 examples are longer than data.max_length=12 tokens" in err
