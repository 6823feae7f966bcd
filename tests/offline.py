"""The suite needs no network, by construction: inside the test processes every name lookup and connection outside
this machine is refused and recorded (tests/conftest.py fails the test that made one), and the processes a test
starts inherit ``HF_HUB_OFFLINE=1``, so ``huggingface_hub`` answers from the local cache or fails at once.

Loopback (127.0.0.0/8, ::1, ``localhost``) stays open: the labelling page, the LLM judge's HTTP server, the vLLM
server and torchrun's rendezvous are real servers on this machine. The guard sits on :func:`socket.getaddrinfo`
and :meth:`socket.socket.connect` (``connect_ex`` too), the two doors every Python HTTP client goes through.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Any

ATTEMPTS: list[str] = []
"""The outside hosts the test process tried to reach since the list was last cleared."""

_getaddrinfo = socket.getaddrinfo
_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def is_local(host: Any) -> bool:
    """Whether ``host`` (a name or an address, str or bytes; None = the local wildcard) is this machine."""
    if host is None:
        return True
    name = host.decode() if isinstance(host, bytes) else str(host)
    name = name.strip("[]").split("%", 1)[0]  # an IPv6 literal in brackets, or with a zone
    if name in ("", "localhost", "localhost.localdomain", socket.gethostname()) or name.endswith(".localhost"):
        return True  # the machine's own name too: gloo and servers resolve it to bind
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # a name that would need the DNS
    return address.is_loopback or address.is_unspecified


def _refuse(host: Any) -> OSError:
    ATTEMPTS.append(str(host))
    return OSError(errno.ENETUNREACH, f"the test suite runs offline (tests/offline.py); it reached for {host!r}")


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not is_local(host):
        raise _refuse(host)
    return _getaddrinfo(host, *args, **kwargs)


def _outside(sock: socket.socket, address: Any) -> bool:
    return sock.family in (socket.AF_INET, socket.AF_INET6) and not is_local(address[0])


def _guarded_connect(self: socket.socket, address: Any) -> None:
    if _outside(self, address):
        raise _refuse(address[0])
    return _connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    if _outside(self, address):
        _refuse(address[0])
        return errno.ENETUNREACH
    return _connect_ex(self, address)


def install() -> None:
    """Refuse the network in this process from now on (idempotent)."""
    socket.getaddrinfo = _guarded_getaddrinfo
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
