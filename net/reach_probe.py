"""A reachability probe: how a coordinator learns that a node's advertised UDP address
really reaches that node before it places the node and hands the address to others.

The coordinator sends one small datagram, PROBE + a random nonce, to the address; a
waiting worker answers from the port it will serve QUIC on with ANSWER + the same
nonce. Only an answer carrying the nonce counts, so an address that merely exists (a
metadata service, another program's port, a black hole) never passes. The answer is
never larger than the probe, so the probe cannot be used to amplify traffic.

Both messages start with a zero byte: the QUIC fixed bit is clear, so no QUIC packet
can be mistaken for one, and a QUIC server that later owns the port drops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from typing import Any

log = logging.getLogger(__name__)

PROBE = b"\x00sangama-probe\x00"
ANSWER = b"\x00sangama-here\x00\x00"
NONCE_BYTES = 16
assert len(PROBE) == len(ANSWER)
PROBE_BYTES = len(PROBE) + NONCE_BYTES


def new_probe() -> tuple[bytes, bytes]:
    """(the datagram to send, the answer that proves the address reaches a node)."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return PROBE + nonce, ANSWER + nonce


def answer_to(datagram: bytes) -> bytes | None:
    """The answer to a well-formed probe, else None (anything else is ignored)."""
    if len(datagram) != PROBE_BYTES or not datagram.startswith(PROBE):
        return None
    return ANSWER + datagram[len(PROBE) :]


class _Responder(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        reply = answer_to(data)
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)

    def error_received(self, exc: Exception) -> None:  # ICMP from a prober that left
        log.debug("probe responder: %s", exc)


async def open_responder(host: str, port: int) -> asyncio.DatagramTransport | None:
    """Answer probes on (host, port) until the transport is closed; None where the port
    cannot be bound (the node is then left unplaced, which its log says)."""
    loop = asyncio.get_running_loop()
    try:
        transport, _ = await loop.create_datagram_endpoint(
            _Responder, local_addr=(host, port), reuse_port=False
        )
    except OSError as exc:
        log.warning("cannot answer reachability probes on %s:%d: %s", host, port, exc)
        return None
    return transport


def probe(host: str, port: int, timeout_s: float, tries: int = 3) -> bool:
    """True when (host, port) answered a probe within `timeout_s` (blocking, bounded:
    `tries` datagrams spread over the timeout, one may be lost)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return False
    family, kind, proto, _, target = infos[0]
    datagram, expected = new_probe()
    deadline = time.monotonic() + timeout_s
    with socket.socket(family, kind, proto) as s:
        try:
            s.connect(target)
            for i in range(tries):
                s.send(datagram)
                slot = deadline - (timeout_s * (tries - 1 - i) / tries)
                while (left := slot - time.monotonic()) > 0:
                    s.settimeout(left)
                    with contextlib.suppress(TimeoutError, BlockingIOError):
                        if s.recv(64) == expected:
                            return True
        except OSError:  # refused, unreachable: nothing answers there
            return False
    return False
