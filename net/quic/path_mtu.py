"""Path MTU discovery for QUIC links: what makes probing safe on a socket.

A Gemma hidden state is a 2620-byte STEP frame: three QUIC packets at the 1200-byte
minimum, each with its own encryption, syscall and wake-up on both ends. Most paths carry
more (Ethernet 1500, loopback 65536), so links discover the path's size in the spirit of
RFC 8899 (DPLPMTUD): every link starts at 1200, the client sends padded probes of larger
sizes, raises its datagram size only once a probe of that size is acknowledged, and falls
back when large packets stop arriving. qh3's packet core does the probing
(`probe_datagram_size`); this module decides where it may.

Probing is only sound when a datagram larger than the path can never arrive in pieces:
with IP fragmentation a probe "succeeds" and every frame afterwards travels as fragments,
which middleboxes and NATs drop. So the socket must set Don't Fragment and ignore the
kernel's own PMTU guess (Linux `IP_PMTUDISC_PROBE`): a datagram too large for the
interface fails at once (EMSGSIZE, a lost datagram to QUIC), one too large for a router
on the way is dropped there. Where that cannot be set, links stay at 1200.

Where the path's MTU could shrink under an open link, it does not probe either: qh3 has
no black-hole detection once a size is adopted (measured: a loopback link at 2651-byte
datagrams whose path then dropped everything over 1300 bytes delivered nothing for 20 s
while its small keepalives kept it open). Loopback and LAN paths (`may_probe`) keep their
MTU for a link's life; public internet paths stay at 1200 until the link can detect a
black hole and fall back.

The server end of a link never probes and sends at 1200: qh3's server side raises its
size without a probe (measured: a path dropping datagrams over 1300 bytes stalled the
server's direction). Hidden states flow from the dialer (a stage's client side) to the
next stage's server, so the hot direction is the one that probes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import sys
from typing import Any

BASE_DATAGRAM_SIZE = 1200
"""QUIC's minimum (RFC 9000 §14): every path must carry it, so every link starts here."""

PROBE_CEILING = 8952
"""The largest datagram probed for: a 9000-byte jumbo frame less IPv6 and UDP headers.
Loopback and jumbo LANs carry a 2048-wide f32 row (8 KB) in one datagram; Ethernet paths
settle at about 1452, so a Gemma-270M hidden state is two datagrams instead of three."""

# Linux's values (linux/in.h, linux/in6.h); Python's socket module does not name them all.
_IP_MTU_DISCOVER = 10
_IPV6_MTU_DISCOVER = 23
_PMTUDISC_PROBE = 3
"""Set Don't Fragment, ignore the kernel's PMTU cache: the packetization layer decides."""


def set_dont_fragment(sock: Any) -> bool:
    """Make `sock` send every datagram whole or not at all; True if it now does.

    Linux only (the option that also ignores the kernel's PMTU cache); other platforms
    return False and their links do not probe."""
    if sys.platform != "linux":
        return False
    family = getattr(sock, "family", None)
    if family == socket.AF_INET:
        level, option = socket.IPPROTO_IP, getattr(socket, "IP_MTU_DISCOVER", _IP_MTU_DISCOVER)
    elif family == socket.AF_INET6:
        level = socket.IPPROTO_IPV6
        option = getattr(socket, "IPV6_MTU_DISCOVER", _IPV6_MTU_DISCOVER)
    else:
        return False
    with contextlib.suppress(OSError):
        sock.setsockopt(level, option, _PMTUDISC_PROBE)
        return True
    return False


def probe_ceiling(requested: int) -> int:
    """The probing ceiling a tuning asks for, or 0 (no probing) when it is at or below the
    base size; never above what one UDP datagram can carry over IPv6."""
    if requested <= BASE_DATAGRAM_SIZE:
        return 0
    return min(requested, 65527)


def may_probe(peer_host: str) -> bool:
    """Whether a link to `peer_host` (a numeric address) may probe: loopback, private and
    link-local addresses, whose path MTU is an interface's and does not change under an
    open link. Names and public addresses: no."""
    try:
        address = ipaddress.ip_address(peer_host.split("%", 1)[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local
