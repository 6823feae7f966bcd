"""A labelling session: which pair each labeller sees next, and every label appended to disk before it counts.

The labels file (`rlhf.data.labels`) is the only state, replayed on start. Each change (a label, an undo) goes through
one lock: the line is appended and fsynced (`rlhf.runlog.durable.AppendLog`), then the in-memory state follows, then the
caller may acknowledge. A label sent twice (a retry after a lost reply) is saved once, by its id. How pairs are served,
leased and placed left or right: docs/labelling.md ("Several labellers", "The page")."""

from __future__ import annotations

import hashlib
import math
import re
import secrets
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlhf import __version__
from rlhf.config import ConfigError
from rlhf.data.files import DataError, read_records
from rlhf.data.labels import LABELS, RATINGS
from rlhf.labelling.pairs import Pair, PairFile
from rlhf.runlog.durable import AlreadyOpen, AppendLog

LABELLER = re.compile(r"^[\w][\w .@-]{0,39}$")
"""A labeller's name: 1–40 letters, digits, ``_``, ``.``, ``@``, ``-`` or spaces, starting with a letter/digit."""
LABEL_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}$")


class Refused(Exception):
    """A request the session cannot honour; ``status`` is the HTTP status the server answers with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Served:
    """A pair shown to a labeller: which answer is on the left, and the id its label will be saved under."""

    pair: Pair
    left: str
    label_id: str


def now() -> str:
    """UTC time of a label, ISO 8601 to the millisecond."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def check_labeller(name: Any) -> str:
    if not isinstance(name, str) or not LABELLER.match(name.strip()):
        raise Refused(
            400, "a labeller's name is 1–40 letters, digits, spaces or . _ @ - (starting with a letter or digit)"
        )
    return name.strip()


