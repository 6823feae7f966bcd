"""Running the code users bring by name: a callable from a ``path/to/file.py:function`` or ``package.module:function``
spec (reward functions, environments, tools), and their coroutines on rlhf's one event loop."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import ModuleType
from typing import Any


def load_callable(spec: str, what: str, failure: type[Exception]) -> Callable[..., Any]:
    """The callable ``spec`` names: ``path/to/file.py:function`` (relative to the current directory) or
    ``package.module:function``; the attribute may be dotted (``module:Class.method``). ``failure`` raised on any
    failure, its message starting ``{what} {spec!r}`` and naming the file or module, with the original import error,
    or the callables the module does have."""
    target, sep, attribute = spec.rpartition(":")
    if not sep or not target or not attribute:
        raise failure(f"{what} spec {spec!r}: expected `path/to/file.py:function` or `package.module:function`")
    module = (
        _load_file(target, spec, what, failure) if target.endswith(".py") else _load_module(target, spec, what, failure)
    )
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            found = ", ".join(_public_callables(module)) or "none"
            raise failure(f"{what} {spec!r}: {target} has no attribute {attribute!r}; its callables: {found}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise failure(f"{what} {spec!r}: {attribute!r} is a {type(obj).__name__}, not a callable")
    return obj


def _load_file(target: str, spec: str, what: str, failure: type[Exception]) -> ModuleType:
    path = Path(target).expanduser()
    resolved = path.resolve()
    if not resolved.is_file():
        raise failure(f"{what} {spec!r}: no such file {str(path)!r} (looked at {resolved})")
    # A unique module name per file, registered in sys.modules before running it, so dataclasses,
    # pickling and relative lookups inside the file work as in a normally imported module.
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    module_name = f"rlhf_reward_{resolved.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    module_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise failure(f"{what} {spec!r}: {resolved} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[module_name]
        raise failure(f"{what} {spec!r}: importing {resolved} failed: {type(error).__name__}: {error}") from error
    return module


def _load_module(target: str, spec: str, what: str, failure: type[Exception]) -> ModuleType:
    try:
        return importlib.import_module(target)
    except Exception as error:
        hint = ""
        if isinstance(error, ModuleNotFoundError) and os.getcwd() not in sys.path and "" not in sys.path:
            hint = (
                " (the current directory is not on sys.path: use `path/to/file.py:function`, or add the "
                "directory to PYTHONPATH)"
            )
        raise failure(
            f"{what} {spec!r}: cannot import module {target!r}: {type(error).__name__}: {error}{hint}"
        ) from error


def _public_callables(module: ModuleType) -> list[str]:
    """Public callables defined in ``module`` itself (falls back to every public callable)."""
    public = {n: v for n, v in vars(module).items() if callable(v) and not n.startswith("_")}
    own = [n for n, v in public.items() if getattr(v, "__module__", None) == module.__name__]
    return sorted(own or public)


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def run_coroutine(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` to completion on rlhf's one event loop, which lives in a daemon thread for the whole
    process (TRL's ``start_event_loop_in_daemon``): clients an async reward function keeps between calls
    (an ``httpx.AsyncClient``, a semaphore) stay bound to the same loop from batch to batch."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=serve, name="rlhf-reward-loop", daemon=True).start()
            ready.wait()
            _loop = loop
    return asyncio.run_coroutine_threadsafe(coroutine, _loop).result()
