"""The good guest: serve while the PC's owner does not need it, step aside when they do.

A thin loop around the coordinated worker (`serve_coordinated`): every few seconds it
samples the probes (GPU, battery, clock) and asks `guest_policy.next_state` whether to
serve. When the answer turns to "paused", it stops the serve loop the gentle way (no
new sessions, running ones finish, then the stage and its GPU memory are freed) and
tells the coordinator at once, so placement drops this node and new routes avoid it
while its last conversations finish. While paused it keeps saying so in a slow
heartbeat; when the answer turns back, it serves again by itself (the pieces are on
disk, so that costs a load, not a download).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import replace

from app.config import format_address
from app.identity import Identity, join_or_resume
from app.node_status import NodeStatus, ServeState, StatusReport
from app.serving.assigned_stage import listen_address
from app.serving.coordinated import CliReport, CoordinatedOptions, serve_coordinated
from app.serving.guest.policy import BY_REQUEST, GuestSettings, GuestState, next_state
from app.serving.guest.probes import Probes
from app.serving.serve import report_stopped, stop_event
from app.serving.worker import StageWorker
from coordinator.client.session import CoordinatorClient
from coordinator.contract import Heartbeat
from coordinator.errors import CoordinatorError

log = logging.getLogger(__name__)

__all__ = ["PAUSED_BEAT_S", "run_guest", "serve_as_guest"]

PAUSED_BEAT_S = 10.0
"""While paused: how often the coordinator hears "still here, still paused" (well under
its dead-node timeout, and rare enough to cost nothing)."""


async def _tell_paused(client: CoordinatorClient, address: str, reason: str) -> None:
    loop = asyncio.get_running_loop()
    try:
        beat = Heartbeat(address=address, paused=reason)
        await loop.run_in_executor(None, client.heartbeat, beat)
    except CoordinatorError as exc:  # said again at the next paused beat
        log.info("could not tell the coordinator this node is paused: %s", exc)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def serve_as_guest(
    options: CoordinatedOptions,
    settings: GuestSettings,
    stop: asyncio.Event,
    report: StatusReport = lambda _s: None,
    probes: Probes | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_stopped: Callable[[StageWorker], None] | None = None,
) -> None:
    """Serve as `serve_coordinated` does, pausing and resuming by `settings`, until `stop`.

    Stopping (the volunteer's pause, or Quit) also tells the coordinator at once."""
    loop = asyncio.get_running_loop()
    probes = probes or Probes.real()
    identity = await loop.run_in_executor(None, Identity.load, options.identity_dir)
    identity = identity.with_coordinator(options.coordinator)
    host, port = await listen_address(options, identity.coordinator)
    guest = _Guest(
        replace(options, listen=(host, port)),
        settings,
        stop,
        report,
        probes,
        clock,
        identity.client(),
        options.advertise or format_address((host, port)),
        NodeStatus(node_id=identity.node_id, coordinator=identity.coordinator),
        on_stopped,
    )
    try:
        await guest.run()
    finally:
        close = getattr(probes.gpu, "close", None)
        if callable(close):  # NVML stays open while the loop runs, not after
            close()


class _Guest:
    """The loop's state between samples (one instance per `serve_as_guest` call)."""

    def __init__(
        self,
        options: CoordinatedOptions,
        settings: GuestSettings,
        stop: asyncio.Event,
        report: StatusReport,
        probes: Probes,
        clock: Callable[[], float],
        client: CoordinatorClient,
        address: str,
        base: NodeStatus,
        on_stopped: Callable[[StageWorker], None] | None,
    ) -> None:
        self.options, self.settings, self.stop = options, settings, stop
        self.report, self.probes, self.clock = report, probes, clock
        self.client, self.address, self.base = client, address, base
        self.on_stopped = on_stopped
        self.state = GuestState()
        self.last_paused_beat = -PAUSED_BEAT_S
        self.said_paused = False

    async def sample(self) -> GuestState:
        seen = await asyncio.get_running_loop().run_in_executor(None, self.probes.observe)
        self.state = next_state(self.state, seen, self.settings, self.clock())
        return self.state

    async def tell_paused(self, reason: str) -> None:
        await _tell_paused(self.client, self.address, reason)
        self.last_paused_beat, self.said_paused = self.clock(), True

    async def run(self) -> None:
        while not self.stop.is_set():
            state = await self.sample()
            if not state.serving:
                self.report(replace(self.base, state=ServeState.PAUSED, paused_reason=state.reason))
                if self.clock() - self.last_paused_beat >= PAUSED_BEAT_S:
                    await self.tell_paused(state.reason)
                await _wait(self.stop, self.settings.sample_every_s)
                continue
            if not await self.serve_until_paused():
                break
        if not self.said_paused:  # stopped before a stage served: placement must not use it
            await self.tell_paused(BY_REQUEST)

    async def serve_until_paused(self) -> bool:
        """Serve until the policy says pause (True) or `stop` is set (False)."""
        log.info("serving (nothing on this PC needs it back)")
        self.said_paused = False
        loop = asyncio.get_running_loop()
        inner = asyncio.Event()
        why: list[str] = []
        told: list[asyncio.Task[None]] = []

        def relay(status: NodeStatus) -> None:
            if status.state is ServeState.PAUSING:
                reason = why[0] if why else BY_REQUEST
                if not told:  # the serve loop's last heartbeat is done: say it now
                    told.append(loop.create_task(self.tell_paused(reason)))
                status = replace(status, paused_reason="" if reason == BY_REQUEST else reason)
            self.report(status)

        serving = loop.create_task(serve_coordinated(self.options, inner, relay, self.on_stopped))
        stopped = loop.create_task(self.stop.wait())
        try:
            while not serving.done():
                await asyncio.wait({serving, stopped}, timeout=self.settings.sample_every_s)
                if serving.done():
                    break
                if self.stop.is_set():
                    inner.set()
                    break
                state = await self.sample()
                if not state.serving:
                    log.info("pausing: %s", state.reason)
                    why.append(state.reason)
                    inner.set()
                    break
            await serving  # the drain, and any error of the serve loop
        finally:
            stopped.cancel()
            if not serving.done():
                serving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await serving
            for t in told:
                with contextlib.suppress(Exception):
                    await t
        return bool(why) and not self.stop.is_set()


class _GuestCliReport(CliReport):
    """The headless worker's lines, plus one on stderr each time it pauses or resumes."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = ""

    def __call__(self, status: NodeStatus) -> None:
        if status.state is ServeState.PAUSED and status.paused_reason != self.paused:
            print(f"{status.node_id}: paused ({status.paused_reason})", file=sys.stderr, flush=True)
            self.paused = status.paused_reason
        elif status.state is ServeState.SERVING and self.paused:
            print(f"{status.node_id}: serving again", file=sys.stderr, flush=True)
            self.paused = ""
        super().__call__(status)


def run_guest(options: CoordinatedOptions, settings: GuestSettings) -> int:
    """`sangama worker --join CODE` / `--identity DIR`, as a good guest."""

    async def run() -> None:
        if options.join_code:
            # The same command restarts the node: the identity this code made is reused.
            identity, resumed = join_or_resume(options.join_code, options.identity_dir)
            said = "restarting" if resumed else "joined"
            print(f"{said} as {identity.node_id} ({identity.role})", file=sys.stderr, flush=True)
        await serve_as_guest(
            options, settings, stop_event(), _GuestCliReport(), on_stopped=report_stopped
        )

    asyncio.run(run())
    return 0
