"""A failed request to the coordinator reads as one sentence with what to do, whatever
requests and urllib3 wrapped it in."""

from __future__ import annotations

import errno
import socket
import ssl

import pytest
import requests
import urllib3
from urllib3.connection import HTTPSConnection

from coordinator.client.unreachable import (
    CoordinatorConnectionRefused,
    CoordinatorNameUnknown,
    CoordinatorTimeout,
    CoordinatorTlsError,
    CoordinatorUnreachable,
    host_port,
    unreachable,
)

pytestmark = pytest.mark.unit

URL = "https://203.0.113.5:8443/api/v1/route"


def _wrapped(cause: BaseException) -> requests.ConnectionError:
    """What requests raises: ConnectionError(MaxRetryError(reason=NewConnectionError))
    with the socket's error as the NewConnectionError's cause."""
    conn = HTTPSConnection("203.0.113.5", 8443)
    try:
        raise urllib3.exceptions.NewConnectionError(conn, f"Failed: {cause}") from cause
    except urllib3.exceptions.NewConnectionError as new:
        pool = urllib3.HTTPSConnectionPool("203.0.113.5", 8443)
        retries = urllib3.exceptions.MaxRetryError(pool, "/api/v1/route", new)
        return requests.ConnectionError(retries)


def _plain(err: CoordinatorUnreachable) -> str:
    text = str(err)
    for internal in ("HTTPSConnectionPool", "Max retries", "Errno", "urllib3", "object at 0x"):
        assert internal not in text, text
    assert "\n" not in text
    return text


def test_connection_refused_says_so_and_what_to_check() -> None:
    err = unreachable(_wrapped(ConnectionRefusedError(errno.ECONNREFUSED, "refused")), URL)
    assert isinstance(err, CoordinatorConnectionRefused)
    assert _plain(err) == (
        "cannot reach the coordinator at 203.0.113.5:8443 (connection refused): "
        "is it running? check the address in your invite"
    )
    assert (err.where, err.why) == ("203.0.113.5:8443", "connection refused")


def test_unknown_name_and_unreachable_network() -> None:
    name = unreachable(_wrapped(socket.gaierror(-2, "Name or service not known")), URL)
    assert isinstance(name, CoordinatorNameUnknown) and "name is not known" in _plain(name)
    net = unreachable(_wrapped(OSError(errno.ENETUNREACH, "Network is unreachable")), URL)
    assert type(net) is CoordinatorUnreachable and "(network unreachable)" in _plain(net)


def test_tls_failures_point_at_the_address_or_a_new_invite() -> None:
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    err = unreachable(requests.exceptions.SSLError(urllib3.exceptions.SSLError(verify)), URL)
    assert isinstance(err, CoordinatorTlsError)
    assert "certificate is not the swarm's" in _plain(err) and "new invite" in str(err)
    other = unreachable(requests.exceptions.SSLError("wrong version number"), URL)
    assert isinstance(other, CoordinatorTlsError) and "handshake failed" in _plain(other)


def test_timeouts_tell_connecting_from_a_slow_answer() -> None:
    connect = unreachable(requests.exceptions.ConnectTimeout("timed out"), URL)
    assert isinstance(connect, CoordinatorTimeout) and "reachable from this PC" in _plain(connect)
    read = unreachable(requests.exceptions.ReadTimeout("read timed out"), URL)
    assert isinstance(read, CoordinatorTimeout) and "did not answer in time" in _plain(read)


def test_anything_else_is_still_one_plain_sentence() -> None:
    err = unreachable(requests.exceptions.ChunkedEncodingError("Connection broken"), URL)
    assert type(err) is CoordinatorUnreachable and "broke off" in _plain(err)


def test_host_port_fills_the_default_port() -> None:
    assert host_port("https://swarm.example.org/x") == "swarm.example.org:443"
    assert host_port("https://[::1]:8443") == "[::1]:8443"
