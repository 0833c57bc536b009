"""A coordinated worker's heartbeats (the IO beside app.serving.plan's decisions): while
a stage downloads and loads (`BeatsMeanwhile`), and while it serves (`ServingBeats`: the
stage's figures to the coordinator and to the status, revocations back, the node
certificate renewed when due). The answers go to `plan`; nothing here decides what the
worker does next.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from dataclasses import replace

from app.config import format_address
from app.identity import Identity
from app.node_status import NodeStatus, StatusReport, swarm_answer
from app.serving.plan import HEARTBEAT_S
from app.serving.rules.beats import BeatPolicy, beat_delay
from app.serving.spot_answers import answer_asks
from app.serving.worker import StageWorker
from coordinator.client.session import CoordinatorClient
from coordinator.contract import Heartbeat, HeartbeatAnswer
from coordinator.errors import CoordinatorError
from coordinator.releases import update_notice
from core.hardware import MemoryUse, memory_in_use
from net.wire.versions import this_release

log = logging.getLogger(__name__)

BEATS = BeatPolicy(every_s=HEARTBEAT_S)
MEMORY_EVERY_S = 30.0
"""How often a serving stage re-reads its memory for the heartbeat and the status window:
each read opens and closes NVML, which costs far more than the heartbeat itself on a PC
with an NVIDIA driver, and a loaded stage's memory hardly moves."""
FIRST_PROGRESS_BEAT_S = 0.5
"""The first heartbeat of a download comes this soon: its size is known by then, and the
operator's timeline shows a short download too."""
RENEW_WHEN_LEFT = dt.timedelta(hours=8)


def send_beat(client: CoordinatorClient, report: Heartbeat) -> HeartbeatAnswer:
    """One heartbeat (blocking: run it in an executor)."""
    return client.heartbeat(report)


async def renew_if_due(
    identity: Identity, client: CoordinatorClient, worker: StageWorker
) -> Identity:
    """Renew the node certificate by itself when a third of its life is left."""
    left = identity.certified.certificate.not_valid_after_utc - dt.datetime.now(dt.UTC)
    if left > RENEW_WHEN_LEFT:
        return identity
    loop = asyncio.get_running_loop()
    try:
        pem = await loop.run_in_executor(None, client.renew, identity.certified.private_key)
    except CoordinatorError as exc:
        log.warning("certificate renewal failed (will retry): %s", exc)
        return identity
    renewed = identity.save_certificate(pem)
    worker.update_credentials(renewed.credentials())
    log.info(
        "renewed the node certificate, valid until %s",
        renewed.certified.certificate.not_valid_after_utc,
    )
    return renewed


class BeatsMeanwhile:
    """Heartbeats while a stage is downloaded and loaded (an async context): the
    coordinator's timeline and page show the progress, and a long download does not
    look like a dead node. `now` is the heartbeat to send next; the answers are not
    read (the assignment is read again once the stage serves)."""

    def __init__(self, client: CoordinatorClient, now: Heartbeat) -> None:
        self.client, self.now = client, now
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BeatsMeanwhile:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(FIRST_PROGRESS_BEAT_S)
        while True:
            try:
                await loop.run_in_executor(None, send_beat, self.client, self.now)
            except CoordinatorError as exc:  # said again at the next beat
                log.info("heartbeat failed: %s", exc)
            await asyncio.sleep(HEARTBEAT_S)


