"""What the coordinator believes of what a node says about itself: pure policies, the
clock passed in.

A heartbeat is the node's own word. Placement must not follow a claim the node cannot
back (a forged capacity would make it the whole model, or the last stage, which picks
every answer), and an address the coordinator hands to clients must be one they can
safely dial (never a link-local metadata service, a multicast group or "any").

- `check_address`: the advertised address's shape and kind of IP.
- `bounded_capacity`: the capacity claim held to the node's reported hardware and to
  what its peers offer until it has served more itself.
- `check_report`: the free-form hardware and stats reports bounded in depth and size.
- `BeatLimiter`: heartbeats per node, a token bucket.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.errors import CoordinatorError

MIN_PORT = 1024
"""Nodes listen on unprivileged ports; below this a forged address could aim clients at
a host's system services."""

MAX_SYSTEM_BYTES = 16 << 40
"""More memory than any PC a volunteer offers (16 TiB): a larger report is not believed."""
MAX_GPU_BYTES = 1 << 40
MAX_GPUS = 16

MAX_REPORT_DEPTH = 4
MAX_REPORT_ITEMS = 256
"""Keys, list items and scalars in one report, all levels together."""
MAX_REPORT_BYTES = 16 << 10
MAX_KEY_CHARS = 64
MAX_TEXT_CHARS = 1000


class ClaimRefused(CoordinatorError, ValueError):
    """A heartbeat field the coordinator will not store or act on (an HTTP 400/422)."""


