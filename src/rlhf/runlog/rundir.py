"""The run directory belongs to one run at a time, and a finished run is never replaced without being asked.

Every training command runs inside :func:`claims_output_dir`, which does all of :func:`claim` before any model loads;
what users see of it is the README's "Run directory". The lock is an ``fcntl.flock``, which the kernel drops when the
process dies: a killed run never leaves a stale lock. The old run is removed (:func:`clear_run`) only once the new one
has loaded its models, so an ``--overwrite`` run that fails at start-up leaves it as it was. Files rewritten during a
run go through :func:`atomic_open` / :func:`staged` (a temp file or directory in the same directory, fsynced, renamed
into place, the directory fsynced): a crash leaves the old or the new version, never a torn one."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml

from rlhf import __version__, library_versions
from rlhf.config import CommandConfig, ConfigError, TrainingConfig, config_to_yaml
from rlhf.runlog import distributed
from rlhf.runlog.checkpoint import fsync_dir, list_checkpoints, load_checkpoint

LOCK_FILE = ".rlhf.lock"
"""In ``output_dir``: the file a run holds an exclusive ``flock`` on; it holds the holder's pid."""

RUN_ENTRIES = (
    "config.yaml",
    "metrics.jsonl",
    "checkpoints",
    "samples",
    "final",
    "tensorboard",
    "normalization.jsonl",
    "report.html",
    "doctor.jsonl",
    "members",
)
"""What a training run writes into ``output_dir`` (``members``: a reward-model ensemble's member runs): its presence
means "a run is here"; ``overwrite`` removes exactly these (and nothing else, so ``output_dir: .`` never loses the
user's own files)."""

SAFE_ON_RESUME = frozenset(
    # how long it runs, and whether it continues or replaces
    {"ppo.steps", "grpo.steps", "sft.epochs", "rm.epochs", "run.resume", "run.overwrite"}
    # how often it logs, evaluates and saves, where metrics and the doctor's alarms go
    | {"run.eval_every", "run.save_every", "run.log_every", "run.progress", "run.report_to", "run.name"}
    | {"doctor.alarms", "doctor.stop_on"}
    # how the work is split into passes (the same math)
    | {"run.parallelism", "batch.micro_size", "batch.micro_tokens", "model.compile"}
    # what memory the run may plan on (the machine may have changed)
    | {"run.memory_budget_gib", "run.ignore_memory_plan"}
    # where the run lives: a run directory moved or copied elsewhere resumes there
    | {"output_dir"}
)
"""Fields that may differ between a run and its ``--resume``. Any other change would silently make the resumed
run a different one, so it is refused."""

F = TypeVar("F", bound=Callable[..., Any])


