"""A labelling session: which item (a pair, or k answers to rank) each labeller sees next, and every label appended
to disk before it counts.

The labels file (`rlhf.data.labels`) is the only state, replayed on start. Each change (a label, an undo) goes through
one lock: the line is appended and fsynced (`rlhf.runlog.durable.AppendLog`), then the in-memory state follows, then the
caller may acknowledge. A label sent twice (a retry after a lost reply) is saved once, by its id. Pairs and ranking
items are served, leased, skipped and undone alike; how, and how their answers are placed: docs/labelling.md ("Several
labellers", "The page", "Ranking")."""

from __future__ import annotations

import hashlib
import math
import random
import re
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlhf import __version__
from rlhf.config import ConfigError
from rlhf.data.files import DataError, read_records
from rlhf.data.labels import LABEL_KINDS, LABELS, RATINGS
from rlhf.labelling.pairs import Candidates, Item, ItemFile, Pair, PairFile
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
    """An item shown to a labeller: the order its answers are shown in, and the id its label will be saved under."""

    item: Item
    shown: tuple[int, ...]
    """The item's answers in the order shown (a pair's: 0 = a, 1 = b), as indices into them."""
    label_id: str

    @property
    def left(self) -> str:
        """A pair's answer shown on the left: a or b."""
        return "ab"[self.shown[0]]


def shown_order(*, item_id: str, labeller: str, k: int) -> tuple[int, ...]:
    """The order ``labeller`` sees an item's ``k`` answers in: a shuffle seeded by both, so a reload shows the same
    order and position bias can be measured. Two answers are a coin flip of the seed's first byte (the order pairs
    were always placed in, so a restarted session shows them as before)."""
    seed = hashlib.sha256(f"{item_id}\0{labeller}".encode()).digest()
    if k == 2:
        return (1, 0) if seed[0] & 1 else (0, 1)
    order = list(range(k))
    random.Random(seed).shuffle(order)
    return tuple(order)


