"""An LLM judge over any OpenAI-compatible chat-completions API (vLLM, llama.cpp's server, a hosted API).

Source ``openai:URL#MODEL`` (``judge.source``), asked as ``judge.llm`` says (`rlhf.config.LLMJudgeSection`). What it is
asked, why both orders (an LLM judge prefers the first answer more often than chance), what is retried, the
request-keyed cache that makes a rerun ask only what is missing, and the labels-file rows it writes: docs/labelling.md
("The LLM judge")."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlhf.config import ConfigError, LLMJudgeSection, SampleJudgeSection, llm_judge
from rlhf.data.files import read_records
from rlhf.httpclient import HttpFailure, ServiceError, cut, send
from rlhf.labelling.pairs import Pair, PairFile
from rlhf.runlog.durable import AlreadyOpen, AppendLog

SYSTEM = (
    "You are an impartial judge of answers written by AI assistants. Judge which answer is more helpful, correct, "
    "honest and harmless for the user's request. Do not let the order of the answers, their length or their "
    "style sway you."
)
TEMPLATE = """[The user's request]
{prompt}

[Answer A]
{answer_a}

[Answer B]
{answer_b}

Which answer is better? Reply with exactly one word: A, B, or tie."""
PLACEHOLDERS = ("{prompt}", "{answer_a}", "{answer_b}")
_VERDICT = re.compile(r"^\W*(?:answer\s*)?(a|b|tie)\b", re.IGNORECASE)
_MARKED = re.compile(r"\[\[\s*(a|b|tie)\s*\]\]", re.IGNORECASE)
VERDICT_TOKENS = 16
"""The reply's room for a verdict (one word) when ``judge.llm.max_tokens`` is None."""
PAIRS_PER_CHUNK = 64
"""Pairs (or ranking items) judged before their rows are appended to the labels file (``rlhf label --judge.source``)."""


class JudgeError(ServiceError):
    """The judge could not be asked (unreachable, refusing, or answering with something that is not the API's)."""


def parse_verdict(text: str) -> str | None:
    """``A``, ``B`` or ``tie`` from a reply: ``[[A]]`` anywhere, or the reply starting with A / B / tie (``"B."``,
    ``"Answer A"``, ``"tie — both fine"``); None when it says neither."""
    found = _MARKED.search(text) or _VERDICT.match(text.strip())
    if found is None:
        return None
    word = found.group(1).lower()
    return "tie" if word == "tie" else word.upper()


def render_prompt(prompt: str | list[dict[str, Any]]) -> str:
    """A prompt as the judge reads it: the text, or a chat as ``role: content`` paragraphs."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in prompt)


class LLMJudge:
    """Compares pairs with ``model`` at ``url``; see the module docstring."""

    def __init__(
        self,
        source: str,
        settings: LLMJudgeSection,
        cache_path: str | Path,
        placeholders: tuple[str, ...] = PLACEHOLDERS,
        template: str = TEMPLATE,
    ):
        """``placeholders`` and ``template``: what ``judge.llm.template`` must hold, and the built-in prompt, for
        the question asked (a pair here; k answers at once: `rlhf.labelling.listwise`)."""
        parsed = llm_judge(source)
        assert parsed is not None, source
        self.url, self.model = parsed
        self.source = f"openai:{self.model}"
        self.settings = settings
        self.template = _template(settings.template, placeholders, template)
        self.system = SYSTEM if settings.system is None else settings.system
        key = os.environ.get(settings.api_key_env)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        try:  # opened first: a line cut by a crash is set aside before the cache is read
            self._cache_log = AppendLog.open(cache_path)
        except AlreadyOpen:
            raise ConfigError(
                f"the judge cache {cache_path} is in use by another run; wait for it or set judge.llm.cache"
            ) from None
        self.cache: dict[str, str] = _read_cache(Path(cache_path))
        self.cached_at_start = len(self.cache)
        self._lock = threading.Lock()
        self.asked = 0
        self.seconds = 0.0

    def close(self) -> None:
        self._cache_log.close()

    def judge(self, pairs: Sequence[Pair]) -> list[dict[str, Any]]:
        """One labels-file row per pair (a preference, a tie, or a skip when the judge gave no verdict)."""
        start = time.perf_counter()
        orders = (False, True) if self.settings.both_orders else (False,)  # swapped?
        with ThreadPoolExecutor(max_workers=self.settings.concurrency) as pool:
            futures = [pool.submit(self.ask, pair, swapped) for pair in pairs for swapped in orders]
            try:
                replies = [future.result() for future in futures]
            except BaseException:  # stop asking: what was answered is in the cache for the next run
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        self.seconds += time.perf_counter() - start
        n = len(orders)
        return [self.row(pair, replies[i * n : (i + 1) * n]) for i, pair in enumerate(pairs)]

    def ask(self, pair: Pair, swapped: bool) -> str:
        """The judge's reply to one order of a pair (from the cache when it was asked before)."""
        first, second = (pair.b, pair.a) if swapped else (pair.a, pair.b)
        user = self.template
        for placeholder, text in zip(PLACEHOLDERS, (render_prompt(pair.prompt), first, second), strict=True):
            user = user.replace(placeholder, text)
        return self.reply(user, VERDICT_TOKENS, lambda content: parse_verdict(content) is not None)

    def reply(self, user: str, max_tokens: int, readable: Callable[[str], bool]) -> str:
        """The judge's reply to the user message ``user`` (from the cache when it was asked before); a reply that is
        not ``readable`` is asked again, as `_content` says. ``max_tokens``: the reply's room when
        ``judge.llm.max_tokens`` is None."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        body = {
            "model": self.model,
            "messages": [*system, {"role": "user", "content": user}],
            "temperature": self.settings.temperature,
            "max_tokens": max_tokens if self.settings.max_tokens is None else self.settings.max_tokens,
        }
        if self.settings.chat_template_kwargs is not None:  # vLLM's and SGLang's extension of the API
            body["chat_template_kwargs"] = self.settings.chat_template_kwargs
        data = json.dumps(body, ensure_ascii=False, sort_keys=True).encode("utf-8")
        key = hashlib.sha256(data).hexdigest()
        with self._lock:
            if key in self.cache:
                return self.cache[key]
        content = self._content(data, readable)
        with self._lock:
            self.cache[key] = content
            self._cache_log.append({"key": key, "model": self.model, "content": content})
            self.asked += 1
        return content

    def row(self, pair: Pair, replies: list[str]) -> dict[str, Any]:
        """The labels-file row for a pair from its replies (``[a-then-b]`` or ``[a-then-b, b-then-a]``)."""
        verdicts = [parse_verdict(reply) for reply in replies]
        in_ab = [_as_answer(v, swapped=i == 1) for i, v in enumerate(verdicts)]
        meta = {
            "pair": pair.id,
            "id": hashlib.sha256(f"{self.source}\0{pair.id}".encode()).hexdigest()[:16],
            "labeller": self.source,
            "source": self.source,
            "judge": dict(zip(("ab", "ba"), in_ab, strict=False)),  # ba: when asked in both orders
        }
        if any(v is None for v in in_ab):
            reason = next(reply for reply, v in zip(replies, in_ab, strict=True) if v is None)
            return pair.label_row("skip", **meta, reason=f"no verdict in the judge's reply {cut(reason)}")
        # orders that disagree make a tie: position decided it, not the answers
        return pair.label_row("tie" if len(set(in_ab)) > 1 else in_ab[0], **meta)

    def _content(self, data: bytes, readable: Callable[[str], bool]) -> str:
        """The reply's message text, each failure one try (docs/labelling.md, "Failures"): after ``tries`` a reply
        that is not ``readable`` (no verdict, no ranking) is returned (its pair or answers become a skip), anything
        else raises `JudgeError` naming the URL."""
        settings, problems, answered = self.settings, [], None
        for attempt in range(settings.tries):
            if attempt:
                time.sleep(settings.backoff * 2 ** (attempt - 1))
            try:
                reply = send("POST", self.url, data, self.headers, settings.timeout, tries=1, backoff=0.0)
                content = json.loads(reply)["choices"][0]["message"]["content"]
                if not isinstance(content, str):
                    raise TypeError(f"content is {type(content).__name__}")
            except HttpFailure as error:
                if error.final:
                    raise JudgeError(f"LLM judge {self.url} {error}") from error
                problems.append(str(error).removeprefix("failed after 1 tries — try 1: "))
                continue
            except (ValueError, KeyError, IndexError, TypeError) as error:
                problems.append(f"not a chat-completions reply ({type(error).__name__}: {error}): {cut(reply)}")
                continue
            if readable(content):
                return content
            answered = content
            problems.append(f"nothing readable in {cut(content)}")
        if answered is not None:
            return answered
        tries = "; ".join(f"try {i + 1}: {problem}" for i, problem in enumerate(problems))
        raise JudgeError(f"LLM judge {self.url} failed after {settings.tries} tries — {tries}")


def _as_answer(verdict: str | None, swapped: bool) -> str | None:
    """A verdict about positions (A = shown first) as one about answers (a, b, tie)."""
    if verdict in (None, "tie"):
        return verdict
    first, second = ("b", "a") if swapped else ("a", "b")
    return first if verdict == "A" else second


def _template(path: str | None, placeholders: tuple[str, ...], built_in: str) -> str:
    if path is None:
        return built_in
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"judge.llm.template={path!r}: cannot read it ({error.strerror})") from None
    missing = [p for p in placeholders if p not in text]
    if missing:
        raise ConfigError(
            f"judge.llm.template={path!r} does not contain {', '.join(missing)}; the judge would not see what it judges"
        )
    return text


def _read_cache(path: Path) -> dict[str, str]:
    rows = [r.data for r in read_records(path)] if path.exists() and path.stat().st_size else []
    return {
        row["key"]: row["content"]
        for row in rows
        if isinstance(row.get("key"), str) and isinstance(row.get("content"), str)
    }


def cache_path_for(settings: LLMJudgeSection, output: str | Path) -> Path:
    return Path(settings.cache) if settings.cache is not None else Path(f"{output}.judge-cache.jsonl")


def judge_in_chunks(
    todo: Sequence[Any], ask: Callable[[list], Sequence[dict]], append: Callable[[dict], Any], counts: dict[str, int]
) -> None:
    """Ask the judge about ``todo`` (pairs or ranking items) `PAIRS_PER_CHUNK` at a time, its requests in flight
    together within a chunk; each row is appended (fsynced) as its chunk comes back, so an interrupted run loses at
    most the chunk in flight, and ``counts`` counts the rows by kind. A progress bar over ``todo``."""
    from rlhf.runlog.progress import BatchProgress

    with BatchProgress(len(todo), "judge", True) as bar:
        for start in range(0, len(todo), PAIRS_PER_CHUNK):
            chunk = list(todo[start : start + PAIRS_PER_CHUNK])
            for row in ask(chunk):
                append(row)
                counts[row["kind"]] += 1
            bar.advance(len(chunk), f"{counts['tie']} ties, {counts['skip']} skips")


def judge_pair_file(pairs: PairFile, out: str | Path, judge_config: SampleJudgeSection) -> dict[str, Any]:
    """``rlhf label PAIRS --out PREFS --judge.source openai:URL#MODEL``: the judge labels every pair not yet in
    ``out`` (a labels file, appended, resumable like a person's session)."""
    from rlhf.labelling.session import LabelSession

    assert judge_config.source is not None
    session = LabelSession(pairs, out, labels_per_pair=1)  # the session line, the lock, the pairs-file check
    judge = LLMJudge(judge_config.source, judge_config.llm, cache_path_for(judge_config.llm, out))
    todo = [pair for pair in pairs.pairs if judge.source not in session.done_by[pair.id]]
    counts = {"preference": 0, "tie": 0, "skip": 0}
    try:
        judge_in_chunks(todo, judge.judge, session.log.append, counts)
    finally:
        judge.close()
        session.close()
    summary = {"pairs": len(pairs.pairs), "judged": len(todo), "asked": judge.asked, **counts}
    print(
        f"label: {judge.source} judged {len(todo)} pairs ({len(pairs.pairs) - len(todo)} were already in {out}): "
        f"{counts['preference']} preferences, {counts['tie']} ties, {counts['skip']} skips; {judge.asked} requests sent, "
        f"the rest from the cache",
        file=sys.stderr,
    )
    return summary
