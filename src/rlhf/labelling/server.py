"""The labelling web server: one page, a small JSON API, and the checks that make it safe to open to a network.

The routes and the safety checks (token, loopback host, JSON bodies of at most `MAX_BODY` bytes, a 4xx with a one-line
reason for bad input) are described for users in docs/labelling.md ("The API", "Safe by default"). A label or ranking is
answered ``{"saved": true, …}`` only after its line is fsynced (`LabelSession.label`, `LabelSession.rank`). Every answer is built from data, never
from markup: the page inserts texts with ``textContent``, so model output that looks like HTML shows as text."""

from __future__ import annotations

import html
import ipaddress
import json
import secrets
import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from rlhf.data.labels import RATINGS
from rlhf.labelling.pairs import Pair
from rlhf.labelling.session import LabelSession, Refused, Served, check_labeller, item_of

MAX_BODY = 64 * 1024
"""Largest request body, in bytes (a label is a few hundred)."""
TOKEN_COOKIE = "rlhf_label_token"
STATIC = Path(__file__).parent / "static"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def make_app(session: LabelSession, token: str | None, loopback_only: bool, ratings: bool = True) -> ASGIApp:
    """The ASGI app serving ``session``; `Guard` wraps it with the token, host and size checks."""

    async def page(request: Request) -> Response:
        labeller = request.query_params.get("labeller")
        if labeller is None:
            return HTMLResponse(NAME_PAGE)
        try:
            labeller = check_labeller(labeller)
        except Refused as error:
            return HTMLResponse(
                NAME_PAGE.replace("<!--error-->", f'<p class="error">{html.escape(str(error))}</p>'), 400
            )
        body = LABEL_PAGE.format(
            labeller=html.escape(labeller, quote=True),
            ratings="on" if ratings else "off",
            total=len(session.items) * session.labels_per_pair,
            answers=ANSWERS,
        )
        return HTMLResponse(body)

    async def next_pair(request: Request) -> Response:
        labeller = check_labeller(request.query_params.get("labeller"))
        served = await run_in_threadpool(session.next, labeller)
        progress = await run_in_threadpool(session.progress, labeller)
        if served is None:
            return JSONResponse({"done": True, "progress": progress})
        return JSONResponse({"done": False, **shown(served), "progress": progress})

    async def label(request: Request) -> Response:
        body = await read_json(request)
        fields = ("labeller", "pair", "label", "id", "left", "seconds", "ratings")  # LabelSession.label's arguments
        row = await run_in_threadpool(session.label, *(body.get(field) for field in fields))
        progress = await run_in_threadpool(session.progress, row["labeller"])
        return JSONResponse({"saved": True, "id": row["id"], "kind": row["kind"], "progress": progress})

    async def rank(request: Request) -> Response:
        body = await read_json(request)
        fields = {
            "labeller": "labeller",
            "item_id": "item",
            "ranking": "ranking",
            "label_id": "id",
            "seconds": "seconds",
        }
        row = await run_in_threadpool(lambda: session.rank(**{arg: body.get(key) for arg, key in fields.items()}))
        progress = await run_in_threadpool(session.progress, row["labeller"])
        return JSONResponse({"saved": True, "id": row["id"], "kind": row["kind"], "progress": progress})

    async def undo(request: Request) -> Response:
        body = await read_json(request)
        row = await run_in_threadpool(session.undo, body.get("labeller"), body.get("id"))
        return JSONResponse({"undone": row["id"], "item": item_of(row)})

    async def refused(request: Request, error: Exception) -> Response:
        assert isinstance(error, Refused)
        return JSONResponse({"error": str(error)}, status_code=error.status)

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/favicon.ico", lambda request: Response(status_code=204)),
            Route("/api/next", next_pair),
            Route("/api/label", label, methods=["POST"]),
            Route("/api/rank", rank, methods=["POST"]),
            Route("/api/undo", undo, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        exception_handlers={Refused: refused},
    )
    return Guard(app, token, loopback_only)


