"""The operator's event timeline: the newest MAX_EVENTS events in the coordinator's
database (a restart keeps them), and what the rules need to remember between changes.

A thin shell: coordinator/server/events.py decides which change makes which event;
this owns the memory those rules compare against (each node's last report and what was
last said about its liveness, the last plan told) and writes what they return.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from coordinator.server.events import (
    KINDS,
    MAX_DETAIL,
    PendingEvent,
    PlanView,
    Report,
    beat_events,
    bounded,
    liveness_after,
    plan_events,
    silence_events,
)
from coordinator.server.store import Event, Store, as_utc, utcnow

log = logging.getLogger(__name__)

MAX_EVENTS = 500
"""Events kept; older ones are deleted as new ones come."""
MAX_READ = 500
SWEEP_EVERY_S = 1.0
"""How often nodes' silence is looked at (on heartbeats and page reads)."""


@dataclass(frozen=True)
class StoredEvent:
    id: int
    at: dt.datetime
    kind: str
    node_id: str
    detail: str


class UnknownEventKind(ValueError):
    """An event kind not in events.KINDS."""


class Timeline:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._reports: dict[str, Report] = {}
        """Node id -> its last report since this coordinator started."""
        self._liveness: dict[str, str] = {}
        """Node id -> what the timeline last said about its liveness (events.LIVE ...)."""
        self._plans: dict[str, PlanView | None] = {}
        """Hosted model ("" for the default) -> its plan as last told."""
        self._swept_at = -math.inf
        # What was said before a restart stands: a node told gone is not told so again.
        for e in self.events(limit=MAX_EVENTS):
            said = KINDS[e.kind].liveness if e.kind in KINDS else ""
            if said and e.node_id:
                self._liveness[e.node_id] = said

    # ------------------------------------------------------------ writing

    def record(self, kind: str, node_id: str = "", detail: str = "") -> None:
        """Keep one event; UnknownEventKind for a kind not in events.KINDS."""
        self.record_all((PendingEvent(kind, node_id, detail),))

    def record_all(self, pending: Iterable[PendingEvent]) -> None:
        pending = tuple(pending)
        rows = []
        for d in pending:
            if d.kind not in KINDS:
                raise UnknownEventKind(f"no event kind {d.kind!r}")
            detail = d.detail if len(d.detail) <= MAX_DETAIL else d.detail[: MAX_DETAIL - 1] + "…"
            rows.append(Event(at=utcnow(), kind=d.kind, node_id=d.node_id[:64], detail=detail))
        if not rows:
            return
        self._store.add_events(rows, MAX_EVENTS)
        for d in pending:
            log.info("event %s %s %s", d.kind, d.node_id, d.detail)

    # ------------------------------------------------------------ what happened

    def beat(self, node_id: str, report: Report, silent_s: float) -> None:
        """A heartbeat: events for what changed since the node's last report."""
        with self._lock:
            before = self._reports.get(node_id)
            pending = beat_events(
                node_id, before, report, self._liveness.get(node_id, ""), silent_s
            )
            self._reports[node_id] = report
            self._liveness[node_id] = liveness_after("live", pending)
        self.record_all(pending)

    def report_of(self, node_id: str) -> Report | None:
        """What the node last said it is doing (None: nothing since this start)."""
        with self._lock:
            return self._reports.get(node_id)

    def sweep_due(self, now: float) -> bool:
        """Whether silences should be looked at now (`now`: time.monotonic())."""
        with self._lock:
            if now - self._swept_at < SWEEP_EVERY_S:
                return False
            self._swept_at = now
            return True

    def reset_sweep(self) -> None:
        """Silences are looked at on the next chance (tests that move the clock)."""
        with self._lock:
            self._swept_at = -math.inf

    def sweep(self, states: Mapping[str, tuple[str, float]]) -> None:
        """Node id -> (node_state, seconds silent): events for new silences."""
        pending: list[PendingEvent] = []
        with self._lock:
            for node_id, (state, silent_s) in states.items():
                liveness = self._liveness.get(node_id, "")
                found = silence_events(node_id, liveness, state, silent_s)
                if found:
                    self._liveness[node_id] = liveness_after(liveness, found)
                    pending.extend(found)
        self.record_all(tuple(pending))

    def said_gone(self, node_id: str, detail: str) -> None:
        """A node found dead otherwise than by silence (a client's report, confirmed)."""
        self.record_all(self._liveness_event("reported_dead", node_id, detail))

    def _liveness_event(self, kind: str, node_id: str, detail: str) -> tuple[PendingEvent, ...]:
        pending = (PendingEvent(kind, node_id, detail),)
        with self._lock:
            liveness = self._liveness.get(node_id, "")
            after = liveness_after(liveness, pending)
            if after == liveness:
                return ()
            self._liveness[node_id] = after
        return pending

    def plan_now(
        self,
        plan: PlanView | None,
        error: str,
        names: Callable[[], Mapping[str, str]],
        model: str = "",
    ) -> None:
        """The plan as it stands after a re-plan: events when it changed. `model`: which
        hosted model's plan, where the coordinator serves several ("" for the default),
        named at the start of each event's line."""
        with self._lock:
            before = self._plans.get(model)
            if plan == before:
                return
            self._plans[model] = plan
        drafts = plan_events(before, plan, error, names())
        if model:
            drafts = tuple(replace(d, detail=bounded(f"{model}: {d.detail}")) for d in drafts)
        self.record_all(drafts)

    def forget(self, node_id: str) -> None:
        with self._lock:
            self._reports.pop(node_id, None)
            self._liveness.pop(node_id, None)

    # ------------------------------------------------------------ reading

    def events(self, after: int = 0, limit: int = 200) -> list[StoredEvent]:
        """The newest `limit` events with an id above `after`, oldest first."""
        rows = self._store.events(after, max(1, min(limit, MAX_READ)))
        return [StoredEvent(r.id, as_utc(r.at), r.kind, r.node_id, r.detail) for r in rows]