class TooFast(CoordinatorError):
    """A node calls more often than its limit allows (an HTTP 429 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


# ---------------------------------------------------------------- addresses


def split_address(address: str) -> tuple[str, int]:
    """'IP:PORT' or '[IPV6]:PORT' -> (ip, port); ClaimRefused when it is neither."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or len(port) > 5:
        raise ClaimRefused(f"an address is IP:PORT, not {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def check_address(address: str, allow_loopback: bool) -> str:
    """The address a node advertises, if clients may be sent to it; else ClaimRefused.

    An IP literal only (a name would be resolved by every client, to whatever its DNS
    says then), an unprivileged port, and never an IP no peer should be aimed at:
    unspecified, multicast, link-local (169.254.169.254 is the cloud metadata service),
    reserved. Loopback only where the coordinator itself runs on loopback (the demo and
    tests, where every node is on this machine)."""
    host, port = split_address(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ClaimRefused(f"an address needs an IP literal, not {host!r}") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
    if not MIN_PORT <= port <= 65535:
        raise ClaimRefused(f"port {port} is outside {MIN_PORT}..65535")
    if ip.is_unspecified or ip.is_multicast or ip.is_link_local or ip.is_reserved:
        raise ClaimRefused(f"{ip} is not an address peers may be sent to")
    if ip.is_loopback and not allow_loopback:
        raise ClaimRefused(f"{ip} is loopback, and this coordinator is not")
    return address


def is_lan_address(address: str) -> bool:
    """A private (LAN) address: a node behind a home router advertises one, which nobody
    outside its LAN can reach or be aimed at through it; peers reach such a node by ICE
    (hole punching or the relay) through the coordinator's signalling instead. So it is
    placed without answering the reachability probe, which only a public address must."""
    try:
        ip = ipaddress.ip_address(split_address(address)[0])
    except (ClaimRefused, ValueError):
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in _LAN_NETWORKS if net.version == ip.version)


_LAN_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
"""Home and carrier-grade NAT ranges (RFC 1918, RFC 6598) and IPv6 unique-local ones:
`ipaddress`'s is_private also counts documentation and benchmark ranges, which are not."""


# ---------------------------------------------------------------- capacity


def hardware_bytes(hardware: Mapping[str, Any]) -> int:
    """The memory the node's hardware report says it has: system RAM plus every GPU's
    total, each held to a believable size. 0 when the report says nothing usable."""
    system = _bytes(hardware.get("system_total_bytes"), MAX_SYSTEM_BYTES)
    gpus = hardware.get("gpus")
    vram = 0
    if isinstance(gpus, list):
        for gpu in gpus[:MAX_GPUS]:
            if isinstance(gpu, Mapping):
                vram += _bytes(gpu.get("total_bytes"), MAX_GPU_BYTES)
    return system + vram


def _bytes(value: Any, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return 0
    return min(value, most)


def bounded_capacity(claimed: int, hardware: int, proven: int, peers: Iterable[int]) -> int:
    """What placement may put on a node, from what it claims and what backs the claim.

    Never more than its hardware report totals (a node that reports none gets none).
    Beyond the bytes of the largest stage it has already served (`proven`), never more
    than the median of what the other placeable nodes may hold: one forged claim among
    honest nodes then buys no more than an honest claim as large as theirs would, so it
    cannot take the whole model or the last stage by size alone. A node with no peers
    (a swarm of one) is held to its hardware only. The price: a node truly larger than
    its peers is used as one of their size until it has served a larger stage; where
    the bounded capacities hold no chain at all, the coordinator plans with the claims
    (held to hardware) instead, since the model cannot be served without believing
    someone (service.Coordinator.replan)."""
    bound = max(0, min(claimed, hardware))
    others = sorted(peers)
    if not others:
        return bound
    typical = others[len(others) // 2]  # the upper median: a minority cannot pull it up
    return min(bound, max(proven, typical))


def peer_bound_capacities(clamped: Mapping[str, int], proven: Mapping[str, int]) -> dict[str, int]:
    """`bounded_capacity` for every node at once, each against all the others'
    hardware-clamped claims (`clamped`: node id -> min(claim, hardware))."""
    result = {}
    for node_id, own in clamped.items():
        peers = (v for k, v in clamped.items() if k != node_id)
        result[node_id] = bounded_capacity(own, own, proven.get(node_id, 0), peers)
    return result


# ---------------------------------------------------------------- reports


def check_report(name: str, value: Any) -> Any:
    """A free-form heartbeat report (hardware, stats): JSON of at most MAX_REPORT_DEPTH
    levels, MAX_REPORT_ITEMS values, MAX_REPORT_BYTES encoded, short keys and texts.
    It is stored and shown on the operator page, so its size is bounded here, once.
    Walks without recursion: a hostile report cannot exhaust the stack."""
    todo: list[tuple[Any, int]] = [(value, 0)]
    items = 0
    while todo:
        v, depth = todo.pop()
        items += 1
        if items > MAX_REPORT_ITEMS:
            raise ClaimRefused(f"{name} has more than {MAX_REPORT_ITEMS} values")
        if isinstance(v, dict):
            if depth >= MAX_REPORT_DEPTH:
                raise ClaimRefused(f"{name} nests deeper than {MAX_REPORT_DEPTH} levels")
            for k, child in v.items():
                if not isinstance(k, str) or len(k) > MAX_KEY_CHARS:
                    raise ClaimRefused(f"{name} has a key longer than {MAX_KEY_CHARS}")
                todo.append((child, depth + 1))
        elif isinstance(v, list):
            if depth >= MAX_REPORT_DEPTH:
                raise ClaimRefused(f"{name} nests deeper than {MAX_REPORT_DEPTH} levels")
            todo.extend((child, depth + 1) for child in v)
        elif isinstance(v, str):
            if len(v) > MAX_TEXT_CHARS:
                raise ClaimRefused(f"{name} has a text longer than {MAX_TEXT_CHARS}")
        elif v is not None and not isinstance(v, bool | int | float):
            raise ClaimRefused(f"{name} holds a {type(v).__name__}")
    if len(json.dumps(value)) > MAX_REPORT_BYTES:
        raise ClaimRefused(f"{name} is larger than {MAX_REPORT_BYTES} bytes")
    return value


# ---------------------------------------------------------------- heartbeat rate

MAX_TRACKED = 100_000
"""Nodes remembered by a limiter at most (each joined node is one key)."""


@dataclass
class BeatLimiter:
    """A token bucket per node: `burst` beats at once, refilled at `per_s`. A worker
    beats every few seconds, every 0.25 s at most (while its link onward is down), so the
    defaults never touch an honest node; a flood is answered 429 before any database
    work or re-plan."""

    per_s: float = 5.0
    burst: float = 10.0
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    """node id -> (tokens left, when counted)."""

    def take(self, key: str, now: float) -> float:
        """0 when the beat may go ahead (and count it), else the seconds to wait."""
        tokens, then = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - then) * self.per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.per_s
        if key not in self._buckets and len(self._buckets) >= MAX_TRACKED:
            del self._buckets[next(iter(self._buckets))]
        self._buckets[key] = (tokens - 1.0, now)
        return 0.0
