"""The LLM judge ranking k answers in one request (``rlhf label CANDIDATES --mode ranking --judge.source …``).

Each candidates item's answers are shown as ``[Answer 1]`` … ``[Answer k]``; the judge replies with their order,
best first (``[2] > [3] > [1]``). With ``judge.llm.both_orders`` it is asked again with the answers reversed, and the
two rankings are combined by each answer's mean rank: reversal puts every answer at the mirrored position, so each
answer's two positions average to the middle and a preference that falls with position cancels. One labels-file row
per item: a ranking (equal mean ranks tied), a tie (every answer's mean rank equal), or a skip (a reply that is not
an order of the k labels after ``tries``). The rules, exactly: docs/labelling.md ("The LLM judge", "k answers at
once")."""

from __future__ import annotations

import hashlib
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

from rlhf import __version__
from rlhf.config import ConfigError, LLMJudgeSection, SampleJudgeSection
from rlhf.data.files import DataError, read_records
from rlhf.data.labels import live_labels
from rlhf.httpclient import cut
from rlhf.labelling.judge import LLMJudge, cache_path_for, judge_in_chunks, render_prompt
from rlhf.labelling.pairs import Candidates, CandidatesFile
from rlhf.labelling.session import now
from rlhf.runlog.durable import AlreadyOpen, AppendLog

RANKING_TEMPLATE = """[The user's request]
{prompt}

{answers}

Rank the {k} answers from best to worst. Reply with one line only: the answers' numbers in brackets, best first, \
separated by ">", for example {example}. Name every answer exactly once."""
RANKING_PLACEHOLDERS = ("{prompt}", "{answers}")
RANKING_TOKENS = 16
"""The reply's room for an order of k answers, when ``judge.llm.max_tokens`` is None: this plus `TOKENS_PER_ANSWER`·k."""
TOKENS_PER_ANSWER = 8
"""``[12] > `` is about 4 tokens; twice that leaves room for ``[Answer 12] >`` and a short preamble."""
_LABEL = r"\[?\s*(?:answer\s*)?(\d+)\s*\]?"
_ORDER_LINE = re.compile(rf"^\W*{_LABEL}(?:\s*(?:>|,)\s*{_LABEL})+\W*$", re.IGNORECASE)
_BRACKETED = re.compile(r"\[\s*(?:answer\s*)?(\d+)\s*\]", re.IGNORECASE)


def render_answers(answers: Sequence[str]) -> str:
    """The answers as the judge reads them, in the order shown: ``[Answer 1]`` and its text, and so on."""
    return "\n\n".join(f"[Answer {n}]\n{text}" for n, text in enumerate(answers, 1))


def example_order(k: int) -> str:
    """The format asked for, on labels rotated by one (``[2] > [3] > [1]``): the identity order would suggest that
    the answers are already in order."""
    return " > ".join(f"[{n % k + 1}]" for n in range(1, k + 1))


def parse_ranking(text: str, k: int) -> list[int] | None:
    """The order a reply gives to the k answers shown, best first, as 0-based positions; None unless it names each
    of the k labels exactly once (repeated, missing or unknown labels are no order). Read from the last line that
    is an order (``[2] > [3] > [1]``, ``2 > 3 > 1``, ``[2], [3], [1]``) or names two or more ``[n]`` labels
    (``Best first: [2] > [3] > [1]``); failing that, from every ``[n]`` of the reply in turn (a list, one a line)."""
    for line in reversed(text.strip().splitlines()):
        if _ORDER_LINE.match(line):
            return _permutation([int(n) for n in re.findall(r"\d+", line)], k)
        if len(labels := _BRACKETED.findall(line)) >= 2:
            return _permutation([int(n) for n in labels], k)
    return _permutation([int(n) for n in _BRACKETED.findall(text)], k)


def _permutation(labels: list[int], k: int) -> list[int] | None:
    return [n - 1 for n in labels] if sorted(labels) == list(range(1, k + 1)) else None


def shown_orders(k: int, both_orders: bool) -> list[tuple[int, ...]]:
    """The orders the answers are shown in (answer indices, first shown first): as given, then reversed."""
    given = tuple(range(k))
    return [given, given[::-1]] if both_orders else [given]


def combine(rankings: Sequence[Sequence[int]]) -> list[int | list[int]]:
    """One ranking from several of the same answers (answer indices, best first): answers in order of their mean
    rank, those with equal mean ranks tied (a list), as a labels-file ``ranking``."""
    k = len(rankings[0])
    mean = {i: Fraction(sum(r.index(i) for r in rankings), len(rankings)) for i in range(k)}  # exact: ties are ties
    tiers: dict[Fraction, list[int]] = {}
    for i in sorted(range(k), key=lambda i: mean[i]):
        tiers.setdefault(mean[i], []).append(i)
    return [tier[0] if len(tier) == 1 else tier for tier in tiers.values()]


