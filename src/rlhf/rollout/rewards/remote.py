"""A reward served over HTTP: ``http://…`` or ``https://…``.

Protocol (one POST per batch, JSON both ways, standard library only)::

    request  {"prompts": [str, ...], "completions": [str, ...], "<column>": [...], ...}
    reply    {"rewards": [float | null, ...]}          one per completion, in order

Extra dataset columns are sent as further top-level keys, one list per column (as reward functions
receive them as keyword arguments); a column named ``prompts`` or ``completions`` is not sent.
A timeout, a refused connection, HTTP 408/429 and 5xx are retried with exponential backoff; other HTTP
errors and malformed replies fail at once. Every error names the URL.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from collections.abc import Mapping

from rlhf.httpclient import HttpFailure, cut, post
from rlhf.rollout.rewards.base import RewardError


class HttpReward:
    """POSTs each batch to ``url``; see the module docstring for the protocol.

    Args:
        url: ``http://`` or ``https://`` endpoint.
        name: metric name; default the URL's host.
        timeout: seconds to wait for each reply.
        tries: attempts per batch (1 = no retry).
        backoff: seconds slept before the second attempt, doubled before each further one.
        headers: extra HTTP headers (e.g. ``Authorization``).
    """

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        timeout: float = 30.0,
        tries: int = 3,
        backoff: float = 1.0,
        headers: Mapping[str, str] | None = None,
    ):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise RewardError(f"reward URL {url!r} must look like http://host[:port]/path or https://…")
        if tries < 1 or timeout <= 0 or backoff < 0:
            raise ValueError(f"reward {url}: need tries >= 1, timeout > 0, backoff >= 0")
        self.url = url
        self.name = name or parsed.hostname
        self.timeout, self.tries, self.backoff = float(timeout), int(tries), float(backoff)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}

    def score(self, prompts: list[str], completions: list[str], columns: dict[str, list]) -> list[float | None]:
        body = {key: value for key, value in columns.items() if key not in ("prompts", "completions")}
        body |= {"prompts": prompts, "completions": completions}
        try:
            data = json.dumps(body).encode()
        except (TypeError, ValueError) as error:
            raise RewardError(f"reward {self.url}: the batch is not JSON-serialisable: {error}") from error
        reply = self._post(data)
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
        for i, value in enumerate(rewards):
            _check_number(self.url, i, value)
        return rewards

    def _post(self, data: bytes) -> bytes:
        """The reply body; retries transient failures, raises :class:`RewardError` naming the URL."""
        try:
            return post(self.url, data, self.headers, self.timeout, self.tries, self.backoff)
        except HttpFailure as error:
            raise RewardError(f"reward {self.url} {error}") from error

    def __repr__(self) -> str:
        return f"HttpReward({self.url!r}, name={self.name!r})"


def _check_number(url: str, i: int, value: object) -> None:
    """A reply's reward ``i`` must be a finite JSON number or null; the error names the URL (the generic check
    downstream only knows the source's name, often just the host)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardError(
            f'reward {url}: "rewards"[{i}] is {cut(json.dumps(value))} (a JSON {_json_type(value)}), '
            "expected a number, or null for a completion that cannot be scored"
        )
    if not math.isfinite(value):
        raise RewardError(f'reward {url}: "rewards"[{i}] is {value}; send null for a completion that cannot be scored')


def _json_type(value: object) -> str:
    names = {str: "string", list: "array", dict: "object", bool: "boolean"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), type(value).__name__)