def item_of(row: dict[str, Any]) -> str:
    """The id of the item a label row labels: ``item`` (a ranking item) or ``pair``."""
    return str(row["item"] if "item" in row else row["pair"])


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
    """The state of labelling ``items`` into the labels file ``out`` (created with a ``session`` line, or replayed);
    ``lease_seconds``: how long a shown item is kept for its labeller before another may get it."""

    def __init__(
        self, items: ItemFile | PairFile, out: str | Path, labels_per_pair: int = 1, lease_seconds: float = 600.0
    ):
        if isinstance(items, PairFile):  # the LLM judge's session: pairs only
            items = items.as_items()
        self.items = items.items
        self.by_id = {item.id: item for item in items.items}
        self.labels_per_pair = labels_per_pair
        self.lease_seconds = lease_seconds
        self.out = Path(out)
        self._lock = threading.Lock()
        self.labels: dict[str, dict[str, Any]] = {}  # every label row by id, retracted or not
        self.retracted: set[str] = set()
        self.done_by: dict[str, dict[str, str]] = defaultdict(dict)  # item → labeller → live label id
        self.history: dict[str, list[str]] = defaultdict(list)  # labeller → live label ids, oldest first
        self.leases: dict[str, dict[str, tuple[float, str]]] = defaultdict(dict)  # item → labeller → (expiry, id)
        try:
            self.log = AppendLog.open(self.out)  # the one writer; a torn last line is set aside
        except AlreadyOpen:
            raise ConfigError(f"{out} is being labelled by another `rlhf label` process; stop that one first") from None
        try:
            records = _existing(self.out, items)
        except BaseException:
            self.log.close()
            raise
        if not records:
            self.log.append(
                {
                    "kind": "session",
                    "pairs": items.path,
                    "pairs_sha256": items.sha256,
                    "pairs_count": len(items.items),
                    "mode": items.mode,
                    "rankings": items.count(Candidates),
                    "time": now(),
                    "rlhf": __version__,
                }
            )
        for record in records:
            self._apply(record.data)

    def decisions(self, item_id: str) -> int:
        """Live labels of an item that decide it (a, b, tie or a ranking; skips do not count)."""
        return sum(self.labels[i]["kind"] != "skip" for i in self.done_by[item_id].values())

    def overall(self) -> tuple[int, int]:
        """(done, total): decisions, each item counted up to labels_per_pair, of items × labels_per_pair."""
        with self._lock:
            return self._done(), len(self.items) * self.labels_per_pair

    def _done(self) -> int:
        return sum(min(self.decisions(item.id), self.labels_per_pair) for item in self.items)

    def progress(self, labeller: str) -> dict[str, Any]:
        """Overall "done / total" and the labeller's own labels, skips, seconds per label and latest label."""
        with self._lock:
            mine = [self.labels[i] for i in self.history.get(labeller, [])]
            seconds = [row["seconds"] for row in mine if row.get("seconds") is not None]
            return {
                "done": self._done(),
                "total": len(self.items) * self.labels_per_pair,
                "mine": len(mine),
                "skipped": sum(row["kind"] == "skip" for row in mine),
                "seconds_per_label": sum(seconds) / len(seconds) if seconds else None,
                "last": mine[-1]["id"] if mine else None,
            }

    def next(self, labeller: str) -> Served | None:
        """The item to show ``labeller`` now (the one already leased to them, if any); None when none is left."""
        labeller = check_labeller(labeller)
        with self._lock:
            clock = time.monotonic()
            for item in self.items:
                lease = self.leases[item.id].get(labeller)
                if lease is not None and lease[0] > clock and labeller not in self.done_by[item.id]:
                    return self._serve(item, labeller, lease[1], clock)
            for item in self.items:
                if labeller in self.done_by[item.id]:
                    continue
                others = sum(1 for who, (until, _) in self.leases[item.id].items() if who != labeller and until > clock)
                if self.decisions(item.id) + others < self.labels_per_pair:
                    return self._serve(item, labeller, secrets.token_urlsafe(12), clock)
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
        pair = self._item(pair_id, Pair)
        if label not in LABELS:
            raise Refused(422, f"label must be one of {', '.join(LABELS)}, got {label!r}")
        if left not in ("a", "b"):
            raise Refused(422, f"left must be 'a' or 'b', got {left!r}")
        ratings = _check_ratings(ratings)
        seconds = _check_seconds(seconds)
        return self._save(
            labeller=labeller,
            item=pair,
            label_id=label_id,
            row=lambda: _label_row(pair, labeller, label, label_id, left, seconds, ratings),
        )

    def rank(
        self, *, labeller: str, item_id: str, ranking: Any, label_id: str, seconds: float | None = None
    ) -> dict[str, Any]:
        """Append ``labeller``'s ranking of a candidates item (indices into its answers, best first; a list of
        indices ties them), or ``"skip"``, and return the row saved; the same ``label_id`` again is a no-op. The row
        records the order the answers were shown in (``shown``)."""
        labeller = check_labeller(labeller)
        item = self._item(item_id, Candidates)
        if ranking != "skip":
            ranking = check_ranking(ranking, k=len(item.answers))
        seconds = _check_seconds(seconds)
        shown = list(shown_order(item_id=item.id, labeller=labeller, k=len(item.answers)))
        meta = {"item": item.id, "id": label_id, "labeller": labeller, "source": "human", "time": now()}
        meta |= {"seconds": seconds, "shown": shown}
        row = (lambda: item.skip_row(**meta)) if ranking == "skip" else (lambda: item.ranking_row(ranking, **meta))
        return self._save(labeller=labeller, item=item, label_id=label_id, row=row)

    def _save(self, *, labeller: str, item: Item, label_id: Any, row: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Append the row ``row()`` builds, unless this label id is already saved (then that row): one line per
        label, on disk before anything counts it."""
        if not isinstance(label_id, str) or not LABEL_ID.match(label_id):
            raise Refused(422, "id must be 8–64 letters, digits, _ or -")
        with self._lock:
            saved = self.labels.get(label_id)
            if saved is not None:  # sent again (its reply was lost): saved once
                if saved["labeller"] != labeller or item_of(saved) != item.id:
                    raise Refused(409, f"label id {label_id} is already used by another label")
                return saved
            if labeller in self.done_by[item.id]:
                raise Refused(409, f"{labeller} has already labelled {item.id}; undo it first to change it")
            line = row()
            self.log.append(line)
            self._apply(line)
            return line

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
            self.leases[item_of(undone)][labeller] = (time.monotonic() + self.lease_seconds, secrets.token_urlsafe(12))
            return undone

    def close(self) -> None:
        self.log.close()

    def _item(self, item_id: Any, kind: type) -> Any:
        """The item ``item_id`` of this file, which must be a ``kind`` (a pair is labelled, a candidates item
        ranked)."""
        item = self.by_id.get(item_id) if isinstance(item_id, str) else None
        if item is None:
            raise Refused(404, f"no item with id {str(item_id)[:40]!r} in this file")
        if not isinstance(item, kind):
            route = "/api/rank (a ranking)" if isinstance(item, Candidates) else "/api/label (a pair label)"
            raise Refused(422, f"{item_id} is a {type(item).__name__.lower()} item: send it to {route}")
        return item

    def _serve(self, item: Item, labeller: str, label_id: str, clock: float) -> Served:
        self.leases[item.id][labeller] = (clock + self.lease_seconds, label_id)
        k = 2 if isinstance(item, Pair) else len(item.answers)
        return Served(item, shown_order(item_id=item.id, labeller=labeller, k=k), label_id)

    def _apply(self, row: dict[str, Any]) -> None:
        """The state after one line of the labels file: the same code replays the file and records a new label."""
        kind = row.get("kind")
        if kind in LABEL_KINDS:
            item, who, label_id = item_of(row), row["labeller"], row["id"]
            self.labels[label_id] = row
            self.done_by[item][who] = label_id
            self.history[who].append(label_id)
            self.leases[item].pop(who, None)
        elif kind == "retraction":
            target = self.labels.get(row["retracts"])
            if target is None or row["retracts"] in self.retracted:
                return
            self.retracted.add(row["retracts"])
            self.done_by[item_of(target)].pop(target["labeller"], None)
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


def check_ranking(ranking: Any, *, k: int) -> list[int | list[int]]:
    """A ranking of ``k`` answers as the labels file holds it (indices best first, a list of indices tied), or
    `Refused` (400) saying what is wrong: each index 0 … k − 1 exactly once, in at least two places."""
    if not isinstance(ranking, list) or not ranking:
        raise Refused(400, f"ranking must be a list of the {k} answers' indices, best first, or 'skip'")
    places: list[int | list[int]] = []
    for entry in ranking:
        tier = entry if isinstance(entry, list) else [entry]
        if not tier or any(isinstance(i, bool) or not isinstance(i, int) for i in tier):
            raise Refused(400, f"a ranking's entries are indices or lists of tied indices, got {str(entry)[:40]}")
        places.append(tier[0] if len(tier) == 1 else list(tier))
    named = [i for entry in places for i in (entry if isinstance(entry, list) else [entry])]
    if bad := sorted({i for i in named if not 0 <= i < k}):
        raise Refused(400, f"ranking names {bad[:5]}, but the item has {k} answers (indices 0 to {k - 1})")
    if repeated := sorted({i for i in named if named.count(i) > 1}):
        raise Refused(400, f"ranking names {repeated} more than once")
    if missing := sorted(set(range(k)) - set(named)):
        raise Refused(400, f"ranking leaves out {missing}: rank every answer (tied ones in one list)")
    if len(places) < 2:
        raise Refused(400, "a ranking with every answer tied prefers nothing: skip the item instead")
    return places


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


def _existing(out: Path, pairs: ItemFile) -> list:
    """The labels file's records (none when it does not exist or is empty); an existing one must have been
    started by ``rlhf label`` on this very pairs file, read into the same items."""
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
    rankings = pairs.count(Candidates)
    if first.get("rankings", 0) != rankings:  # files from before rankings have none
        raise ConfigError(
            f"{out} was started with {first.get('rankings', 0)} items to rank (--mode {first.get('mode', 'pairs')}); "
            f"--mode {pairs.mode} makes {rankings} of {pairs.path}: give --mode {first.get('mode', 'pairs')} to "
            "continue it, or a new --out file"
        )
    return records
