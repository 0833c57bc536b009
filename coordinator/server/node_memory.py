"""What the coordinator knows of each node between heartbeats, kept in memory only:
whether it said it is paused, whether a client found it dead, how long it has been up
and until when it offers to stay, its stage's step times, and the largest stage it has
shown it can hold. Every heartbeat says these again, so a restarted coordinator learns
them within seconds; the database keeps only what the operator must not lose.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coordinator.server.fleet_view import StageReport


@dataclass(frozen=True)
class PlacementFacts:
    """What placement must know of the nodes besides their rows, at one moment."""

    paused: frozenset[str]
    suspects: frozenset[str]
    """Nodes a client could not reach: out of the plan once stale, not only once gone."""
    gone: frozenset[str]
    """Reported, and their port refused our probe (liveness.py): out until they beat."""
    proven: Mapping[str, int]
    """Node id -> bytes of the largest stage it reported serving (node_claims.py)."""


class NodeMemory:
    """Per-node facts from heartbeats and from clients' reports, under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paused: dict[str, str] = {}
        """Nodes that said they are paused, and why."""
        self._suspects: set[str] = set()
        self._gone: set[str] = set()
        self._proven: dict[str, int] = {}
        self._up_since: dict[str, float] = {}
        """Node id -> when its current run of heartbeats began (time.time())."""
        self._last_beat: dict[str, float] = {}
        self._until: dict[str, float] = {}
        """Node id -> the volunteer's declared end of availability (Unix seconds)."""
        self._reports: dict[str, StageReport] = {}
        """Node id -> its stage's step times from its latest heartbeat (fleet_view.py
        predicts from them)."""

    def heard(self, node_id: str, available_until: float, dead_after_s: float) -> None:
        """A heartbeat: whoever could not reach the node, it lives. Measured uptime: a
        beat after a silence past `dead_after_s` starts a new run."""
        now = time.time()
        with self._lock:
            self._suspects.discard(node_id)
            self._gone.discard(node_id)
            last = self._last_beat.get(node_id)
            if last is None or now - last > dead_after_s:
                self._up_since[node_id] = now
            self._last_beat[node_id] = now
            if available_until > 0:
                self._until[node_id] = available_until
            else:
                self._until.pop(node_id, None)

    def reported(self, named: Iterable[str], gone: Iterable[str]) -> None:
        """A client could not reach the `named` stages; those in `gone` refused our probe."""
        with self._lock:
            self._suspects.update(named)
            self._gone.update(gone)

    def pause(self, node_id: str, reason: str) -> None:
        with self._lock:
            self._paused[node_id] = reason

    def resume(self, node_id: str) -> None:
        with self._lock:
            self._paused.pop(node_id, None)

    def paused_reason(self, node_id: str) -> str:
        """Why the node said it is paused; "" when it offers to serve."""
        with self._lock:
            return self._paused.get(node_id, "")

    def paused(self) -> set[str]:
        with self._lock:
            return set(self._paused)

    def suspects(self) -> set[str]:
        with self._lock:
            return set(self._suspects)

    def gone(self) -> set[str]:
        with self._lock:
            return set(self._gone)

    def report(self, node_id: str, report: StageReport) -> None:
        with self._lock:
            self._reports[node_id] = report

    def reports(self) -> dict[str, StageReport]:
        with self._lock:
            return dict(self._reports)

    def prove(self, node_id: str, stage_bytes: int) -> None:
        """The node reported serving a whole stage of this many bytes."""
        with self._lock:
            self._proven[node_id] = max(self._proven.get(node_id, 0), stage_bytes)

    def uptimes(self) -> tuple[dict[str, float], dict[str, float]]:
        """(node id -> when its run of heartbeats began, node id -> its declared end)."""
        with self._lock:
            return dict(self._up_since), dict(self._until)

    def for_placement(self) -> PlacementFacts:
        with self._lock:
            return PlacementFacts(
                frozenset(self._paused),
                frozenset(self._suspects),
                frozenset(self._gone),
                dict(self._proven),
            )

    def forget(self, node_id: str) -> None:
        """The operator forgot the node: what it reported goes with it."""
        with self._lock:
            for memory in (self._paused, self._reports, self._proven):
                memory.pop(node_id, None)
            for times in (self._up_since, self._last_beat, self._until):
                times.pop(node_id, None)