def shown(served: Served) -> dict[str, Any]:
    """What the page gets of a served item: a pair (``a``, ``b`` and the side on the left, as always), or an item to
    rank with its answers already in the order shown (``shown``: their indices in the item)."""
    item = served.item
    if isinstance(item, Pair):
        pair = dict(id=item.id, prompt=item.prompt, a=item.a, b=item.b, left=served.left, label_id=served.label_id)
        return {"pair": pair}
    answers = [item.answers[i] for i in served.shown]
    ranked = dict(id=item.id, prompt=item.prompt, answers=answers, shown=list(served.shown), label_id=served.label_id)
    return {"rank": ranked}


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object: 415 unless JSON, 413 beyond `MAX_BODY`, 400 when malformed."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise Refused(415, "send the body as JSON (Content-Type: application/json)")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise Refused(413, f"the body is larger than {MAX_BODY} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY:
            raise Refused(413, f"the body is larger than {MAX_BODY} bytes")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise Refused(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object")
    return body


class Guard:
    """ASGI middleware: the access token, the Host header (loopback binding) and the security headers."""

    def __init__(self, app: ASGIApp, token: str | None, loopback_only: bool):
        self.app, self.token, self.loopback_only = app, token, loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        from_query = request.query_params.get("token")
        refusal = None
        if self.loopback_only and _host_name(request.headers.get("host", "")) not in LOOPBACK_NAMES:
            refusal = PlainTextResponse("unknown host: this server answers to 127.0.0.1 and localhost", 421)
        elif self.token is not None:
            given = from_query or request.headers.get("x-label-token") or request.cookies.get(TOKEN_COOKIE) or ""
            if not secrets.compare_digest(given.encode(), self.token.encode()):
                message = "this labelling server needs its access token: open the URL `rlhf label` printed (…?token=…)"
                refusal = PlainTextResponse(message, 401)
        if refusal is not None:
            refusal.headers.update(SECURITY_HEADERS)
            await refusal(scope, receive, send)
            return

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                if self.token is not None and from_query:  # keep the token for the page's own requests
                    cookie = f"{TOKEN_COOKIE}={quote(self.token)}; Path=/; HttpOnly; SameSite=Strict"
                    headers.append((b"set-cookie", cookie.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host.split("]")[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); port 0 picks a free one. OSError names the address when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise OSError(
            f"cannot listen on {host}:{port}: {error.strerror}; choose another --port (0 = any free one)"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


NAME_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>rlhf label</title><link rel="stylesheet" href="/static/label.css"></head>
<body class="name-page">
<main><h1>Which answer is better?</h1>
<p>You will see a prompt and two answers, and pick the better one; or several answers, and put them in order.
Your labels are saved under your name.</p>
<!--error-->
<form method="get" action="/" id="name-form">
<label for="labeller">Your name</label>
<input id="labeller" name="labeller" required maxlength="40" autocomplete="nickname" autofocus>
<button type="submit">Start labelling</button>
</form></main>
<script src="/static/label.js"></script>
</body></html>
"""

RATING_BUTTONS = "".join(
    f'<button type="button" data-rating="{word}" title="{word}">{icon}<span class="word">{word}</span></button>'
    for word, icon in zip(RATINGS, ("👍", "😐", "👎"), strict=True)
)
ANSWERS = "".join(  # each answer: its heading, the box its text goes in, its rating buttons
    f"""    <article class="answer" id="{side}" aria-label="answer {n}">
      <h2>Answer {n}</h2><div class="text"></div>
      <div class="rating" data-side="{side}" role="group" aria-label="rate answer {n}">
        {RATING_BUTTONS}
      </div>
    </article>
"""
    for side, n in (("left", 1), ("right", 2))
)

LABEL_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>rlhf label</title><link rel="stylesheet" href="/static/label.css"></head>
<body data-labeller="{labeller}" data-ratings="{ratings}">
<header>
  <span class="who">Labelling as <b>{labeller}</b> · <a href="/">not you?</a></span>
  <span id="progress" class="progress">0 / {total}</span>
  <span id="status" class="status" role="status" aria-live="polite"></span>
</header>
<main id="work">
  <section id="prompt" class="prompt" aria-label="prompt"></section>
  <div class="answers pair-only">
{answers}  </div>
  <p class="hint rank-only">Tap the answers from best to worst, or press their numbers. Tap a ranked answer to take
  it out; <b>= tie</b> ties an answer with the one ranked just above it.</p>
  <div id="candidates" class="candidates rank-only" aria-label="answers to rank"></div>
  <nav class="choices">
    <p id="rank-order" class="rank-order rank-only" aria-live="polite"></p>
    <button type="button" class="pair-only" id="choose-left" data-choice="left"><kbd>1</kbd> Answer 1 is better</button>
    <button type="button" class="pair-only" id="choose-right" data-choice="right"><kbd>2</kbd> Answer 2 is better</button>
    <button type="button" class="pair-only" id="tie" data-choice="tie"><kbd>t</kbd> Tie</button>
    <button type="button" class="rank-only" id="submit-ranking"><kbd>Enter</kbd> Submit ranking</button>
    <button type="button" class="rank-only" id="rank-back"><kbd>⌫</kbd> Back one</button>
    <button type="button" class="rank-only" id="rank-clear"><kbd>c</kbd> Clear</button>
    <button type="button" id="skip" data-choice="skip"><kbd>s</kbd> Skip</button>
    <button type="button" id="undo"><kbd>u</kbd> Undo last</button>
  </nav>
</main>
<section id="done" class="done" hidden>
  <h1>All done — thank you!</h1>
  <p id="done-summary"></p>
  <button type="button" id="done-undo"><kbd>u</kbd> Undo my last label</button>
</section>
<script src="/static/label.js"></script>
</body></html>
"""
