"""`rlhf <command> --config FILE.yaml [--<section>.<field> <value> ...]` — the command line.

The merged config (`rlhf.config`) is checked before any work starts and the command's module is imported only
then, so ``import rlhf.cli`` (and ``rlhf --help``) never loads torch. Exit codes: 0 success (and ``--help``);
2 a refused input (``error: …`` naming the field or ``file:line``, no traceback); 1 an internal error (a bug:
one line, ``--debug`` for the traceback); 130 Ctrl-C; `rlhf doctor` returns its verdict's (`VERDICT_COMMANDS`).
What users see, with ``--debug`` and ``--verbose``: the README's 'Errors, --debug and --verbose'.
"""

import difflib
import importlib
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from rlhf import __version__, library_versions
from rlhf.config import COMMANDS, CommandConfig, ConfigError, load_config

# Command → (module whose `run(config)` carries it out, one line for `rlhf --help`).
RUNNERS: dict[str, tuple[str, str]] = {
    "sft": ("rlhf.trainers.sft", "supervised fine-tuning on prompt/response pairs or chat messages"),
    "rm": ("rlhf.trainers.reward_model", "train a Bradley–Terry reward model on preference pairs"),
    "dpo": ("rlhf.trainers.dpo", "direct preference optimisation on preference pairs: DPO, cDPO, robust, IPO, SimPO"),
    "ppo": ("rlhf.trainers.rl.ppo", "PPO against a reward, with a critic and a KL penalty to the reference policy"),
    "grpo": ("rlhf.trainers.rl.grpo", "critic-free GRPO family: GRPO, Dr. GRPO, RLOO, REINFORCE++"),
    "sample": (
        "rlhf.sample",
        "k samples per prompt → candidates, pairs to label, judge-labelled preferences or best-of-N",
    ),
    "eval": ("rlhf.evaluate", "score a policy on held-out prompts; win rate against a baseline under a judge"),
    "demo": ("rlhf.demo", "a tiny self-contained end-to-end run (no downloads)"),
    "report": ("rlhf.report", "an HTML report of a ppo/grpo run or a demo: curves, reward vs KL, samples"),
    "label": ("rlhf.labelling", "label pairs on a web page (several people) or with an LLM judge; --stats"),
    "doctor": ("rlhf.doctor.checkup", "read a run's metrics: healthy, or the classic RLHF failures and the fix to try"),
}
assert RUNNERS.keys() == COMMANDS.keys()


def usage() -> str:
    """The text of `rlhf --help`: one line per command."""
    width = max(len(name) for name in RUNNERS)
    lines = [
        "usage: rlhf <command> --config FILE.yaml [--<section>.<field> <value> ...]",
        "       rlhf report RUN_DIR    |    rlhf doctor RUN_DIR [--json]",
        "       rlhf label PAIRS.jsonl --out PREFS.jsonl    |    rlhf label --stats PREFS.jsonl",
        "       rlhf plan --config FILE.yaml [--world_size N] [--device_memory_gib G] [--command ppo] [flags]",
        "",
        "RLHF post-training for causal language models.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {summary}" for name, (_, summary) in RUNNERS.items()),
        f"  {'plan':<{width}}  a training config's predicted peak memory per rank, by phase and part (nothing loads)",
        "",
        "`rlhf <command> --help` lists every field of the command with its documentation and default.",
        "Fields come from the defaults, then the --config YAML file, then the flags (the last one wins).",
        "",
        "--debug    show the full traceback of any error (errors are one message otherwise)",
        "--verbose  show the libraries' own progress bars, load reports and warnings",
    ]
    return "\n".join(lines)


