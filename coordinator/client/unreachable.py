"""Why the coordinator could not be reached, in words a volunteer can act on.

requests and urllib3 describe a failed connection as `HTTPSConnectionPool(host=...):
Max retries exceeded ... [Errno 111]`; a person needs to read "cannot reach the
coordinator at HOST:PORT (connection refused): is it running? check the address in your
invite". `unreachable(exc, url)` is the one mapping from the libraries' exceptions to
the typed errors below; the CLI, the worker's log, the tray and the chat window all
show its message as it is.
"""

from __future__ import annotations

import errno
import socket
import ssl
from urllib.parse import urlsplit

import requests
import urllib3

from coordinator.errors import CoordinatorError

CHECK_ADDRESS = "check the address in your invite"


class CoordinatorUnreachable(CoordinatorError):
    """No answer came from the coordinator; the message says why and what to do."""

    def __init__(self, message: str, where: str = "", why: str = "") -> None:
        super().__init__(message)
        self.where = where
        """HOST:PORT of the coordinator asked."""
        self.why = why
        """The cause in a few words, e.g. "connection refused"."""


class CoordinatorConnectionRefused(CoordinatorUnreachable):
    """Nothing listens at the coordinator's address (it is not running there)."""


class CoordinatorTimeout(CoordinatorUnreachable):
    """The coordinator did not answer in time (down, unreachable, or overloaded)."""


class CoordinatorTlsError(CoordinatorUnreachable):
    """The TLS handshake failed: not the swarm's certificate, or not HTTPS at that port."""


class CoordinatorNameUnknown(CoordinatorUnreachable):
    """The coordinator's host name does not resolve."""


def host_port(url: str) -> str:
    """`url`'s HOST:PORT (the default port of its scheme where it names none)."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return url
    host = parts.hostname or url
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what it wraps: urllib3 keeps the socket error in `reason`, `args` or
    the exception chain, depending on where it failed."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 16:
        e = todo.pop(0)
        if any(e is s for s in seen):
            continue
        seen.append(e)
        reason = getattr(e, "reason", None)
        nested = [reason, e.__cause__, e.__context__, *e.args]
        todo.extend(n for n in nested if isinstance(n, BaseException))
    return seen


_ERRNO_WORDS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
    errno.ENETUNREACH: "network unreachable",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ETIMEDOUT: "no answer in time",
}


def unreachable(exc: BaseException, url: str) -> CoordinatorUnreachable:
    """The typed error, with its one-sentence message, for a failed request to `url`."""
    where = host_port(url)
    causes = _causes(exc)

    def first(kind: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
        return next((c for c in causes if isinstance(c, kind)), None)

    if first(ConnectionRefusedError) is not None:
        why = "connection refused"
        return CoordinatorConnectionRefused(
            f"cannot reach the coordinator at {where} ({why}): is it running? {CHECK_ADDRESS}",
            where,
            why,
        )
    if first((socket.gaierror, urllib3.exceptions.NameResolutionError)) is not None:
        why = "the name is not known"
        return CoordinatorNameUnknown(
            f"cannot reach the coordinator at {where} ({why}): {CHECK_ADDRESS} "
            "and this PC's internet connection",
            where,
            why,
        )
    tls = first((requests.exceptions.SSLError, ssl.SSLError, urllib3.exceptions.SSLError))
    if tls is not None:
        cert = first(ssl.SSLCertVerificationError)
        why = (
            "its certificate is not the swarm's"
            if cert is not None
            else "the secure handshake failed"
        )
        return CoordinatorTlsError(
            f"cannot talk securely to the coordinator at {where} ({why}): {CHECK_ADDRESS}, "
            "or ask the operator for a new invite if the swarm was set up again",
            where,
            why,
        )
    # urllib3's NewConnectionError is a ConnectTimeoutError too: only a real one counts.
    connect_timeout = first(
        (requests.exceptions.ConnectTimeout, urllib3.exceptions.ConnectTimeoutError)
    )
    if connect_timeout is not None and not isinstance(
        connect_timeout, urllib3.exceptions.NewConnectionError
    ):
        why = "no answer in time"
        return CoordinatorTimeout(
            f"cannot reach the coordinator at {where} ({why}): is it running and reachable "
            f"from this PC? {CHECK_ADDRESS}",
            where,
            why,
        )
    if first((requests.exceptions.Timeout, urllib3.exceptions.ReadTimeoutError, TimeoutError)):
        why = "it stopped answering"
        return CoordinatorTimeout(
            f"the coordinator at {where} did not answer in time ({why}): it may be busy or "
            "restarting, try again shortly",
            where,
            why,
        )
    # requests' own exceptions are OSErrors without an errno: the socket's is further in.
    codes = [c.errno for c in causes if isinstance(c, OSError) and c.errno in _ERRNO_WORDS]
    why = "connection failed"
    if codes:
        why = _ERRNO_WORDS[codes[0]]
    elif first((requests.exceptions.ChunkedEncodingError, urllib3.exceptions.ProtocolError)):
        why = "the connection broke off"
    return CoordinatorUnreachable(
        f"cannot reach the coordinator at {where} ({why}): is it running? {CHECK_ADDRESS}",
        where,
        why,
    )
