"""HTTP requests with retries, for the services ``rlhf`` calls (a reward server, an LLM judge, a vLLM server);
standard library only. A timeout, a refused connection, HTTP 408/429 and 5xx are retried with exponential backoff;
another HTTP error is final at once. `HttpFailure` says what happened at every try."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Mapping

RETRIED_STATUS = frozenset({408, 429})
EXCERPT = 200


class ServiceError(Exception):
    """A service called over HTTP (an LLM judge, a reward server) gave no usable answer: down, slow or answering
    errors. The user's environment, not a bug: the message names the URL and what each try got (exit 2)."""


class HttpFailure(Exception):
    """The request failed for good; ``final`` is True when the server refused it (retrying cannot help)."""

    def __init__(self, message: str, final: bool):
        super().__init__(message)
        self.final = final


def send(
    method: str, url: str, data: bytes | None, headers: Mapping[str, str], timeout: float, tries: int, backoff: float
) -> bytes:
    """The reply body of a ``method`` request (``GET``, ``POST``…) to ``url``, trying up to ``tries`` times
    (``backoff`` seconds before the second try, doubled before each further one); `HttpFailure` otherwise."""
    failures = []
    for attempt in range(tries):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=data, headers=dict(headers), method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            try:
                body = error.read()
            except OSError:
                body = b""
            detail = f"HTTP {error.code} {error.reason}: {cut(body)}"
            if error.code < 500 and error.code not in RETRIED_STATUS:
                raise HttpFailure(f"refused the request: {detail}", final=True) from error
            failures.append(detail)
        except (TimeoutError, urllib.error.URLError) as error:  # a read timeout (socket.timeout), or no connection
            reason = error.reason if isinstance(error, urllib.error.URLError) else error
            timed_out = isinstance(reason, TimeoutError)
            failures.append(f"no reply within {timeout:g} s ({reason})" if timed_out else f"cannot connect: {reason}")
        except OSError as error:  # connection reset mid-reply and the like
            failures.append(f"{type(error).__name__}: {error}")
    attempts = "; ".join(f"try {i + 1}: {failure}" for i, failure in enumerate(failures))
    raise HttpFailure(f"failed after {tries} tries — {attempts}", final=False)


def cut(body: bytes | str) -> str:
    """A reply body shortened for an error message, quoted."""
    text = (body.decode("utf-8", "replace") if isinstance(body, bytes) else body).strip()
    return repr(text[:EXCERPT] + "…" if len(text) > EXCERPT else text)