class LabelSession:
    """The state of labelling ``pairs`` into the labels file ``out`` (created with a ``session`` line, or replayed);
    ``lease_seconds``: how long a shown pair is kept for its labeller before another may get it."""

    def __init__(self, pairs: PairFile, out: str | Path, labels_per_pair: int = 1, lease_seconds: float = 600.0):
        self.pairs = pairs.pairs
        self.by_id = pairs.by_id()
        self.labels_per_pair = labels_per_pair
        self.lease_seconds = lease_seconds
        self.out = Path(out)
        self._lock = threading.Lock()
        self.labels: dict[str, dict[str, Any]] = {}  # every label row by id, retracted or not
        self.retracted: set[str] = set()
        self.done_by: dict[str, dict[str, str]] = defaultdict(dict)  # pair → labeller → live label id
        self.history: dict[str, list[str]] = defaultdict(list)  # labeller → live label ids, oldest first
        self.leases: dict[str, dict[str, tuple[float, str]]] = defaultdict(dict)  # pair → labeller → (expiry, id)
        try:
            self.log = AppendLog.open(self.out)  # the one writer; a torn last line is set aside
        except AlreadyOpen:
            raise ConfigError(f"{out} is being labelled by another `rlhf label` process; stop that one first") from None
        try:
            records = _existing(self.out, pairs)
        except BaseException:
            self.log.close()
            raise
        if not records:
            self.log.append(
                {
                    "kind": "session",
                    "pairs": pairs.path,
                    "pairs_sha256": pairs.sha256,
                    "pairs_count": len(pairs.pairs),
                    "time": now(),
                    "rlhf": __version__,
                }
            )
        for record in records:
            self._apply(record.data)

    def decisions(self, pair_id: str) -> int:
        """Live labels of a pair that decide it (a, b or tie; skips do not count)."""
        return sum(self.labels[i]["kind"] != "skip" for i in self.done_by[pair_id].values())

    def overall(self) -> tuple[int, int]:
        """(done, total): decisions, each pair counted up to labels_per_pair, of pairs × labels_per_pair."""
        with self._lock:
            return self._done(), len(self.pairs) * self.labels_per_pair

    def _done(self) -> int:
        return sum(min(self.decisions(p.id), self.labels_per_pair) for p in self.pairs)

    def progress(self, labeller: str) -> dict[str, Any]:
        """Overall "done / total" and the labeller's own labels, skips, seconds per label and latest label."""
        with self._lock:
            mine = [self.labels[i] for i in self.history.get(labeller, [])]
            seconds = [row["seconds"] for row in mine if row.get("seconds") is not None]
            return {
                "done": self._done(),
                "total": len(self.pairs) * self.labels_per_pair,
                "mine": len(mine),
                "skipped": sum(row["kind"] == "skip" for row in mine),
                "seconds_per_label": sum(seconds) / len(seconds) if seconds else None,
                "last": mine[-1]["id"] if mine else None,
            }

    def next(self, labeller: str) -> Served | None:
        """The pair to show ``labeller`` now (the one already leased to them, if any); None when none is left."""
        labeller = check_labeller(labeller)
        with self._lock:
            clock = time.monotonic()
            for pair in self.pairs:
                lease = self.leases[pair.id].get(labeller)
                if lease is not None and lease[0] > clock and labeller not in self.done_by[pair.id]:
                    return self._serve(pair, labeller, lease[1], clock)
            for pair in self.pairs:
                if labeller in self.done_by[pair.id]:
                    continue
                others = sum(1 for who, (until, _) in self.leases[pair.id].items() if who != labeller and until > clock)
                if self.decisions(pair.id) + others < self.labels_per_pair:
                    return self._serve(pair, labeller, secrets.token_urlsafe(12), clock)
            return None

    def label(
        self,
        labeller: str,
        pair_id: str,
        label: str,
        label_id: str,
        left: str,
        seconds: float | None = None,
        ratings: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Append ``labeller``'s label of a pair and return the row saved; the same ``label_id`` again is a no-op.
        ``label`` is a, b, tie or skip (`rlhf.data.labels.LABELS`); ``left`` the answer shown on the left."""
        labeller = check_labeller(labeller)
        pair = self._pair(pair_id)
        if label not in LABELS:
            raise Refused(422, f"label must be one of {', '.join(LABELS)}, got {label!r}")
        if left not in ("a", "b"):
            raise Refused(422, f"left must be 'a' or 'b', got {left!r}")
        if not isinstance(label_id, str) or not LABEL_ID.match(label_id):
            raise Refused(422, "id must be 8–64 letters, digits, _ or -")
        ratings = _check_ratings(ratings)
        with self._lock:
            saved = self.labels.get(label_id)
            if saved is not None:  # sent again (its reply was lost): saved once
                if saved["labeller"] != labeller or saved["pair"] != pair.id:
                    raise Refused(409, f"label id {label_id} is already used by another label")
                return saved
            if labeller in self.done_by[pair.id]:
                raise Refused(409, f"{labeller} has already labelled pair {pair.id}; undo it first to change it")
            row = _label_row(pair, labeller, label, label_id, left, _check_seconds(seconds), ratings)
            self.log.append(row)  # on disk before anything counts it
            self._apply(row)
            return row

    def undo(self, labeller: str, label_id: str | None = None) -> dict[str, Any]:
        """Retract ``labeller``'s latest live label (``label_id``, when given, must be it; an id already retracted
        is a no-op) and lease its pair back to them; returns the retracted row."""
        labeller = check_labeller(labeller)
        with self._lock:
            if label_id is not None and label_id in self.retracted:
                return self.labels[label_id]
            if not self.history[labeller]:
                raise Refused(409, f"{labeller} has no label to undo")
            latest = self.history[labeller][-1]
            if label_id is not None and label_id != latest:
                raise Refused(409, f"label {label_id} is not {labeller}'s latest label; undo goes back one at a time")
            row = {
                "kind": "retraction",
                "retracts": latest,
                "id": secrets.token_urlsafe(12),
                "labeller": labeller,
                "source": "human",
                "time": now(),
            }
            self.log.append(row)
            self._apply(row)
            undone = self.labels[latest]
            self.leases[undone["pair"]][labeller] = (time.monotonic() + self.lease_seconds, secrets.token_urlsafe(12))
            return undone

    def close(self) -> None:
        self.log.close()

    def _pair(self, pair_id: Any) -> Pair:
        pair = self.by_id.get(pair_id) if isinstance(pair_id, str) else None
        if pair is None:
            raise Refused(404, f"no pair with id {str(pair_id)[:40]!r} in this pairs file")
        return pair

    def _serve(self, pair: Pair, labeller: str, label_id: str, clock: float) -> Served:
        self.leases[pair.id][labeller] = (clock + self.lease_seconds, label_id)
        flip = hashlib.sha256(f"{pair.id}\0{labeller}".encode()).digest()[0] & 1
        return Served(pair, "b" if flip else "a", label_id)

    def _apply(self, row: dict[str, Any]) -> None:
        """The state after one line of the labels file: the same code replays the file and records a new label."""
        kind = row.get("kind")
        if kind in ("preference", "tie", "skip"):
            pair, who, label_id = row["pair"], row["labeller"], row["id"]
            self.labels[label_id] = row
            self.done_by[pair][who] = label_id
            self.history[who].append(label_id)
            self.leases[pair].pop(who, None)
        elif kind == "retraction":
            target = self.labels.get(row["retracts"])
            if target is None or row["retracts"] in self.retracted:
                return
            self.retracted.add(row["retracts"])
            self.done_by[target["pair"]].pop(target["labeller"], None)
            self.history[target["labeller"]].remove(row["retracts"])


def _label_row(
    pair: Pair, labeller: str, label: str, label_id: str, left: str, seconds: float | None, ratings: dict[str, str]
) -> dict[str, Any]:
    """The line of the labels file for one label; ``left`` and the ratings' sides as chosen/rejected when decided."""
    other = "b" if label == "a" else "a"
    side = {"a": "a", "b": "b"} if label in ("tie", "skip") else {label: "chosen", other: "rejected"}
    meta = {"pair": pair.id, "id": label_id, "labeller": labeller, "source": "human", "time": now(), "seconds": seconds}
    meta["left"] = side[left]
    if ratings:
        meta["ratings"] = {side[s]: value for s, value in ratings.items()}
    return pair.label_row(label, **meta)


