"""Helpers of the labelling tests: pairs files, a label server in a thread or a process, and its JSON API."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from rlhf.labelling.pairs import read_items
from rlhf.labelling.server import bind, make_app
from rlhf.labelling.session import LabelSession

HOSTILE = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'">'


def write_pairs(path: Path, n: int, hostile: bool = False) -> Path:
    """``n`` distinct {prompt, a, b} rows; ``hostile``: the first answer of the first pair is live HTML."""
    rows = [{"prompt": f"Question number {i}: what is {i} + {i}?", "a": f"It is {2 * i}.", "b": f"Maybe {2 * i + 1}."}
            for i in range(n)]  # fmt: skip
    if hostile:
        rows[0]["a"] = HOSTILE
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_candidates(path: Path, n: int, k: int) -> Path:
    """``n`` {prompt, completions} rows of ``k`` answers each, in a scrambled order; answer text ``grade g`` is better
    the higher g (`gold_order` gives the best-first indices)."""
    rows = [{"prompt": f"Item {i}: say something good.", "completions": [f"Item {i}, grade {((k - 1) * j + i) % k}."
             for j in range(k)]} for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def grade(text: str) -> int:
    """The grade a `write_candidates` answer says it has."""
    return int(text.rsplit("grade ", 1)[1].rstrip("."))


def gold_order(answers: list[str]) -> list[int]:
    """Indices of ``answers`` (written by `write_candidates`), best first."""
    return sorted(range(len(answers)), key=lambda i: -grade(answers[i]))


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def call(base: str, route: str, body: Any = None, *, token: str | None = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, Any]:  # fmt: skip
    """(status, JSON reply or text) of a GET (no body) or a JSON POST to ``base + route``."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(base.rstrip("/") + route, data=data, method="GET" if data is None else "POST")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("X-Label-Token", token)
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def label_next(base: str, labeller: str, choice: str = "left", **fields: Any) -> tuple[int, Any]:
    """Fetch ``labeller``'s next pair and label it: left/right (the side shown), tie or skip."""
    status, served = call(base, f"/api/next?labeller={labeller}")
    assert status == 200, served
    if served["done"]:
        return status, served
    pair = served["pair"]
    right = "b" if pair["left"] == "a" else "a"
    label = {"left": pair["left"], "right": right}.get(choice, choice)
    body = {"labeller": labeller, "pair": pair["id"], "label": label, "id": pair["label_id"], "left": pair["left"],
            "seconds": 1.5} | fields  # fmt: skip
    return call(base, "/api/label", body)


@contextlib.contextmanager
def server_thread(pairs: Path, out: Path, *, token: str | None = None, loopback: bool = True,
                  labels_per_pair: int = 1, mode: str = "auto") -> Iterator[str]:  # fmt: skip
    """A label server in this process on a free port, reading ``pairs`` in ``label.mode`` ``mode``; yields its base
    URL."""
    session = LabelSession(read_items(pairs, mode=mode), out, labels_per_pair=labels_per_pair)
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(make_app(session, token, loopback), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        session.close()


def start_process(pairs: Path, out: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """``rlhf label PAIRS --out OUT --port 0 ARGS`` as a process; returns it and the URL it printed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "rlhf", "label", str(pairs), "--out", str(out), "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http://"):
        process.kill()
        raise AssertionError(f"rlhf label printed no URL: {url!r}; stderr: {process.communicate()[1]}")
    return process, url
