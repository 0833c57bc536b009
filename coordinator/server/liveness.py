"""Whether nothing listens at a node's address: the coordinator's own check of a client's
report that a stage died, so the spare can take over at once instead of when the stage
has been silent for `stale_after_s`.

A client's word alone must never evict a worker (any client could push healthy workers
out), so the coordinator asks the worker's host itself: a UDP datagram to the advertised
QUIC port. A process that was killed leaves the port closed and the host answers "port
unreachable" (ICMP), which a connected UDP socket reports as ECONNREFUSED. A live QUIC
server drops the one stray byte silently, and a host behind NAT, a firewall or packet
loss answers nothing either: only the refusal counts as proof; silence proves nothing and
leaves the node to the heartbeat timeouts.

One case fools it: a firewall between the coordinator and a live worker that REJECTs
(answers "port unreachable" for the worker). That worker is dropped from the plan on a
client's report, and its next heartbeat puts it back (as a spare: its stage has moved);
it is never locked out.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterable

PROBE_TIMEOUT_S = 0.3
PROBE_TRIES = 3
"""Datagrams sent, spaced over the timeout (one may be lost, ICMP is rate-limited)."""


def split_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port); ValueError when it is neither."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not HOST:PORT: {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def nothing_listens(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True only when `address` (HOST:PORT) refused a datagram: nothing listens there."""
    try:
        host, port = split_address(address)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (OSError, ValueError):  # an address nobody can dial proves nothing
        return False
    family, kind, proto, _, target = infos[0]
    with socket.socket(family, kind, proto) as s:
        try:
            s.connect(target)
            deadline = time.monotonic() + timeout_s
            for _ in range(PROBE_TRIES):
                s.send(b"\0")
                s.settimeout(max(0.01, min(timeout_s / PROBE_TRIES, deadline - time.monotonic())))
                with contextlib.suppress(TimeoutError, BlockingIOError):
                    s.recv(2048)  # a reply: something listens
                    return False
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False


def confirmed_gone(
    reported: Iterable[str],
    address_of: Callable[[str], str | None],
    probe: Callable[[str], bool] = nothing_listens,
) -> set[str]:
    """Of the nodes a client reported dead, those whose address refuses (pure but for
    `probe`): unknown nodes and nodes with no address are not confirmed."""
    gone = set()
    for node_id in reported:
        address = address_of(node_id)
        if address and probe(address):
            gone.add(node_id)
    return gone
