"""A reward served over HTTP: ``http://…`` or ``https://…``. One JSON POST per batch, standard library only::

    request  {"prompts": [str, ...], "completions": [str, ...], "<column>": [...], ...}
    reply    {"rewards": [float | null, ...]}          one per completion, in order

(README, "Reward sources"). A column named ``prompts`` or ``completions`` is not sent. A timeout, a refused
connection, HTTP 408/429 and 5xx are retried with exponential backoff; other HTTP errors and malformed replies
fail at once. Every error names the URL.
"""

from __future__ import annotations

import json
import math
import urllib.parse

from rlhf.httpclient import HttpFailure, cut, send
from rlhf.rollout.rewards.base import RewardError

_JSON_TYPES = {str: "string", list: "array", dict: "object", bool: "boolean"}


class HttpReward:
    """POSTs each batch to ``url`` (module docstring). ``name`` defaults to the URL's host; ``timeout``: seconds
    per reply; ``tries``: attempts per batch (1 = no retry); ``backoff``: seconds slept before the second attempt,
    doubled before each further one."""

    def __init__(
        self, url: str, *, name: str | None = None, timeout: float = 30.0, tries: int = 3, backoff: float = 1.0
    ):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise RewardError(f"reward URL {url!r} must look like http://host[:port]/path or https://…")
        self.url = url
        self.name = name or parsed.hostname
        self.timeout, self.tries, self.backoff = float(timeout), int(tries), float(backoff)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}

    def score(self, prompts: list[str], completions: list[str], columns: dict[str, list]) -> list[float | None]:
        body = {key: value for key, value in columns.items() if key not in ("prompts", "completions")}
        body |= {"prompts": prompts, "completions": completions}
        try:
            data = json.dumps(body).encode()
        except (TypeError, ValueError) as error:
            raise RewardError(f"reward {self.url}: the batch is not JSON-serialisable: {error}") from error
        try:
            reply = send("POST", self.url, data, self.headers, self.timeout, self.tries, self.backoff)
        except HttpFailure as error:
            raise RewardError(f"reward {self.url} {error}") from error
        try:
            parsed = json.loads(reply)
        except ValueError as error:
            raise RewardError(f"reward {self.url}: reply is not JSON: {cut(reply)}") from error
        if not isinstance(parsed, dict) or "rewards" not in parsed:
            raise RewardError(f'reward {self.url}: reply has no "rewards" key: {cut(reply)}')
        rewards = parsed["rewards"]
        if not isinstance(rewards, list) or len(rewards) != len(completions):
            got = f"{len(rewards)} rewards" if isinstance(rewards, list) else f"a {type(rewards).__name__}"
            raise RewardError(f'reward {self.url}: "rewards" is {got}, expected a list of {len(completions)}')
        # each reward checked here, so the error names the URL (the check downstream only knows the host)
        for i, value in enumerate(rewards):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                kind = _JSON_TYPES.get(type(value), type(value).__name__)
                raise RewardError(
                    f'reward {self.url}: "rewards"[{i}] is {cut(json.dumps(value))} (a JSON {kind}), '
                    "expected a number, or null for a completion that cannot be scored"
                )
            if not math.isfinite(value):
                raise RewardError(
                    f'reward {self.url}: "rewards"[{i}] is {value}; send null for a completion that cannot be scored'
                )
        return rewards

    def __repr__(self) -> str:
        return f"HttpReward({self.url!r}, name={self.name!r})"
