"""Sans-IO timing of the delay proxy: when each held datagram is due, and how early to wake.

Every direction of every flow is a lane: a FIFO whose due times never decrease, so
jitter never reorders a lane (netem without reordering). One time-ordered heap of lane
heads serves the whole proxy, so a proxy needs one timer however many flows it carries.

Event loops wake late: asyncio rounds a selector timeout up to the next millisecond and
libuv counts in milliseconds, so a timer asked for T fires at T + 0..1 ms, plus the
scheduler's latency. A 20-hop chain paid that on every link. `WakeLead` measures how late
the timer fires and asks for the wake-up that much earlier; the shell then waits out the
last fraction of a millisecond itself, so no datagram ever leaves before it is due (a
link's delay is a lower bound, as a real wire's is). No clock is read here: the shell
passes `now` in.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

L = TypeVar("L", bound=Hashable)


class LaneSchedule(Generic[L]):
    """Held datagrams of many lanes, released in due order, never before due."""

    def __init__(self) -> None:
        self._lanes: dict[L, deque[tuple[float, bytes]]] = {}
        self._last_due: dict[L, float] = {}
        self._heap: list[tuple[float, int, L]] = []
        """(head due, entry number, lane) for every non-empty lane not on hold."""
        self._entry: dict[L, int] = {}
        """The heap entry that is current for each lane; any other entry is stale."""
        self._held: set[L] = set()
        self._seq = 0

    def __len__(self) -> int:
        return sum(len(q) for q in self._lanes.values())

    def push(self, lane: L, data: bytes, now: float, delay_s: float) -> float:
        """Hold `data` on `lane` until `now + delay_s` (later if the lane's previous
        datagram is due later: no reordering). Returns its due time."""
        due = max(now + max(delay_s, 0.0), self._last_due.get(lane, now))
        self._last_due[lane] = due
        queue = self._lanes.setdefault(lane, deque())
        queue.append((due, data))
        if len(queue) == 1:
            self._queue_head(lane)
        return due

    def hold(self, lane: L) -> None:
        """The lane cannot send (its socket is not up yet): keep its datagrams back."""
        self._held.add(lane)

    def release(self, lane: L) -> None:
        """The lane can send again; its overdue datagrams come out of the next `pop_due`."""
        self._held.discard(lane)
        self._queue_head(lane)

    def discard(self, lane: L) -> int:
        """Forget a lane's datagrams (closing); how many there were."""
        queue = self._lanes.pop(lane, deque())
        self._last_due.pop(lane, None)
        self._held.discard(lane)
        self._entry.pop(lane, None)
        return len(queue)

    def next_due(self) -> float | None:
        """When the earliest datagram that can be sent is due; None if there is none."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[tuple[L, bytes, float]]:
        """Every sendable datagram due at `now` as (lane, data, due), in due order (each
        lane stays FIFO)."""
        out: list[tuple[L, bytes, float]] = []
        while (head := self.next_due()) is not None and head <= now:
            _, _, lane = heapq.heappop(self._heap)
            del self._entry[lane]
            due, data = self._lanes[lane].popleft()
            out.append((lane, data, due))
            self._queue_head(lane)  # its next datagram, in due order with the other lanes
        return out

    def _queue_head(self, lane: L) -> None:
        queue = self._lanes.get(lane)
        if not queue or lane in self._held or lane in self._entry:
            return
        self._seq += 1
        heapq.heappush(self._heap, (queue[0][0], self._seq, lane))
        self._entry[lane] = self._seq

    def _drop_stale(self) -> None:
        # A discarded lane's entry stays in the heap until it reaches the top.
        while self._heap and self._entry.get(self._heap[0][2]) != self._heap[0][1]:
            heapq.heappop(self._heap)


@dataclass
class WakeLead:
    """How much earlier than due to ask for a wake-up: the timer's measured lateness.

    `observe(asked, woke)` after every wake-up; `lead` is a moving average of the
    lateness plus a margin, capped so a stalled machine cannot make the shell spin long.
    """

    lead_s: float = 0.0
    margin_s: float = 0.0002
    cap_s: float = 0.002
    weight: float = 0.125

    def observe(self, asked: float, woke: float) -> None:
        late = min(max(woke - asked, 0.0), self.cap_s)
        self.lead_s += self.weight * (late - self.lead_s)

    @property
    def lead(self) -> float:
        return min(self.lead_s + self.margin_s, self.cap_s)