def split_config_flag(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """(the --config path or None, the remaining flags); accepts ``--config PATH`` and ``--config=PATH``."""
    path: str | None = None
    rest: list[str] = []
    words = iter(args)
    for arg in words:
        if arg != "--config" and not arg.startswith("--config="):
            rest.append(arg)
            continue
        if path is not None:
            raise ConfigError("--config is given twice; pass one YAML file")
        path = arg.split("=", 1)[1] if "=" in arg else next(words, "")
        if not path or (arg == "--config" and path.startswith("--")):
            raise ConfigError("--config needs a YAML file: --config FILE.yaml")
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


VERDICT_COMMANDS = ("doctor",)
"""Commands whose ``run`` returns their exit code; every other command exits 0 when it succeeds."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run `rlhf` with `argv` (default: sys.argv[1:]); returns the exit code. Long on purpose: every way a
    command can fail becomes its one-line message and exit code here, in one place, so each branch is a case a
    user meets rather than a step of a procedure."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug, verbose = "--debug" in args, "--verbose" in args
    args = [arg for arg in args if arg not in ("--debug", "--verbose")]  # flags of `rlhf` itself, not config fields
    if not args:
        print(usage(), file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        print(usage())
        return 0
    if args[0] == "--version":
        print(f"rlhf {__version__}", *(f"{name} {version}" for name, version in library_versions().items()), sep="\n")
        return 0
    command, rest = args[0], args[1:]
    positional = {"report": "--run_dir", "doctor": "--run_dir", "label": "--pairs"}.get(command)
    if positional and rest and not rest[0].startswith("-"):  # `rlhf report RUN_DIR`, `rlhf label PAIRS.jsonl …`
        rest = [positional, *rest]
    if command == "plan":
        return _plan(rest, debug)
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, [*COMMANDS, "plan"], n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return _error(f"unknown command '{command}'{hint} (commands: {', '.join(COMMANDS)}; see rlhf --help)")
    try:
        path, overrides = split_config_flag(rest)
        config = load_config(command, path, overrides)
    except ConfigError as e:
        if debug:
            raise
        return _error(str(e))
    except UnicodeDecodeError as e:  # the YAML file is read as UTF-8
        if debug:
            raise
        return _error(
            f"{command}: config file {path!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at "
            f"offset {e.start}); save it as UTF-8"
        )
    except SystemExit as e:  # tyro printed --help (0) or its own error message (2)
        return _exit_code(e)
    try:
        result = _run(command, config, verbose)
    except NotBuiltError as e:
        return _error(f"rlhf {command}: this command's trainer is not part of this build yet (no module {e})")
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"rlhf {command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            raise
        if isinstance(e, ConfigError):  # a problem found once the run looked at its inputs (e.g. an unusable model)
            return _error(str(e))
        if not _is_input_error(e):
            return _internal_error(command, e)
        # data and reward errors list file:line / source and sample, one per line: keep the lines
        print(f"error: rlhf {command}: {e}", file=sys.stderr)
        return 2
    return result if command in VERDICT_COMMANDS else 0


PLAN_FLAGS = {"--world_size": int, "--device_memory_gib": float, "--command": str}
"""`rlhf plan`'s own flags (the others are the trainer config's)."""
PLAN_USAGE = """usage: rlhf plan --config FILE.yaml [--world_size N] [--device_memory_gib G] [--command TRAINER] [flags]

The memory plan of a sft, rm, dpo, ppo or grpo config, before anything loads: each rank's predicted peak by phase
and part, what each change (micro_size, gradient checkpointing, a bfloat16 reference, FSDP, LoRA) would make it,
and the cheapest that fits the budget. Exit 0 when it fits, 3 when it does not, 2 for a refused input.

  --world_size N          ranks of the torchrun launch to plan for (default 1)
  --device_memory_gib G   the budget per rank (default: run.memory_budget_gib, else what this machine has free)
  --command TRAINER       the trainer, when the file has no ppo/grpo/dpo/rm/sft section to tell it
  flags                   any field of the trainer's config, as `rlhf TRAINER` takes them (--batch.micro_size 4)"""


