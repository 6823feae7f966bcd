"""kill -9 of `rlhf label` while a client labels, many times over: no acknowledged label is lost or doubled."""

from __future__ import annotations

import http.client
import random
import signal
import threading
import urllib.error
from collections import Counter

import pytest
from label_servers import call, read_lines, start_process, write_pairs

CYCLES = 12
PAIRS = 300

pytestmark = pytest.mark.slow


def test_kill_9_between_and_during_labels_loses_and_doubles_nothing(tmp_path):
    pairs, out = write_pairs(tmp_path / "pairs.jsonl", PAIRS), tmp_path / "prefs.jsonl"
    rng = random.Random(0)
    acked: list[str] = []
    pending: dict | None = None  # a label sent whose reply never came: sent again after the restart
    kills_mid_request = 0  # how often the kill cut a label's request (timing: reported, not asserted)
    last_sent: dict = {}
    for _cycle in range(CYCLES):
        process, url = start_process(pairs, out)
        base = url.rstrip("/")
        if acked:  # as if the reply of the last label had been lost: sent again, it is saved once
            status, reply = call(base, "/api/label", last_sent)
            assert status == 200 and reply["id"] == acked[-1], reply
        killer = threading.Timer(rng.uniform(0.05, 0.6), process.send_signal, args=(signal.SIGKILL,))
        killer.start()
        try:
            while True:
                if pending is None:
                    status, served = call(base, "/api/next?labeller=ana", timeout=5)
                    assert status == 200, served
                    if served["done"]:
                        break
                    pair = served["pair"]
                    pending = {"labeller": "ana", "pair": pair["id"], "label": rng.choice(["a", "b", "tie", "skip"]),
                               "id": pair["label_id"], "left": pair["left"], "seconds": 1.0}  # fmt: skip
                status, reply = call(base, "/api/label", pending, timeout=5)
                assert status == 200, reply
                acked.append(reply["id"])
                last_sent, pending = pending, None
        # a kill can also land between a reply's headers and its body (IncompleteRead): no reply either way
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError):
            kills_mid_request += pending is not None
        finally:
            killer.cancel()
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            process.stdout.close()
            process.stderr.close()
    # One last, clean run finishes the work, then the file is checked line by line.
    process, url = start_process(pairs, out)
    try:
        base = url.rstrip("/")
        if pending is not None:
            acked.append(call(base, "/api/label", pending)[1]["id"])
        while not (served := call(base, "/api/next?labeller=ana")[1])["done"]:
            pair = served["pair"]
            body = {"labeller": "ana", "pair": pair["id"], "label": "a", "id": pair["label_id"], "left": pair["left"]}
            acked.append(call(base, "/api/label", body)[1]["id"])
    finally:
        process.terminate()
        process.wait(10)
    rows = read_lines(out)  # every line parses: no torn line was left in the file
    labels = [row for row in rows if row["kind"] != "session"]
    counts = Counter(row["id"] for row in labels)
    assert len(acked) == len(set(acked))
    assert set(acked) == set(counts), "every acknowledged label is in the file, and nothing else"
    assert max(counts.values()) == 1, "none twice"
    assert Counter(row["pair"] for row in labels).most_common(1)[0][1] == 1  # each pair labelled once by ana
    assert len(labels) == PAIRS and sum(row["kind"] == "session" for row in rows) == 1
    print(f"{CYCLES} kills, {kills_mid_request} in the middle of a label's request; {len(acked)} labels acknowledged")
