"""Where a volunteer gets a piece: peers that hold it first, then the mirror, then us.

A worker serves the pieces of its stage (or its standby stage) to other swarm members
(app/serving/piece_server.py) and says so in its heartbeat: `pieces_address` and
`pieces_layers`. `rank_sources` (pure) orders the holders of one piece for one asker:
by the round trip the coordinator knows between the two (bucketed, so near peers
count as equal), then by how many downloads it pointed at each lately (spreading a
join storm over the holders), then by node id; then the mirror where the model has
one, then the coordinator. `PieceBook` keeps what the heartbeats said and the recent
pointings, in memory: every heartbeat says it again, so a restarted coordinator knows
it within seconds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from coordinator.contract import PieceSource
from core.errors import SliceError
from core.manifest import Manifest
from core.types import LayerRange

RTT_BUCKET_MS = 10.0
"""Round trips within the same 10 ms count as equal: then the least pointed-at wins."""
POINTED_WINDOW_S = 600.0
"""How long a download pointed at a peer counts against it."""
MAX_PEERS_LISTED = 8
MAX_POINTINGS = 4096


@dataclass(frozen=True)
class Holder:
    """A node whose heartbeat says it serves the pieces of `layers` at `address`."""

    node_id: str
    address: str
    layers: tuple[int, int]


def rank_sources(
    asker: str,
    holders: Iterable[Holder],
    rtt_ms: Mapping[tuple[str, str], float],
    pointed: Mapping[str, int],
    has_mirror: bool,
    most: int = MAX_PEERS_LISTED,
) -> list[PieceSource]:
    """The sources of one piece for `asker`, best first: `holders` (already those that
    hold it; the asker itself left out) ranked by round trip between the two (either
    direction's measurement, bucketed; unknown after known), then by downloads pointed
    at them lately, then by id; at most `most` of them; then the mirror if
    `has_mirror`; the coordinator always last."""

    def key(h: Holder) -> tuple[int, float, int, str]:
        rtt = rtt_ms.get((asker, h.node_id), rtt_ms.get((h.node_id, asker)))
        bucket = float("inf") if rtt is None else rtt // RTT_BUCKET_MS
        return (rtt is None, bucket, pointed.get(h.node_id, 0), h.node_id)

    peers = sorted((h for h in holders if h.node_id != asker), key=key)[:most]
    ranked = [PieceSource("peer", h.node_id, h.address) for h in peers]
    if has_mirror:
        ranked.append(PieceSource("mirror"))
    ranked.append(PieceSource("coordinator"))
    return ranked


def holders_of(
    file: str,
    manifest: Manifest,
    said: Iterable[Holder],
    stages: Mapping[str, Sequence[tuple[int, int]]],
    healthy: Collection[str],
) -> list[Holder]:
    """The nodes that hold piece `file`: a healthy node's word counts only for the
    layers of its own stage or standby stage (`stages`), so a node cannot draw
    downloads for pieces placement never gave it."""
    found = []
    for h in said:
        if h.node_id not in healthy or h.layers not in stages.get(h.node_id, ()):
            continue
        try:
            pieces = manifest.pieces_for(LayerRange(*h.layers))
        except (SliceError, ValueError):
            continue
        if any(p.file == file for p in pieces):
            found.append(h)
    return found


class PieceBook:
    """What nodes said about their piece servers, and where downloads were pointed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._held: dict[str, Holder] = {}
        self._pointed: deque[tuple[float, str]] = deque(maxlen=MAX_POINTINGS)
        self.coordinator_bytes = 0
        """Bytes the coordinator's piece endpoint answered with, since it started."""

    def beat(self, node_id: str, address: str, layers: tuple[int, int]) -> None:
        """A heartbeat's word (an empty address or no layers: it serves none)."""
        with self._lock:
            if address and layers[0] < layers[1]:
                self._held[node_id] = Holder(node_id, address, layers)
            else:
                self._held.pop(node_id, None)

    def forget(self, node_id: str) -> None:
        with self._lock:
            self._held.pop(node_id, None)

    def holders(self) -> list[Holder]:
        with self._lock:
            return list(self._held.values())

    def pointed(self) -> dict[str, int]:
        now = self._clock()
        with self._lock:
            while self._pointed and now - self._pointed[0][0] > POINTED_WINDOW_S:
                self._pointed.popleft()
            counts: dict[str, int] = {}
            for _at, node_id in self._pointed:
                counts[node_id] = counts.get(node_id, 0) + 1
            return counts

    def point(self, node_id: str) -> None:
        """A download was pointed at `node_id` first."""
        with self._lock:
            self._pointed.append((self._clock(), node_id))

    def sources(
        self,
        asker: str,
        file: str,
        manifest: Manifest,
        stages: Mapping[str, Sequence[tuple[int, int]]],
        healthy: Collection[str],
        rtt_ms: Mapping[tuple[str, str], float],
    ) -> list[PieceSource]:
        """Where `asker` gets piece `file` of `manifest`, best first (`rank_sources` of
        `holders_of`); the first peer listed counts as pointed at."""
        holders = holders_of(file, manifest, self.holders(), stages, healthy)
        piece = next(p for p in manifest.pieces if p.file == file)
        has_mirror = manifest.mirror is not None and manifest.mirror.ranges(piece.name) is not None
        ranked = rank_sources(asker, holders, rtt_ms, self.pointed(), has_mirror)
        if ranked[0].kind == "peer":
            self.point(ranked[0].node_id)
        return ranked

    def served(self, n_bytes: int) -> None:
        with self._lock:
            self.coordinator_bytes += max(0, n_bytes)


def asked_bytes(range_header: str | None, size: int) -> int:
    """How many bytes a GET of a `size`-byte file with this Range header answers with
    (one interval; anything else is answered whole)."""
    if not range_header or not range_header.startswith("bytes="):
        return size
    spec = range_header[6:].strip()
    first, sep, last = spec.partition("-")
    if not sep or "," in spec:
        return size
    try:
        if not first:
            return min(size, int(last))
        start = int(first)
        stop = min(int(last) + 1, size) if last else size
    except ValueError:
        return size
    return max(0, stop - start)