def _check_seconds(seconds: Any) -> float | None:
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
        raise Refused(422, "seconds must be a non-negative number")
    return round(float(seconds), 3)


def _check_ratings(ratings: Any) -> dict[str, str]:
    if ratings is None:
        return {}
    if not isinstance(ratings, dict) or not set(ratings) <= {"a", "b"}:
        raise Refused(422, "ratings must be an object with keys 'a' and/or 'b'")
    for side, value in ratings.items():
        if value not in RATINGS:
            raise Refused(422, f"rating of {side} must be one of {', '.join(RATINGS)}, got {str(value)[:20]!r}")
    return dict(ratings)


def _existing(out: Path, pairs: PairFile) -> list:
    """The labels file's records (none when it does not exist or is empty); an existing one must have been
    started by ``rlhf label`` on this very pairs file."""
    if not out.exists() or out.stat().st_size == 0:
        return []
    try:
        records = read_records(out)
    except DataError as error:
        if "holds no records" in str(error):
            return []
        raise ConfigError(f"--out {out} exists but is not a labels file this command can continue: {error}") from None
    first = records[0].data
    if first.get("kind") != "session":
        raise ConfigError(
            f"--out {out} exists and was not started by `rlhf label` (its first line is not a session line); "
            "give a new --out file"
        )
    if first.get("pairs_sha256") != pairs.sha256:
        raise ConfigError(
            f"the pairs file {pairs.path} changed since labelling into {out} started (SHA-256 {pairs.sha256[:12]}… "
            f"now, {str(first.get('pairs_sha256'))[:12]}… then, for {first.get('pairs')}); labels refer to the "
            "pairs they were given for: restore that file, or label the new one into a new --out file"
        )
    return records
