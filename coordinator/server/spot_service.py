"""Spot checks on the coordinator: starting them from stages' heartbeats, carrying the
asks and answers (SpotBook), and acting on a verdict: a stage found faulty leaves the
plan at once (its sessions replay around it, as for a dead stage), its certificate is
not renewed, and the operator page shows why, until the operator clears it.

The faulty nodes and their evidence are stored as one setting (JSON), so a restarted
coordinator keeps them out.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from coordinator.contract import Heartbeat
from coordinator.errors import NotFound
from coordinator.server.models import ModelPlan
from coordinator.server.spot_book import CheckUnknown, Concluded, SpotBook
from coordinator.server.spot_policy import SpotSettings, Verdict
from coordinator.server.store import Store
from coordinator.server.timeline import Timeline
from coordinator.spot_checks import CheckAsk, CheckRecord

FAULTY_NODES = "faulty_nodes"
"""Setting: node id -> the evidence a spot check found against it (JSON)."""
MAX_FAULTY_CHARS = 256 * 1024
MAX_RECENT = 20
MAX_NODES_REMEMBERED = 4096
"""Nodes whose latest session lists are kept (the oldest heard of go first)."""
"""Decided checks the operator page lists."""

__all__ = ["CheckUnknown", "SpotChecks"]


class SpotChecks:
    """The swarm's spot checks: one owner of the book and the faulty list."""

    def __init__(
        self,
        settings: SpotSettings,
        store: Store,
        timeline: Timeline,
        replan: Callable[[], object],
        draw: Callable[[], float] | None = None,
    ) -> None:
        self.settings = settings
        self._store = store
        self._timeline = timeline
        self._replan = replan
        self._lock = threading.Lock()
        self._book = SpotBook(settings, draw)
        self._checkable: dict[str, bool] = {}
        self._steps_seen: dict[str, int] = {}
        self._offered: dict[str, tuple[tuple[str, int], ...]] = {}
        """Each node's latest sessions with their steps: what a check of its neighbour
        samples from (`_sample_from`)."""
        self.recent: list[dict[str, Any]] = []
        """The latest decided checks, newest first (the operator page)."""
        self.counts: dict[str, int] = {}
        """Decided checks by verdict since the coordinator started."""

    # ------------------------------------------------------------ faulty nodes

    def faulty(self) -> dict[str, dict[str, Any]]:
        stored = self._store.get_setting(FAULTY_NODES)
        try:
            found = json.loads(stored) if stored else {}
        except ValueError:
            found = {}
        return found if isinstance(found, dict) else {}

    def is_faulty(self, node_id: str) -> bool:
        return node_id in self.faulty()

    def clear(self, node_id: str) -> None:
        """The operator clears a node: placed and renewed again. NotFound if not faulty."""
        with self._lock:
            found = self.faulty()
            if found.pop(node_id, None) is None:
                raise NotFound(f"{node_id} is not marked faulty")
            self._store.set_setting(FAULTY_NODES, json.dumps(found))
        self._timeline.record("fault_cleared", node_id, "by the operator")
        self._replan()

    def _mark(self, node_id: str, evidence: dict[str, Any]) -> None:
        with self._lock:
            found = self.faulty()
            found[node_id] = evidence
            text = json.dumps(found)
            while len(text) > MAX_FAULTY_CHARS and len(found) > 1:
                del found[next(iter(found))]  # the oldest evidence goes first
                text = json.dumps(found)
            self._store.set_setting(FAULTY_NODES, text)
        detail = (
            f"spot check {evidence.get('check')}: {evidence.get('reason')} "
            f"(session {evidence.get('session')}, step {evidence.get('step_id', '?')}, "
            f"positions {evidence.get('positions', '?')}); out of routes until cleared"
        )
        self._timeline.record("faulty", node_id, detail[:500])
        self._replan()

    # ------------------------------------------------------------ heartbeats

    def beat(self, node_id: str, beat: Heartbeat, hosted: list[ModelPlan]) -> None:
        """A heartbeat: the sessions the node saw, and maybe the start of a check of it.

        The session a check asks for is sampled from what a neighbour of the checked
        stage saw pass through it (the stage before it, else the one after), not from
        the stage's own list: a stage that lied on a session cannot keep it out of the
        sample, and one that will not give the record of a session its neighbour saw is
        shown to the operator (WITHHELD)."""
        steps = beat.stats.get("steps") if isinstance(beat.stats, dict) else None
        steps = steps if isinstance(steps, int) and steps >= 0 else 0
        with self._lock:
            self._checkable[node_id] = beat.checkable
            self._offered[node_id] = beat.check_sessions
            if len(self._offered) > MAX_NODES_REMEMBERED:
                del self._offered[next(iter(self._offered))]
            seen = self._steps_seen.get(node_id, steps)
            self._steps_seen[node_id] = steps
            new = max(0, steps - seen)
            expired = self._book.expire(time.monotonic())
        for c in expired:
            self._decided(c)
        if self.settings.rate <= 0 or not beat.checkable:
            return
        where = self._place_of(node_id, hosted)
        if where is None:
            return
        upstream, holders, downstream = where
        with self._lock:
            offered, vouched = self._sample_from(node_id, upstream, downstream)
            self._book.maybe_start(
                node_id, offered, new, upstream, holders, time.monotonic(), vouched
            )

    def _sample_from(
        self, node_id: str, upstream: str | None, downstream: str | None
    ) -> tuple[tuple[tuple[str, int], ...], bool]:
        """The sessions to sample a check of `node_id` from, and whether a neighbour
        vouches for them: the nearest neighbour's list, else the stage's own."""
        for neighbour in (upstream, downstream):
            if neighbour is not None and self._offered.get(neighbour):
                return self._offered[neighbour], True
        return self._offered.get(node_id, ()), False

    def start(self, node_id: str, session: str, steps: int, hosted: list[ModelPlan]) -> int:
        """A check of `node_id`'s first `steps` steps of `session`, now (the operator's
        own, or a test's); its number."""
        where = self._place_of(node_id, hosted)
        if where is None:
            raise NotFound(f"{node_id} serves no stage of a chain")
        upstream, holders, _ = where
        with self._lock:
            return self._book.start(
                node_id, session, steps, upstream, holders, time.monotonic()
            ).number

    def asks_for(self, node_id: str) -> tuple[CheckAsk, ...]:
        with self._lock:
            return self._book.asks_for(node_id)

    def inputs(self, node_id: str, ask_id: str) -> CheckRecord:
        with self._lock:
            return self._book.inputs(node_id, ask_id)

    def answer(self, node_id: str, ask_id: str, doc: Any) -> None:
        with self._lock:
            concluded = self._book.answer(node_id, ask_id, doc)
        if concluded is not None:
            self._decided(concluded)

    def _place_of(
        self, node_id: str, hosted: list[ModelPlan]
    ) -> tuple[str | None, tuple[str, ...], str | None] | None:
        """The node's upstream stage, the checkable nodes serving its layers of the same
        model in other chains (not faulty), and its downstream stage; None when it
        serves no stage."""
        faulty = self.faulty()
        for h in hosted:
            for chain in h.placed():
                stage = chain.stage_of(node_id)
                if stage is None:
                    continue
                at = chain.node_ids.index(node_id)
                upstream = chain.stages[at - 1].node_id if at > 0 else None
                after = chain.stages[at + 1 :]
                downstream = after[0].node_id if after else None
                holders = tuple(
                    s.node_id
                    for other in h.placed()
                    for s in other.stages
                    if s.layers == stage.layers
                    and s.node_id != node_id
                    and self._checkable.get(s.node_id, False)
                    and s.node_id not in faulty
                )
                return upstream, holders, downstream
        return None

    def _decided(self, concluded: Concluded) -> None:
        """Act on a verdict: count it, list it, mark whom it blames."""
        evidence = concluded.evidence()
        verdict = concluded.finding.verdict
        with self._lock:
            self.counts[verdict.value] = self.counts.get(verdict.value, 0) + 1
            self.recent = [evidence, *self.recent][:MAX_RECENT]
        blamed = {
            Verdict.FAULTY: concluded.check.node,
            Verdict.CHECKER_FAULTY: concluded.check.checker,
        }.get(verdict)
        if blamed:
            self._mark(blamed, evidence)
        elif verdict is Verdict.WITHHELD:
            self._timeline.record(
                "check_withheld", concluded.check.node, concluded.finding.reason[:300]
            )
        elif verdict is Verdict.UNDECIDED:
            self._timeline.record(
                "check_undecided", concluded.check.node, concluded.finding.reason[:300]
            )
        elif verdict is Verdict.DISPUTED:
            upstream = concluded.check.upstream or "?"
            detail = f"{concluded.finding.reason} (upstream {upstream})"
            self._timeline.record("check_disputed", concluded.check.node, detail[:300])
