"""A local OpenAI-compatible chat-completions server for the judge tests: real HTTP on 127.0.0.1.

Its judgement is a rule over the answers it is shown, two (a pair) or k (a listwise prompt, ``[Answer 1]`` …):
``longer``: the longer answer wins, or the order longest first; ``first``: always "A", or the order shown, a judge
with pure position bias; or ``rank``, a function of the answers shown. Its manners are set per test: a few
failures first (HTTP 500, a body that is not JSON, a reply slower than the client waits), a reply with no verdict,
an API key it wants.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class StubJudge:
    rule: str = "longer"
    fail_first: int = 0  # this many requests get HTTP 500
    garbage_first: int = 0  # …then this many get a body that is not JSON
    slow_first: int = 0  # …then this many arrive after `slow_seconds`
    slow_seconds: float = 1.0
    status: int | None = None  # every request gets this status (e.g. 401)
    reply: str | None = None  # every request gets this content
    api_key: str | None = None  # required as "Authorization: Bearer <key>"
    delay: float = 0.0
    rank: Callable[[list[str]], str] | None = None  # the reply to k answers shown in this order (listwise)
    requests: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, user: str) -> str:
        if "[Answer 1]\n" in user:  # k answers to rank (rlhf.labelling.listwise)
            return self.order(shown_answers(user))
        first, second = re.search(r"\[Answer A\]\n(.*?)\n\n\[Answer B\]\n(.*?)\n\n", user, re.S).groups()
        if self.rule == "first":
            return "A"
        if len(first) == len(second):
            return "tie"
        return "A" if len(first) > len(second) else "B"

    def order(self, answers: list[str]) -> str:
        """The reply to k answers shown in this order: ``rank`` when given, else by the rule (``longer``: the longest
        first, equal lengths in the order shown; ``first``: the order shown)."""
        if self.rank is not None:
            return self.rank(answers)
        order = (
            range(len(answers)) if self.rule == "first" else sorted(range(len(answers)), key=lambda i: -len(answers[i]))
        )
        return " > ".join(f"[{i + 1}]" for i in order)


def shown_answers(user: str) -> list[str]:
    """The answers of a listwise prompt, in the order shown: each ``[Answer n]`` and its text, up to the
    instructions' paragraph (the answers here hold no blank line)."""
    body = user[user.index("[Answer 1]\n") : user.rindex("\n\n")]
    return re.split(r"\n\n\[Answer \d+\]\n", body.removeprefix("[Answer 1]\n"))


def serve(stub: StubJudge) -> tuple[ThreadingHTTPServer, str]:
    """Start ``stub`` on a free port; returns the server (call ``shutdown()``) and its base URL (``…/v1``)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:  # noqa: N802 (the http.server API)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with stub.lock:
                n = len(stub.requests)
                stub.requests.append({"body": body, "path": self.path, "auth": self.headers.get("Authorization")})
                stub.in_flight += 1
                stub.most_in_flight = max(stub.most_in_flight, stub.in_flight)
            try:
                self.respond(body, n)
            finally:
                with stub.lock:
                    stub.in_flight -= 1

        def respond(self, body: dict[str, Any], n: int) -> None:
            time.sleep(stub.delay)
            if stub.api_key is not None and self.headers.get("Authorization") != f"Bearer {stub.api_key}":
                return self.send(401, b'{"error": {"message": "bad key"}}')
            if stub.status is not None:
                return self.send(stub.status, b'{"error": {"message": "no"}}')
            if n < stub.fail_first:
                return self.send(500, b'{"error": "overloaded"}')
            n -= stub.fail_first
            if n < stub.garbage_first:
                return self.send(200, b"<html>502 Bad Gateway</html>")
            n -= stub.garbage_first
            if n < stub.slow_first:
                time.sleep(stub.slow_seconds)
            content = stub.reply if stub.reply is not None else stub.answer(body["messages"][-1]["content"])
            reply = {"id": f"cmpl-{n}", "object": "chat.completion", "model": body["model"],
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}  # fmt: skip
            self.send(200, json.dumps(reply).encode())

        def send(self, status: int, data: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting (a timeout test)
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"
