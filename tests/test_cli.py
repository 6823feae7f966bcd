"""`rlhf <command> --config FILE.yaml [--<field> <value> ...]`: help, dispatch, exit codes, light import.

Most checks call `main(argv)` in-process; three run a real process (the console script / `python -m rlhf`)
where only a process can tell: the import of torch, the help of the installed entry point, no traceback.
"""

import dataclasses
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from configs import merged
from rlhf import cli
from rlhf.config import COMMANDS, ConfigError, PPOConfig

PPO_REQUIRED = {
    "model": {"name": "models/sft"},
    "reward": {"source": "models/rm"},
    "data": {"train": "p.jsonl"},
    "output_dir": "runs/ppo",
}

# The PPO fields users write in their configs (README, "PPO config fields"): renaming one breaks them.
USER_PPO_FIELDS = [
    "model.name", "reward.source", "ppo.steps", "sampling.max_new_tokens", "sampling.temperature", "kl.coef",
    "run.eval_every", "run.save_every", "ppo.epochs", "ppo.num_minibatches", "ppo.critic", "output_dir",
    "run.seed", "optim.learning_rate", "batch.size", "data.train", "data.eval",
]  # fmt: skip


def run_process(*args: str) -> subprocess.CompletedProcess[str]:
    # 80 columns: one column of help (wider, tyro lays sections side by side and the flat text interleaves them)
    env = {"COLUMNS": "80", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)


def flatten_help(text: str) -> str:
    """Help text without rich's box drawing and line wrapping, for substring checks."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def write_config(tmp_path: Path, **fields: object) -> Path:
    """The required PPO fields with `fields` (dotted keys, as ``**{"ppo.steps": 3}``) on top, as a YAML file."""
    path = tmp_path / "ppo.yaml"
    path.write_text(yaml.safe_dump(merged(PPO_REQUIRED, fields)))
    return path


@pytest.fixture
def fake_runner(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Point `rlhf ppo` at a stand-in module whose run(config) records the config it was given."""
    received: list[object] = []
    module = types.ModuleType("rlhf_test_fake_ppo")
    module.run = received.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rlhf_test_fake_ppo", module)
    monkeypatch.setitem(cli.RUNNERS, "ppo", ("rlhf_test_fake_ppo", cli.RUNNERS["ppo"][1]))
    return received


# ---------------------------------------------------------------------------------------------------------------
# Help
# ---------------------------------------------------------------------------------------------------------------


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: rlhf <command> --config FILE.yaml" in out
    for command in COMMANDS:
        assert re.search(rf"^  {command}\s+\S", out, re.MULTILINE), command