def _plan(args: list[str], debug: bool) -> int:
    """`rlhf plan`: the memory plan of a trainer's config (`rlhf.planning.report`); exit 0 when it fits the budget,
    3 when it does not, 2 for a refused input."""
    if any(arg in ("-h", "--help") for arg in args):
        print(PLAN_USAGE)
        return 0
    own: dict[str, Any] = {}
    rest: list[str] = []
    words = iter(args)
    try:
        for arg in words:
            name, _, value = arg.partition("=")
            if name not in PLAN_FLAGS:
                rest.append(arg)
                continue
            own[name] = PLAN_FLAGS[name](value or next(words))
        path, overrides = split_config_flag(rest)
        if path is None:
            raise ConfigError("plan: --config FILE.yaml is required (a sft, rm, dpo, ppo or grpo config)")
        from rlhf import planning
        from rlhf.runlog.progress import quiet_libraries

        command = own.get("--command") or _trainer_of(path)
        if command not in planning.TRAINERS:
            raise ConfigError(f"plan: --command {command!r} is not a trainer; use sft, rm, dpo, ppo or grpo")
        config = load_config(command, path, overrides)

        with quiet_libraries():  # peft's and transformers' warnings while the models are built empty
            text, fits = planning.report(
                config, world_size=own.get("--world_size", 1), device_memory_gib=own.get("--device_memory_gib")
            )
    except (ConfigError, ValueError, StopIteration) as e:
        if debug:
            raise
        return _error(str(e) if not isinstance(e, StopIteration) else "plan: a flag is missing its value")
    print(text)
    return 0 if fits else 3


def _trainer_of(path: str) -> str:
    """The trainer a config file is for, from its own section; ConfigError asking for --command otherwise."""
    import yaml

    from rlhf.planning import command_of

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"plan: cannot read {path}: {e}") from None
    command = command_of(set(data) if isinstance(data, dict) else set())
    if command is None:
        raise ConfigError(
            f"plan: {path} has no ppo/grpo/dpo/rm/sft section to tell its trainer; add --command ppo (or …)"
        )
    return command


def _run(command: str, config: CommandConfig, verbose: bool) -> Any:
    """Run the command (it checks its models first: `rlhf.inputs`) with the libraries kept quiet, and with Hub
    kernels as its ``model.use_kernels`` says (off by default: `rlhf.models.loading.HUB_KERNELS`)."""
    run = runner(command)
    model = getattr(config, "model", None)
    if model is not None:
        from rlhf.models.loading import use_hub_kernels

        use_hub_kernels(model.use_kernels)
    if command in ("report", "label", "doctor") or verbose:  # they load no model: no library to quiet
        return run(config)
    from rlhf.runlog.progress import quiet_libraries

    with quiet_libraries():
        return run(config)


def _internal_error(command: str, error: BaseException) -> int:
    """A bug, not the user's input: one line with the exception and where it was raised; the rest with --debug."""
    frames = traceback.extract_tb(error.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    message = " ".join(f"{type(error).__name__}: {error}".split())
    print(f"error: rlhf {command}: internal error: {message}{at}", file=sys.stderr)
    print(
        "this is a bug in rlhf or a library, not in your input: rerun with --debug for the full traceback",
        file=sys.stderr,
    )
    return 1


def _is_input_error(error: Exception) -> bool:
    """Errors whose message already says what is wrong with the user's files, reward, services or machine (no
    traceback needed): data (file:line), reward sources, multi-turn environments, a server that is down or failing (its URL and each try),
    the OS refusing a path (missing, unreadable, disk full), and a sampling worker that died."""
    from rlhf.data.files import DataError  # imported here: `import rlhf.cli` stays free of torch
    from rlhf.httpclient import ServiceError
    from rlhf.rollout.episodes import EpisodeError
    from rlhf.rollout.rewards import RewardError
    from rlhf.runlog.distributed import WorkerError

    return isinstance(error, DataError | RewardError | EpisodeError | ServiceError | OSError | WorkerError)


def exit_process(code: int) -> None:
    """End the process with ``code``. A ``torchrun`` rank ends with ``os._exit`` once its output is flushed. Why: a
    sharded (FSDP2) run creates a ``DeviceMesh``, which keeps gloo's worker threads alive past
    ``destroy_process_group``; when Python then finalises, it ends those threads with ``pthread_exit`` and the process
    aborts ("terminate called without an active exception", SIGABRT) — a finished run reported as a failed launch, a few
    times in a hundred. Everything the run wrote is closed and fsynced by then; ``os._exit`` skips only the
    interpreter's and libraries' teardown."""
    import os

    if "WORLD_SIZE" not in os.environ:
        raise SystemExit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
