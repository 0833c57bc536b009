"""The coordinator's signalling boxes: ICE offers and answers carried between nodes that
the plan links, bounded in number, size, rate and age. Pure but for the clock, which
every call passes in.

Carrying a signal makes the receiving node start an ICE session (sockets, STUN checks,
a relay allocation), so a signal is a request to use someone else's network stack:
- an offer goes only along a link the plan has: a stage to the stage before or after
  it (and the last stage to the first, which closes the ring), a client to a stage of
  a chain it may be routed through;
- an answer goes only back to a node whose offer on that link was carried;
- each sender has a rate (a token bucket), each box a size, each sender a share of a
  box, and every message an age after which nobody waits for it any more.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from coordinator.contract import Signal
from coordinator.errors import CoordinatorError
from coordinator.server.node_claims import BeatLimiter
from coordinator.server.placement import Plan

SIGNAL_TTL_S = 30.0
"""An ICE exchange waits seconds for its answer; older messages are dropped unread."""
MAX_PER_BOX = 32
"""Unread messages one node may hold."""
MAX_FROM_ONE = 8
"""Unread messages from one sender in one box."""
MAX_TOTAL = 4096
"""Unread messages in all boxes together."""
MAX_OFFERS_REMEMBERED = 4096
SEND_PER_S = 1.0
SEND_BURST = 8.0
"""Signals one node may post: 8 at once, one a second after that. An ICE exchange is
two rounds at most (the relay-only retry), so a stage with a few peers stays far below."""


class SignalRefused(CoordinatorError):
    """A signal the coordinator will not carry: no planned link, or a limit reached.
    `status` is the HTTP answer (403 for no link, 429 for a limit)."""

    def __init__(self, message: str, status: int, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


def planned_peers(chains: Iterable[Plan], node_id: str, role: str) -> set[str]:
    """The nodes `node_id` may send an ICE offer to, by the plan's links."""
    peers: set[str] = set()
    for chain in chains:
        ids = chain.node_ids
        if role == "client":
            peers.update(ids)
            continue
        if node_id not in ids:
            continue
        i = ids.index(node_id)
        if i > 0:
            peers.add(ids[i - 1])
        if i + 1 < len(ids):
            peers.add(ids[i + 1])
        if len(ids) > 1 and i in (0, len(ids) - 1):
            peers.add(ids[-1] if i == 0 else ids[0])  # the ring's closing link
    peers.discard(node_id)
    return peers


@dataclass(frozen=True)
class _Held:
    expires_at: float
    signal: Signal


@dataclass
class SignalBoxes:
    """Every node's unread signals. Not thread-safe: its owner (service.Coordinator)
    calls it under its lock."""

    ttl_s: float = SIGNAL_TTL_S
    _boxes: dict[str, deque[_Held]] = field(default_factory=dict)
    _offers: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """(offerer, receiver, link) -> until when an answer to it may be carried."""
    _rate: BeatLimiter = field(default_factory=lambda: BeatLimiter(SEND_PER_S, SEND_BURST))
    _total: int = 0

    def post(self, signal: Signal, dst: str, allowed: set[str], now: float) -> None:
        """Queue `signal` for `dst`; SignalRefused when it may not go there (`allowed`:
        the sender's planned peers) or a limit is reached."""
        src = signal.sender
        self._prune(now)
        if signal.kind == "answer":
            if self._offers.get((dst, src, signal.link), 0.0) <= now:
                raise SignalRefused(f"no offer from {dst} on link {signal.link} to answer", 403)
        elif dst not in allowed:
            raise SignalRefused(f"{src} has no planned link to {dst}", 403)
        wait = self._rate.take(src, now)
        if wait > 0:
            raise SignalRefused(f"{src} sends signals too fast", 429, wait)
        box = self._boxes.setdefault(dst, deque())
        if len(box) >= MAX_PER_BOX or self._total >= MAX_TOTAL:
            raise SignalRefused(f"{dst} has too many unread signals", 429, self.ttl_s)
        if sum(1 for h in box if h.signal.sender == src) >= MAX_FROM_ONE:
            raise SignalRefused(f"{dst} holds too many unread signals from {src}", 429, self.ttl_s)
        box.append(_Held(now + self.ttl_s, signal))
        self._total += 1
        if signal.kind == "offer":
            if len(self._offers) >= MAX_OFFERS_REMEMBERED:
                del self._offers[next(iter(self._offers))]
            self._offers[(src, dst, signal.link)] = now + self.ttl_s

    def take(self, node_id: str, now: float) -> list[Signal]:
        """The node's unread signals, oldest first (each delivered once)."""
        self._prune(now)
        box = self._boxes.pop(node_id, None)
        if not box:
            return []
        self._total -= len(box)
        return [h.signal for h in box]

    def forget(self, node_ids: Sequence[str]) -> None:
        """Drop the boxes of nodes that left (revoked)."""
        for node_id in node_ids:
            box = self._boxes.pop(node_id, None)
            if box:
                self._total -= len(box)

    @property
    def unread(self) -> int:
        return self._total

    def _prune(self, now: float) -> None:
        for dst in list(self._boxes):
            box = self._boxes[dst]
            while box and box[0].expires_at <= now:
                box.popleft()
                self._total -= 1
            if not box:
                del self._boxes[dst]
        for key in [k for k, until in self._offers.items() if until <= now]:
            del self._offers[key]