class ServingBeats:
    """The heartbeats of a serving stage, one per `next()`: each reports the stage's
    figures (to the coordinator and as `serving`, the status) and returns the answer for
    `plan`. `identity` is renewed here when due."""

    def __init__(
        self,
        identity: Identity,
        client: CoordinatorClient,
        worker: StageWorker,
        stage_beat: Heartbeat,
        report: StatusReport,
        serving: NodeStatus,
        memory: MemoryUse,
    ) -> None:
        self.identity = identity
        self.serving = serving
        """The latest status reported."""
        self._client = client
        self._worker = worker
        self._stage_beat = stage_beat
        self._report = report
        self._hop_text = serving.next_hop
        self._last_tokens, self._last_rows, self._last_t = 0, 0, time.monotonic()
        self._memory, self._memory_at = memory, time.monotonic()
        self._checking: set[asyncio.Task[None]] = set()
        """Spot checks being answered (app.serving.spot_answers)."""

    @classmethod
    async def start(
        cls,
        identity: Identity,
        client: CoordinatorClient,
        worker: StageWorker,
        stage_beat: Heartbeat,
        report: StatusReport,
        serving: NodeStatus,
    ) -> ServingBeats:
        memory = await asyncio.get_running_loop().run_in_executor(None, memory_in_use)
        return cls(identity, client, worker, stage_beat, report, serving, memory)

    def retargeted(self, hop_node: str, hop_address: tuple[str, int]) -> None:
        """The stage forwards to a new next hop: shown from the next report on."""
        self._hop_text = f"{hop_node} at {format_address(hop_address)}"
        log.info("next stage is now %s", self._hop_text)

    async def next(self, stop: asyncio.Event) -> HeartbeatAnswer | None:
        """Wait until the next heartbeat is due and send it; None when `stop` was set
        meanwhile or the coordinator did not answer (the stage serves on)."""
        worker, loop = self._worker, asyncio.get_running_loop()
        if await until_next_beat(stop, worker, self._last_t):
            return None
        stats = worker.stats
        self.identity = await renew_if_due(self.identity, self._client, worker)
        rtt = await worker.next_hop_rtt()
        rtt_ms = next(iter(rtt.values()), None)
        rtt = {**await worker.ring_rtt(), **rtt}  # the ring's links back to first stages too
        if time.monotonic() - self._memory_at >= MEMORY_EVERY_S:
            self._memory = await loop.run_in_executor(None, memory_in_use)
            self._memory_at = time.monotonic()
        memory, now = self._memory, time.monotonic()
        capacity = worker.capacity
        beat_report = replace(
            self._stage_beat,
            sessions=capacity.sessions,
            max_sessions=capacity.max_sessions,
            kv_budget_bytes=capacity.budget_bytes,
            kv_reserved_bytes=capacity.reserved_bytes,
            rtt_ms=rtt,
            step_ms=worker.step_times(),
            row_budget=worker.row_budget,
            checkable=worker.checkable,
            check_sessions=worker.check_sessions(),
            path=worker.next_hop_path,
            tokens=stats.tokens - self._last_tokens,  # the coordinator sums these per period
            compute_ms=stats.last_compute_ms,
            stats={
                "compute_ms": stats.last_compute_ms,
                "steps": stats.steps,
                "sessions": stats.sessions_opened,
                "errors": stats.errors,
                "rtt_ms": rtt_ms,
                "relinks": worker.next_hop_relinks,
                "queue_ms": stats.last_queue_ms,
                "memory_bytes": memory.bytes,
                "memory_kind": memory.kind,
                "resumed": stats.sessions_resumed,
                "rows": stats.rows,
                "rows_reused": stats.rows_reused,
                "rows_one_by_one": stats.rows_one_by_one,
                "rows_refused": stats.rows_refused,
                "hidden_bytes_sent": stats.hidden_bytes_sent,
                "rows_recomputed": stats.rows_recomputed,
                "check_bytes": stats.check_bytes,
                "adopted": stats.sessions_adopted,
            },
        )
        hop_text = self._hop_text
        self.serving = replace(
            self.serving,
            sessions=stats.sessions_opened,
            running=worker.session_count,
            steps=stats.steps,
            errors=stats.errors,
            throughput=(stats.rows - self._last_rows) / max(now - self._last_t, 1e-6),
            compute_ms=stats.last_compute_ms,
            queue_ms=stats.last_queue_ms,
            memory=memory.describe(),
            rtt_ms=rtt_ms,
            next_hop=f"{hop_text} ({worker.next_hop_path})" if hop_text else "",
        )
        self._report(self.serving)
        self._last_tokens, self._last_rows, self._last_t = stats.tokens, stats.rows, now
        try:
            beat = await loop.run_in_executor(None, send_beat, self._client, beat_report)
        except CoordinatorError as exc:
            log.warning("heartbeat failed: %s", exc)
            return None
        worker.set_revoked(frozenset(int(s) for s in beat.revoked_serials))
        if beat.check_asks:  # answered beside the serving, not before the next beat
            task = loop.create_task(answer_asks(self._client, worker, beat.check_asks))
            self._checking.add(task)
            task.add_done_callback(self._checking.discard)
        # Shown from the next report on (the tray's status window, `sangama status`).
        self.serving = replace(
            self.serving,
            swarm=swarm_answer(beat.can_answer, beat.answer_since, beat.answer_reason),
            update=update_notice(this_release(), beat.latest_release, beat.min_release),
        )
        return beat


async def until_next_beat(stop: asyncio.Event, worker: StageWorker, last_beat: float) -> bool:
    """Wait until the next heartbeat is due (app.serving.rules.beats: sooner while sessions
    wait for the next stage); True when `stop` was set meanwhile."""
    while not stop.is_set():
        worker.hop_wanted.clear()  # before reading the state: a later change wakes us
        now, lost_at = time.monotonic(), worker.next_hop_lost_at
        lost_for = None if lost_at is None else now - lost_at
        delay = beat_delay(BEATS, now - last_beat, worker.next_hop_waiting, lost_for)
        if delay <= 0:
            return False
        waits = {asyncio.ensure_future(e.wait()) for e in (stop, worker.hop_wanted)}
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
    return True