# Claiming output_dir: usable, locked, not someone else's finished run
def claims_output_dir(run: F) -> F:
    """Decorate a trainer's ``run(config)``: claim ``config.output_dir`` (:func:`claim`) for the whole call."""

    @functools.wraps(run)
    def wrapper(config: CommandConfig, *args: Any, **kwargs: Any) -> Any:
        d = distributed.current()
        if not d.is_main:  # under torchrun rank 0 claims the directory; the others hear whether it could
            if refused := d.broadcast(None):
                raise ConfigError(refused)
            return run(config, *args, **kwargs)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(claim(config))
            except ConfigError as e:
                d.broadcast(str(e))
                raise
            d.broadcast("")
            return run(config, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def claim(config: CommandConfig, entries: tuple[str, ...] = RUN_ENTRIES) -> Iterator[Path]:
    """Usable directory, lock, refusal of existing work, resume check — everything before any work starts;
    ``entries``: the names whose presence means "a run is here" (the demo has its own)."""
    out = Path(config.output_dir)
    where = f"{config.COMMAND}: "
    created = not out.exists()
    ensure_directory(out, f"{where}output_dir")
    with lock(out, f"{where}output_dir"):
        try:
            remove_leftovers(out, entries)
            found = [name for name in entries if (out / name).exists()]
            settings = getattr(config, "run", config)  # a trainer's run section, or the demo's own fields
            resume, overwrite = getattr(settings, "resume", False), settings.overwrite
            if found and not (resume or overwrite):
                flag = "--run." if settings is not config else "--"
                resume_hint = f"pass {flag}resume to continue it or " if hasattr(settings, "resume") else "pass "
                raise ConfigError(
                    f"{where}output_dir {str(out)!r} already holds a run ({', '.join(found)}); {resume_hint}"
                    f"{flag}overwrite to replace it, or choose another output_dir"
                )
            if resume and found:
                check_resumable(out, config, where)
            yield out
        except BaseException:
            # a run that fails before writing anything (bad data, a missing model) leaves no directory it created
            if created and [p.name for p in out.iterdir()] == [LOCK_FILE]:
                (out / LOCK_FILE).unlink()
                out.rmdir()
            raise


def ensure_directory(path: Path, name: str) -> None:
    """Create ``path`` if needed; ConfigError naming ``name`` when it is a file or cannot be written."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{name} {str(path)!r} is a file, not a directory; give a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{name} {str(path)!r} cannot be created: {e.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{name} {str(path)!r} is not writable; give a directory you can write to")


@contextlib.contextmanager
def lock(directory: Path, name: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``directory/.rlhf.lock``; ConfigError naming the holder's pid if taken."""
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(
            f"{name} {str(directory)!r} is not writable ({e.strerror}); give a directory you can write to"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ConfigError(
                f"{name} {str(directory)!r} is in use by another run (pid {holder}); wait for it to finish or "
                "choose another output_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def remove_leftovers(out: Path, entries: tuple[str, ...] = RUN_ENTRIES) -> None:
    """Delete the temp files and directories of a killed run (``.<entry>.*.tmp``, see :func:`atomic_open`); only
    called with the lock held, so nobody else can be writing them."""
    for name in entries:
        for path in out.glob(f".{name}.*.tmp"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def clear_run(out: Path, entries: tuple[str, ...] = RUN_ENTRIES) -> None:
    """Remove the previous run's entries (checkpoints, metrics, final/, …), so nothing stale survives."""
    for name in entries:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    fsync_dir(out)


def check_outputs(config: CommandConfig, outputs: dict[str, str | Path | None]) -> None:
    """Before any work: refuse each output file (field name → path; None = not written) that exists unless
    ``config.overwrite``, is a directory, or has a directory that cannot be written. It is written later through
    :func:`atomic_open` with ``replace=config.overwrite``, which refuses a file another process wrote meanwhile."""
    where = f"{config.COMMAND}: "
    for field, path in outputs.items():
        if path is None:
            continue
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"{where}{field} {str(path)!r} is a directory; give a file")
        if path.exists() and not config.overwrite:
            raise ConfigError(
                f"{where}{field} {str(path)!r} already exists; pass --overwrite to replace it, or choose another file"
            )
        ensure_directory(path.parent, f"{where}{field}'s directory")


# Resume: the same config, a checkpoint that loads
def check_resumable(out: Path, config: CommandConfig, where: str) -> None:
    """Refuse a resume that cannot continue: a finished run without checkpoints, or a changed config."""
    if not list_checkpoints(out):
        if (out / "final").exists():
            raise ConfigError(
                f"{where}resume: the run in {str(out)!r} finished without a checkpoint to continue from "
                "(run.save_every: 0?); pass --run.overwrite instead of --run.resume to run it again"
            )
        return  # nothing to continue: the run starts afresh (open_run says so)
    if changed := config_changes(out / "config.yaml", config):
        from rlhf.config import config_to_dict, flat_config

        safe = sorted(
            SAFE_ON_RESUME.intersection(flat_config(config_to_dict(config))) - {"run.resume", "run.overwrite"}
        )
        raise ConfigError(
            f"{where}resume: the config differs from the run's {out / 'config.yaml'} in "
            + "; ".join(changed)
            + f". Only {', '.join(safe)} may change on resume; "
            "restore the others, or pass --run.overwrite instead of --run.resume to start a new run"
        )


def config_changes(recorded: Path, config: CommandConfig) -> list[str]:
    """``field: old → new`` for every field outside :data:`SAFE_ON_RESUME` that differs from ``recorded``. The recorded
    file is read as a config of the same command, so a field added since the run was recorded counts as its default, and
    a run recorded with the flat keys of version 0.1 compares field by field."""
    from rlhf.config import config_from_dict, config_to_dict, flat_config

    if not recorded.is_file():
        return []  # a run from before config.yaml was written: nothing to compare with
    text = recorded.read_text()
    if not text.startswith(f"# rlhf {config.COMMAND}:"):
        return [f"command: {text.removeprefix('# rlhf ').partition(':')[0] or '?'} → {config.COMMAND}"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the run's own file, written by an older rlhf
            old = flat_config(config_to_dict(config_from_dict(config.COMMAND, yaml.safe_load(text) or {})))
    except (yaml.YAMLError, ConfigError) as e:
        raise ConfigError(f"{config.COMMAND}: resume: cannot read {recorded}: {e}") from None
    new = flat_config(config_to_dict(config))
    return [
        f"{name}: {old.get(name)!r} → {value!r}"
        for name, value in new.items()
        if name not in SAFE_ON_RESUME and old.get(name) != value
    ]


def load_resume_checkpoint(config: TrainingConfig) -> tuple[Path | None, dict[str, Any] | None]:
    """The newest checkpoint of ``config.output_dir`` that loads, and its state; (None, None) without resume. A
    checkpoint whose ``state.pt`` cannot be read (a disk filled mid-write on a filesystem that renamed it anyway, a
    truncated copy) is skipped with a message on stderr and the one before it is used."""
    if not config.run.resume:
        return None, None
    d = distributed.current()
    # rank 0 picks the checkpoint (loading it), every other rank loads that one (output_dir is shared storage)
    chosen, state = _pick_resume_checkpoint(config) if d.is_main else (None, None)
    chosen = d.broadcast(chosen)
    if chosen is not None and state is None:
        state = load_checkpoint(chosen)
    return chosen, state


def _pick_resume_checkpoint(config: TrainingConfig) -> tuple[Path | None, dict[str, Any] | None]:
    out = Path(config.output_dir)
    found = list_checkpoints(out)
    for path in reversed(found):
        try:
            return path, load_checkpoint(path)
        except Exception as e:  # torch.load raises RuntimeError, EOFError, UnpicklingError, … on a torn file
            print(
                f"resume: checkpoint {path} cannot be loaded ({type(e).__name__}: {e}); "
                "falling back to the one before it",
                file=sys.stderr,
            )
    if found:
        raise ConfigError(
            f"{config.COMMAND}: resume: none of the {len(found)} checkpoints under {out / 'checkpoints'} can "
            "be loaded; pass --run.overwrite instead of --run.resume to start afresh"
        )
    return None, None


# Atomic writes
@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", replace: bool = True) -> Iterator[IO[Any]]:
    """Write ``path`` through a temp file in its directory, renamed into place when the block succeeds.
    ``replace=False`` publishes with a hard link, which fails if ``path`` appeared meanwhile (another process wrote it):
    ConfigError then, and that file is left alone."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path)
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _publish_new(tmp: str, path: Path) -> None:
    """Rename ``tmp`` to ``path`` unless ``path`` exists: a hard link is the atomic "create, never replace"."""
    try:
        os.link(tmp, path)
    except OSError as e:  # FileExistsError; or no hard links here: check, then rename (a narrow race, not a torn file)
        if isinstance(e, FileExistsError) or path.exists():
            raise ConfigError(f"{str(path)!r} was written by another process meanwhile; left as it is") from None
        os.replace(tmp, path)
    else:
        os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


@contextlib.contextmanager
def staged(target: Path) -> Iterator[Path]:
    """``with staged(out / "final") as tmp: save(tmp)`` — ``save`` writes ``tmp / "final"``, which then replaces
    ``out / "final"`` whole: a crash while saving leaves the previous ``final/`` (or none). The old directory is
    moved aside first (rename cannot replace a non-empty directory), then deleted."""
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        yield staging
        new = staging / target.name
        if not new.is_dir():
            raise RuntimeError(f"nothing was saved to {new}")
        for path in new.rglob("*"):
            if path.is_file():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        old = staging / (target.name + ".old")
        if target.exists():
            os.replace(target, old)
        os.replace(new, target)
        fsync_dir(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_run_config(output_dir: Path, config: CommandConfig) -> None:
    """``config.yaml``: the run's whole config, every default filled in (what ``--run.resume`` compares with); its
    second line, a comment, names the versions of rlhf and the libraries it ran with (the first names the command)."""
    versions = ", ".join(f"{name} {version}" for name, version in {"rlhf": __version__, **library_versions()}.items())
    command, rest = config_to_yaml(config).split("\n", 1)
    atomic_write_text(output_dir / "config.yaml", f"{command}\n# {versions}\n{rest}")