def test_no_arguments_prints_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "usage: rlhf <command>" in capsys.readouterr().err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_command_help_lists_every_field_with_its_default(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([command, "--help"]) == 0
    out = flatten_help(capsys.readouterr().out)
    assert f"rlhf {command}" in out and "--config FILE.yaml" in out
    for field in dataclasses.fields(COMMANDS[command]):
        assert f"--{field.name}" in out, field.name
    assert "(default:" in out


def test_ppo_help_of_the_installed_command_documents_the_design_fields() -> None:
    result = run_process(sys.executable, "-m", "rlhf", "ppo", "--help")
    assert result.returncode == 0, result.stderr
    out = flatten_help(result.stdout)
    for name in USER_PPO_FIELDS:
        section, _, field = name.rpartition(".")
        holder = {f.name: f.type for f in dataclasses.fields(PPOConfig)}.get(section, PPOConfig)
        assert field in {f.name for f in dataclasses.fields(holder)}, name
        # the flag, then its documentation: the first words of the field's docstring
        match = re.search(rf"--{name} (\S+ )?(.*?)(\(default|\(required)", out)
        assert match, f"--{name} missing from rlhf ppo --help"
        assert len(match.group(2).split()) >= 3, f"--{name} has no documentation"
    assert "--config FILE.yaml" in out


def test_help_shows_the_yaml_values_as_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ppo", "--config", str(write_config(tmp_path, **{"ppo.steps": 123})), "--help"]) == 0
    assert re.search(r"--ppo.steps INT .*?\(default: 123\)", flatten_help(capsys.readouterr().out))


# ---------------------------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------------------------


def test_dispatch_passes_the_merged_config_to_run(tmp_path: Path, fake_runner: list[object]) -> None:
    path = write_config(
        tmp_path, **{"batch.size": 8, "ppo.num_minibatches": 3}
    )  # invalid in the file, fixed by the flag
    assert cli.main(["ppo", "--config", str(path), "--ppo.num_minibatches", "2", "--ppo.steps", "5"]) == 0
    (config,) = fake_runner
    assert isinstance(config, PPOConfig)
    assert (config.batch.size, config.ppo.num_minibatches, config.steps, config.model.name) == (8, 2, 5, "models/sft")


def test_config_flag_with_equals_sign(tmp_path: Path, fake_runner: list[object]) -> None:
    assert cli.main(["ppo", f"--config={write_config(tmp_path, **{'ppo.steps': 9})}"]) == 0
    assert fake_runner[0].steps == 9  # type: ignore[attr-defined]


def test_missing_trainer_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.RUNNERS, "ppo", ("rlhf.trainers._not_built_for_this_test", "x"))
    assert cli.main(["ppo", "--config", str(write_config(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "rlhf ppo: this command's trainer is not part of this build yet" in err


def test_a_missing_dependency_inside_a_trainer_is_not_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "rlhf_test_broken_trainer.py").write_text("import rlhf_test_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.RUNNERS, "ppo", ("rlhf_test_broken_trainer", "x"))
    assert cli.main(["ppo", "--config", str(write_config(tmp_path))]) == 1  # not "not built": an internal error
    assert "No module named 'rlhf_test_no_such_dependency'" in capsys.readouterr().err
    with pytest.raises(ModuleNotFoundError, match="rlhf_test_no_such_dependency"):
        cli.main(["ppo", "--config", str(write_config(tmp_path)), "--debug"])


# ---------------------------------------------------------------------------------------------------------------
# Errors: exit code 2, one line on stderr, no traceback
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["ppx"], "unknown command 'ppx'; did you mean 'ppo'?"),
        (["ppo"], "missing required fields output_dir, model.name, data.train, reward.source"),
        (["ppo", "--config"], "--config needs a YAML file"),
        (["ppo", "--config", "a.yaml", "--config", "b.yaml"], "--config is given twice"),
        (["ppo", "--config", "/nonexistent/run.yaml"], "does not exist"),
    ],
)
def test_refusals_exit_2_with_one_line(args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("fields", "flags", "expected"),
    [
        ({"kl.coeff": 0.1}, [], "unknown key 'kl.coeff'; did you mean 'kl.coef'?"),
        ({"batch.size": "eight"}, [], "batch.size='eight': input should be a valid integer"),
        ({"batch.size": 8, "ppo.num_minibatches": 3}, [], "ppo.num_minibatches=3 does not divide batch.size=8"),
        ({}, ["--optim.learning_rate", "-1"], "optim.learning_rate=-1.0: input should be greater than 0"),
        ({"reward.source": [{"source": "a.py:f"}, {"source": "b.py:f"}]}, [], "give each reward a distinct `name`"),
    ],
)
def test_config_refusals_exit_2_before_any_work(
    tmp_path: Path,
    fields: dict[str, object],
    flags: list[str],
    expected: str,
    fake_runner: list[object],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["ppo", "--config", str(write_config(tmp_path, **fields)), *flags]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1
    assert fake_runner == []  # refused before the run started


@pytest.mark.parametrize(
    "flags", [["--kl.estimator", "k4"], ["--ppo.steps", "many"], ["--no_such_field", "1"], ["--model.lora", "[1"]]
)
def test_malformed_flags_exit_2(
    tmp_path: Path, flags: list[str], fake_runner: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["ppo", "--config", str(write_config(tmp_path)), *flags]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert fake_runner == []


def test_console_script_error_has_no_traceback(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "rlhf"
    command = [str(script)] if script.exists() else [shutil.which("rlhf") or "rlhf"]
    result = run_process(*command, "ppo", "--config", str(write_config(tmp_path, **{"kl.coeff": 0.1})))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: ppo: {tmp_path / 'ppo.yaml'}: unknown key 'kl.coeff'; did you mean 'kl.coef'?"
    ]


# ---------------------------------------------------------------------------------------------------------------
# Light import
# ---------------------------------------------------------------------------------------------------------------


def test_import_rlhf_cli_does_not_import_torch() -> None:
    code = "import sys, rlhf.cli, rlhf.config; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = run_process(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_bad_data_is_reported_without_a_traceback(
    tmp_path: Path, tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "fine"}\n{"prompt": 3}\n')
    path = write_config(
        tmp_path, **{"model.name": str(tiny_llama_dir), "data.train": str(data), "reward.source": "r.py:f"}
    )
    (tmp_path / "r.py").write_text("def f(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    assert (
        cli.main(["ppo", "--config", str(path), "--reward.source", f"{tmp_path / 'r.py'}:f", "--run.no_progress"]) == 2
    )
    err = capsys.readouterr().err
    assert f'error: rlhf ppo: {data}:2: "prompt" must be a non-empty string, got int' in err
    assert "Traceback" not in err


def test_a_bug_inside_a_run_is_one_line_and_its_traceback_is_behind_debug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(config: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "runner", lambda command: broken)
    assert cli.main(["ppo", "--config", str(write_config(tmp_path))]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: rlhf ppo: internal error: ZeroDivisionError: a bug (at ")
    assert "test_cli.py:" in err and "rerun with --debug" in err and "Traceback" not in err
    with pytest.raises(ZeroDivisionError):  # --debug, anywhere on the line: the full traceback
        cli.main(["--debug", "ppo", "--config", str(write_config(tmp_path))])


def test_debug_raises_config_errors_with_their_traceback(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'kl.coeff'"):
        cli.main(["ppo", "--config", str(write_config(tmp_path, **{"kl.coeff": 0.1})), "--debug"])


def test_console_script_bug_is_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "rlhf_test_buggy.py").write_text("def run(config):\n    return 1 / 0\n")
    code = (
        f"import sys; sys.path[:0] = [{str(Path(cli.__file__).parents[1])!r}, {str(tmp_path)!r}]; "
        "from rlhf import cli; cli.RUNNERS['ppo'] = ('rlhf_test_buggy', 'x'); sys.exit(cli.main(sys.argv[1:]))"
    )
    args = ["ppo", "--config", str(write_config(tmp_path))]
    result = run_process(sys.executable, "-c", code, *args)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "internal error: ZeroDivisionError: division by zero" in result.stderr
    result = run_process(sys.executable, "-c", code, *args, "--debug")
    assert result.returncode == 1 and "Traceback (most recent call last)" in result.stderr


# ---------------------------------------------------------------------------------------------------------------
# Library noise: quiet unless --verbose
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "quiet"), [([], True), (["--verbose"], False)])
def test_libraries_are_quiet_during_a_run_unless_verbose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], quiet: bool
) -> None:
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    seen: list[tuple[bool, int, bool]] = []

    def run(config: object) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn_explicit("deprecated", FutureWarning, "x.py", 1, module="transformers.x")
            warnings.warn_explicit("ours", UserWarning, "y.py", 1, module="rlhf_test_ours")
        messages = [str(w.message) for w in caught]
        seen.append(
            (hf_logging.is_progress_bar_enabled(), logging.getLogger("transformers").level, "deprecated" in messages)
        )
        assert "ours" in messages

    monkeypatch.setattr(cli, "runner", lambda command: run)
    before = (hf_logging.is_progress_bar_enabled(), logging.getLogger("transformers").level)
    assert cli.main(["ppo", "--config", str(write_config(tmp_path)), *flags]) == 0
    bars, level, library_warning = seen[0]
    assert bars is not quiet and (level == logging.ERROR) is quiet and library_warning is not quiet
    assert (hf_logging.is_progress_bar_enabled(), logging.getLogger("transformers").level) == before  # restored


def test_version_names_the_libraries_a_run_depends_on(capsys):
    """`rlhf --version`: rlhf's, then each installed library's, without importing any (the CLI stays light)."""
    import torch
    import transformers

    assert cli.main(["--version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "rlhf 0.1.0"
    assert f"torch {torch.__version__}" in lines and f"transformers {transformers.__version__}" in lines