class ListwiseJudge:
    """Ranks candidates items with an `LLMJudge` asked the listwise question; see the module docstring."""

    def __init__(self, source: str, settings: LLMJudgeSection, cache_path: str | Path):
        self.llm = LLMJudge(source, settings, cache_path, RANKING_PLACEHOLDERS, RANKING_TEMPLATE)
        self.source = self.llm.source

    def close(self) -> None:
        self.llm.close()

    def rank(self, items: Sequence[Candidates]) -> list[dict[str, Any]]:
        """One labels-file row per item (a ranking, a tie, or a skip when a reply gave no order)."""
        start = time.perf_counter()
        asked = [(item, shown) for item in items for shown in shown_orders(len(item.answers), self._both)]
        with ThreadPoolExecutor(max_workers=self.llm.settings.concurrency) as pool:
            futures = [pool.submit(self.ask, item, shown) for item, shown in asked]
            try:
                replies = [future.result() for future in futures]
            except BaseException:  # stop asking: what was answered is in the cache for the next run
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        self.llm.seconds += time.perf_counter() - start
        n = 2 if self._both else 1
        return [
            self.row(item, asked[i * n : (i + 1) * n], replies[i * n : (i + 1) * n]) for i, item in enumerate(items)
        ]

    @property
    def _both(self) -> bool:
        return self.llm.settings.both_orders

    def ask(self, item: Candidates, shown: tuple[int, ...]) -> str:
        """The judge's reply to the item's answers shown in the order ``shown``."""
        k = len(shown)
        user = self.llm.template
        for placeholder, text in (
            ("{prompt}", render_prompt(item.prompt)),
            ("{answers}", render_answers([item.answers[i] for i in shown])),
            ("{k}", str(k)),
            ("{example}", example_order(k)),
        ):
            user = user.replace(placeholder, text)
        room = RANKING_TOKENS + TOKENS_PER_ANSWER * k
        return self.llm.reply(user, room, lambda content: parse_ranking(content, k) is not None)

    def row(self, item: Candidates, asked: list[tuple[Candidates, tuple[int, ...]]], replies: list[str]) -> dict:
        """The labels-file row of an item from its replies, one per order shown."""
        k = len(item.answers)
        rankings, orders = [], []
        for (_, shown), reply in zip(asked, replies, strict=True):
            positions = parse_ranking(reply, k)
            ranking = None if positions is None else [shown[p] for p in positions]
            rankings.append(ranking)
            orders.append({"shown": list(shown), "reply": reply, "ranking": ranking})
        meta = {
            "item": item.id,
            "id": hashlib.sha256(f"{self.source}\0{item.id}".encode()).hexdigest()[:16],
            "labeller": self.source,
            "source": self.source,
            "judge": orders,
        }
        if None in rankings:
            reply = next(o["reply"] for o in orders if o["ranking"] is None)
            return _unranked(item, "skip", **meta, reason=f"no order of the {k} answers in the reply {cut(reply)}")
        combined = combine(rankings)
        if len(combined) == 1:  # every mean rank equal: the orders undid each other, position decided it
            return _unranked(item, "tie", **meta)
        return item.ranking_row(combined, **meta)


def _unranked(answers: Candidates, kind: str, **meta: Any) -> dict[str, Any]:
    """A tie or skip row of an item: its answers as a ranking row holds them, and no ranking."""
    row = answers.ranking_row([], **meta)
    del row["ranking"]
    return {**row, "kind": kind}


def _open_labels(out: Path, candidates: CandidatesFile) -> tuple[AppendLog, list[dict[str, Any]]]:
    """The labels file opened for appending, as its one writer, and its live label rows; a new one starts with a
    ``session`` line naming the candidates file, an old one must have been started on this very file."""
    try:
        log = AppendLog.open(out)
    except AlreadyOpen:
        raise ConfigError(f"{out} is being labelled by another `rlhf label` process; stop that one first") from None
    try:
        records = read_records(out) if out.stat().st_size else []
    except DataError as error:
        if "holds no records" not in str(error):  # (a file whose one line a crash cut, set aside by the log)
            log.close()
            raise ConfigError(
                f"--out {out} exists but is not a labels file this command can continue: {error}"
            ) from None
        records = []
    if not records:
        log.append({"kind": "session", "pairs": candidates.path, "pairs_sha256": candidates.sha256,
                    "pairs_count": len(candidates.items), "mode": "ranking", "time": now(), "rlhf": __version__})  # fmt: skip
        return log, []
    first = records[0].data
    problem = (
        "was not started by `rlhf label --mode ranking`"
        if first.get("kind") != "session" or first.get("mode") != "ranking"
        else f"was started on another candidates file ({first.get('pairs')}, or it changed since)"
        if first.get("pairs_sha256") != candidates.sha256
        else None
    )
    if problem is not None:
        log.close()
        raise ConfigError(f"--out {out} {problem}; give a new --out file (labels refer to the answers they ranked)")
    return log, [r.data for r in live_labels(records)]


def judge_candidates_file(candidates: CandidatesFile, out: str | Path, judge_config: SampleJudgeSection) -> dict:
    """``rlhf label CANDIDATES --out LABELS --mode ranking --judge.source openai:URL#MODEL``: the judge ranks every
    item not yet in ``out`` (a labels file, appended, resumable)."""
    assert judge_config.source is not None
    log, rows = _open_labels(Path(out), candidates)
    try:
        judge = ListwiseJudge(judge_config.source, judge_config.llm, cache_path_for(judge_config.llm, out))
    except BaseException:
        log.close()
        raise
    done = {row.get("item") for row in rows if row.get("labeller") == judge.source}
    todo = [item for item in candidates.items if item.id not in done]
    counts = {"ranking": 0, "tie": 0, "skip": 0}
    try:
        judge_in_chunks(todo, judge.rank, log.append, counts)
    finally:
        judge.close()
        log.close()
    total = len(candidates.items)
    print(
        f"label: {judge.source} ranked {len(todo)} items ({total - len(todo)} were already in {out}): "
        f"{counts['ranking']} rankings, {counts['tie']} ties, {counts['skip']} skips; {judge.llm.asked} requests "
        "sent, the rest from the cache",
        file=sys.stderr,
    )
    return {"items": total, "judged": len(todo), "asked": judge.llm.asked, **counts}
