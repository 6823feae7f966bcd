"""The labelling server over real HTTP on 127.0.0.1: refusals, the token, and many labellers at once."""

from __future__ import annotations

import json
import threading
import urllib.parse
import urllib.request
from collections import Counter

import pytest
from label_servers import call, label_next, read_lines, server_thread, start_process, write_pairs

from rlhf.labelling.server import MAX_BODY


@pytest.fixture
def files(tmp_path):
    return write_pairs(tmp_path / "pairs.jsonl", 6, hostile=True), tmp_path / "prefs.jsonl"


def test_a_label_round_trip_and_its_reply_after_the_line_is_on_disk(files):
    pairs, out = files
    with server_thread(pairs, out) as base:
        status, reply = label_next(base, "ana", "left")
        assert status == 200 and reply["saved"] is True and reply["progress"]["done"] == 1
        assert read_lines(out)[-1]["id"] == reply["id"]  # already in the file when the reply arrives
        status, page = call(base, "/?labeller=ana")
        assert status == 200 and 'data-labeller="ana"' in page


def test_bad_requests_get_4xx_and_nothing_is_written(files):
    pairs, out = files
    with server_thread(pairs, out) as base:
        _, served = call(base, "/api/next?labeller=ana")
        good = {"labeller": "ana", "pair": served["pair"]["id"], "label": "a", "id": served["pair"]["label_id"],
                "left": "a"}  # fmt: skip
        cases = {
            "not JSON": (dict(raw=b"{label: a"), 400),
            "a list": (dict(raw=b"[1, 2]"), 400),
            "not UTF-8": (dict(raw=b'{"a": "\xff"}'), 400),
            "oversized": (dict(raw=json.dumps(good | {"pad": "x" * MAX_BODY}).encode()), 413),
            "form post": (dict(body=good, headers={"Content-Type": "application/x-www-form-urlencoded"}), 415),
            "unknown pair": (dict(body=good | {"pair": "0" * 16}), 404),
            "bad label": (dict(body=good | {"label": "<script>"}), 422),
            "bad labeller": (dict(body=good | {"labeller": "a" * 200}), 400),
            "no labeller": (dict(body={k: v for k, v in good.items() if k != "labeller"}), 400),
        }
        for name, (kwargs, status) in cases.items():
            got, reply = call(base, "/api/label", **kwargs)
            assert got == status, (name, reply)
            assert "error" in reply, name
        assert call(base, "/api/undo", {"labeller": "ana"})[0] == 409  # nothing to undo
        assert call(base, "/api/next")[0] == 400
        assert call(base, "/api/next?labeller=%3Cscript%3E")[0] == 400
        assert call(base, "/nowhere")[0] == 404
        assert call(base, "/api/label")[0] == 405  # GET on a POST route
        assert call(base, "/api/next?labeller=ana", headers={"Host": "evil.example:80"})[0] == 421  # DNS rebinding
        status, page = call(base, "/?labeller=%3Cscript%3Ealert(1)%3C/script%3E")
        assert status == 400 and "<script>alert" not in page
    assert [line["kind"] for line in read_lines(out)] == ["session"]


def test_every_reply_carries_the_security_headers(files):
    pairs, out = files
    with server_thread(pairs, out) as base:
        with urllib.request.urlopen(base + "/?labeller=ana") as response:
            policy = response.headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        with urllib.request.urlopen(base + "/static/label.js") as response:
            assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_off_loopback_every_request_needs_the_token(files):
    pairs, out = files
    process, url = start_process(pairs, out, "--host", "0.0.0.0")
    try:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
        token = query["token"][0]
        assert len(token) >= 20
        base = url.split("?")[0].rstrip("/")
        for route in ("/", "/?labeller=ana", "/api/next?labeller=ana", "/static/label.js", "/nowhere"):
            assert call(base, route)[0] == 401, route
            assert call(base, route, token="wrong-token")[0] == 401, route
        assert call(base, "/api/label", {"labeller": "ana"})[0] == 401
        assert call(base, "/api/next?labeller=ana", token=token)[0] == 200
        assert call(base, f"/api/next?labeller=ana&token={token}")[0] == 200
        with urllib.request.urlopen(f"{base}/?labeller=ana&token={token}") as response:
            cookie = response.headers["Set-Cookie"]
        assert cookie.startswith(f"rlhf_label_token={token}") and "HttpOnly" in cookie
        assert call(base, "/api/next?labeller=ana", headers={"Cookie": cookie.split(";")[0]})[0] == 200
    finally:
        process.terminate()
        process.wait(10)
    assert [line["kind"] for line in read_lines(out)] == ["session"]


def test_eight_labellers_at_once_lose_and_duplicate_nothing(tmp_path):
    pairs, out = write_pairs(tmp_path / "pairs.jsonl", 60), tmp_path / "prefs.jsonl"
    acked: dict[str, list[str]] = {}
    errors: list[str] = []

    def labeller(name: str) -> None:
        mine = acked.setdefault(name, [])
        while True:
            status, reply = label_next(base, name, ["left", "right", "tie", "skip"][len(mine) % 4])
            if status != 200:
                errors.append(f"{name}: {status} {reply}")
                return
            if reply.get("done"):
                return
            mine.append(reply["id"])

    with server_thread(pairs, out, labels_per_pair=3) as base:
        threads = [threading.Thread(target=labeller, args=(f"labeller{i}",)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not errors
    rows = [row for row in read_lines(out) if row["kind"] != "session"]
    ids = Counter(row["id"] for row in rows)
    sent = [label_id for ids_ in acked.values() for label_id in ids_]
    assert len(sent) == len(set(sent))  # every acknowledgement is a distinct label
    assert set(sent) == set(ids) and max(ids.values()) == 1  # 0 lost, 0 duplicated
    per_pair = Counter((row["pair"], row["labeller"]) for row in rows)
    assert max(per_pair.values()) == 1  # never twice to one labeller
    decided = Counter(row["pair"] for row in rows if row["kind"] != "skip")
    assert max(decided.values()) <= 3  # leases kept labellers off pairs that had their labels
    assert sum(min(n, 3) for n in decided.values()) == sum(decided.values())
