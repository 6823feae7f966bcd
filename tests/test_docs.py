"""The README and docs/config.md stay true to the code."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from rlhf.config import PPOConfig

ROOT = Path(__file__).resolve().parents[1]


def _load_tool():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "tools" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_reference_is_up_to_date():
    tool = _load_tool()
    assert (ROOT / "docs" / "config.md").read_text() == tool.render(), "run: python tools/config_reference.py"


def test_readme_names_every_ppo_field_and_metric():
    readme = (ROOT / "README.md").read_text()
    for path, _, _ in _load_tool().field_rows(PPOConfig):
        assert f"`{path}`" in readme, f"README does not mention the ppo field {path}"
    documented_metrics = [
        "step",
        "reward/mean",
        "reward/std",
        "kl/mean",
        "kl/coef",
        "policy/loss",
        "policy/entropy",
        "policy/clipfrac",
        "policy/approx_kl",
        "policy/entropy_masked_fraction",
        "policy/off_policy_masked",
        "value/loss",
        "value/clipfrac",
        "value/explained_variance",
        "advantages/abs_mean",
        "grad/norm",
        "response/length_mean",
        "response/length_max",
        "response/eos_rate",
        "time/rollout_s",
        "time/train_s",
        "time/step_s",
        "throughput/tokens_per_s",
        "rollout/logprob_diff_mean",
        "rollout/logprob_diff_max",
        "rollout/logprob_diff_frac",
        "rollout/is_weight_mean",
        "rollout/is_capped_frac",
        "async/staleness",
        "time/producer_idle_s",
        "episode/turns_mean",
        "episode/tool_calls_mean",
        "episode/tool_errors",
        "episode/truncated",
    ]
    for name in documented_metrics:
        assert f"`{name}`" in readme, f"README does not list the metric {name}"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"```bash\n# run the tests\n(.+)\n", readme).group(1).strip()
    assert command in ci, f"README's test command {command!r} is not what .ci/run runs"


def test_example_configs_load():
    """Every example loads without a warning: examples show the current layout, never the flat keys of 0.1."""
    import warnings

    from rlhf.config import load_config

    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples, "examples/ has no configs"
    for path in examples:
        command = path.stem.split("_")[0]
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            load_config(command, path)  # raises ConfigError naming the field when an example goes stale


def _repo_text_files() -> list[Path]:
    roots = [ROOT / "README.md", *(ROOT / d for d in ("src", "tests", "docs", "examples", "benchmarks", "tools"))]
    files = [r for r in roots if r.is_file()]
    for root in (r for r in roots if r.is_dir()):
        files += [p for p in root.rglob("*") if p.suffix in (".py", ".md", ".yaml", ".yml", ".txt")]
    # hidden directories hold what tools made, not the repository's text (the benchmark's peer venvs and models)
    return [p for p in files if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]


def test_nothing_cites_a_file_outside_the_repository():
    """What the code and docs cite lives in docs/: every ``docs/…`` path named exists, and nothing names the
    design notes the project was started from, which a person who clones the repository does not have."""
    outside = re.compile(r"STYLE\.md|DESIGN\.md|STYLE[ ]principle|\.\./shared/")
    cited = re.compile(r"\bdocs/(?!source/)[\w./-]+\.(?:md|png)")  # docs/source/: TRL's own docs, cited as TRL's
    problems = []
    for path in _repo_text_files():
        text = path.read_text(errors="replace")
        where = path.relative_to(ROOT)
        problems += [f"{where}: cites {m.group(0)!r}" for m in outside.finditer(text)]
        problems += [f"{where}: {m.group(0)} does not exist" for m in cited.finditer(text)
                     if not (ROOT / m.group(0)).exists()]  # fmt: skip
    assert not problems, "\n".join(problems)


def test_the_install_line_names_the_distribution():
    """`pip install rlhf` would give users an unrelated package: the README says the name pyproject.toml builds."""
    import tomllib

    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert name != "rlhf"
    assert f"`pip install {name}`" in (ROOT / "README.md").read_text()
