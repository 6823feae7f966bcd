"""`rlhf <command> --config FILE.yaml [--<field> <value> ...]` — the command line.

Each command has one config class (`rlhf.config`); its fields come from the class defaults, then the YAML
file, then the flags (last wins), and the merged config is checked before any work starts. The command's
module is imported only then, so ``import rlhf.cli`` (and ``rlhf --help``) never loads torch.

Exit codes: 0 success (and ``--help``), 2 a refused command line or config (one line on stderr, no traceback).
"""

import difflib
import importlib
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from rlhf import __version__
from rlhf.config import COMMANDS, ConfigError, load_config

# Command → (module whose `run(config)` carries it out, one line for `rlhf --help`).
RUNNERS: dict[str, tuple[str, str]] = {
    "sft": ("rlhf.trainers.sft", "supervised fine-tuning on prompt/response pairs or chat messages"),
    "rm": ("rlhf.trainers.reward_model", "train a Bradley–Terry reward model on preference pairs"),
    "ppo": (
        "rlhf.trainers.ppo",
        "PPO against a reward, with a critic and a KL penalty to the reference policy",
    ),
    "grpo": ("rlhf.trainers.grpo", "critic-free GRPO family: GRPO, Dr. GRPO, RLOO, REINFORCE++"),
    "sample": (
        "rlhf.sample",
        "k samples per prompt → candidates, pairs to label, judge-labelled preferences or best-of-N",
    ),
    "eval": (
        "rlhf.evaluate",
        "score a policy on held-out prompts; win rate against a baseline under a judge",
    ),
    "demo": ("rlhf.demo", "a tiny self-contained end-to-end run (no downloads)"),
    "report": ("rlhf.report", "an HTML report of a ppo/grpo run or a demo: curves, reward vs KL, samples"),
}
assert RUNNERS.keys() == COMMANDS.keys()


def usage() -> str:
    """The text of `rlhf --help`: one line per command."""
    width = max(len(name) for name in RUNNERS)
    lines = [
        "usage: rlhf <command> --config FILE.yaml [--<field> <value> ...]",
        "       rlhf report RUN_DIR",
        "",
        "RLHF post-training for causal language models.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {summary}" for name, (_, summary) in RUNNERS.items()),
        "",
        "`rlhf <command> --help` lists every field of the command with its documentation and default.",
        "Fields come from the defaults, then the --config YAML file, then the flags (the last one wins).",
    ]
    return "\n".join(lines)


def split_config_flag(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """(the --config path or None, the remaining flags); accepts ``--config PATH`` and ``--config=PATH``."""
    path: str | None = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--config" or arg.startswith("--config="):
            if path is not None:
                raise ConfigError("--config is given twice; pass one YAML file")
            if arg == "--config":
                if i + 1 >= len(args) or args[i + 1].startswith("--"):
                    raise ConfigError("--config needs a YAML file: --config FILE.yaml")
                path = args[i + 1]
                i += 1
            else:
                path = arg.split("=", 1)[1]
            if not path:
                raise ConfigError("--config needs a YAML file: --config FILE.yaml")
        else:
            rest.append(arg)
        i += 1
    return path, rest


class NotBuiltError(Exception):
    """The command's module is not part of this build."""


def runner(command: str) -> Callable[[Any], Any]:
    """The `run(config)` function of `command`, imported now (its heavy imports happen here, not at startup)."""
    module_name = RUNNERS[command][0]
    try:
        module: ModuleType = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # Only the command's own module being absent means "not built"; a missing dependency inside it is a
        # real error and propagates.
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise NotBuiltError(module_name) from None
        raise
    run = getattr(module, "run", None)
    if not callable(run):
        raise NotBuiltError(module_name)
    return run


def _error(message: str) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _exit_code(exit: SystemExit) -> int:
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run `rlhf` with `argv` (default: sys.argv[1:]); returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(usage(), file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        print(usage())
        return 0
    if args[0] == "--version":
        print(f"rlhf {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command == "report" and rest and not rest[0].startswith("-"):
        rest = ["--run_dir", rest[0], *rest[1:]]  # `rlhf report RUN_DIR`: the one positional argument
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return _error(f"unknown command '{command}'{hint} (commands: {', '.join(COMMANDS)}; see rlhf --help)")
    try:
        path, overrides = split_config_flag(rest)
        config = load_config(command, path, overrides)
    except ConfigError as e:
        return _error(str(e))
    except SystemExit as e:  # tyro printed --help (0) or its own error message (2)
        return _exit_code(e)
    try:
        run = runner(command)
    except NotBuiltError as e:
        return _error(f"rlhf {command}: this command's trainer is not part of this build yet (no module {e})")
    try:
        run(config)
    except ConfigError as e:  # a problem found once the run looked at its inputs (e.g. an unusable model)
        return _error(str(e))
    except Exception as e:
        if not _is_input_error(e):
            raise  # a bug, not the user's input: keep the traceback
        # data and reward errors list file:line / source and sample, one per line: keep the lines
        print(f"error: rlhf {command}: {e}", file=sys.stderr)
        return 2
    return 0


def _is_input_error(error: Exception) -> bool:
    """Errors whose message already says what is wrong with the user's files or reward (no traceback needed)."""
    from rlhf.data.files import DataError  # imported here: `import rlhf.cli` stays free of torch
    from rlhf.rollout.rewards import RewardError

    return isinstance(error, DataError | RewardError | FileNotFoundError)


if __name__ == "__main__":
    raise SystemExit(main())
