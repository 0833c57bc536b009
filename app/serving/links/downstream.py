"""The link from a worker to its next hop: connects lazily, re-establishes lost paths.

Every OPEN and STEP sent is recorded in a `net.resend_log.ResendLog`. When the path dies
(a NAT mapping expires, a route changes, a relay restarts) the link is dialled again
within `relink_timeout` (the dialer falls back from direct to ICE to the relay) and the
log is resent, so the next stage resumes the running sessions instead of losing them.
Only when no new path is found in time are the sessions failed, with a typed error.

While sessions wait for a path (`waiting`), `on_waiting` is told at once: the worker
then asks the coordinator early whether its next stage was replaced (app.serving.rules.beats).
When it was (`retarget`), a session that never reached the old next stage (its OPEN was
only recorded while the link was down, as a replay's OPEN arriving just after a kill)
goes on to the new one, since nothing of it is held anywhere downstream; the others fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from app.config import Hop
from app.links.redial import dial_until
from net import wire
from net.channel import Channel, NodeCredentials, connect_channel
from net.errors import NetError
from net.quic.links import QuicTuning
from net.resend_log import ResendLog

log = logging.getLogger(__name__)

Dialer = Callable[[str, tuple[str, int]], Awaitable[tuple[Channel, str]]]
"""(node id, address) -> an authenticated channel and its path kind (direct/punched/relayed)."""


class Downstream:
    def __init__(
        self,
        hop: Hop,
        creds: NodeCredentials,
        tuning: QuicTuning,
        on_frame: Callable[[Channel, wire.Frame], None],
        on_lost: Callable[[str], None],
        connect_timeout: float = 5.0,
        dialer: Dialer | None = None,
        relink_timeout: float = 20.0,
        on_waiting: Callable[[], None] = lambda: None,
    ) -> None:
        self.hop = hop
        self._creds = creds
        self._tuning = tuning
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._timeout = connect_timeout
        self._relink_timeout = relink_timeout
        self._channel: Channel | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._backlog: list[wire.Frame] = []
        """Frames other than OPEN/STEP sent while unconnected (those are in the resend log)."""
        self._resend_log = ResendLog()
        self._unsent: set[str] = set()
        """Sessions of the log none of whose frames went out on a link yet: no next stage
        holds anything of them, so a retarget carries them to the new one."""
        self._on_waiting = on_waiting
        self.lost_at: float | None = None
        """time.monotonic() when the link to this next hop died, until one is up again
        or the hop is replaced (None: linked, or never lost)."""
        self._pings: dict[int, asyncio.Future[float]] = {}
        self._dialer = dialer
        self._closing = False
        self.path = "direct"
        """How the link reaches the next hop: direct, punched or relayed."""
        self.relinks = 0
        """Paths replaced while sessions were running (each one resumed them)."""
        self.relinks_pending = False
        """Set when a path carrying sessions died; the next connection resumes them."""

    @property
    def connected(self) -> bool:
        return self._channel is not None and not self._channel.closed.done()

    @property
    def resend_log(self) -> ResendLog:
        return self._resend_log

    @property
    def waiting(self) -> bool:
        """Sessions wait for a link to the next stage (dialling it, or again)."""
        return not self.connected and len(self._resend_log) > 0

    def send(self, frame: wire.Frame) -> None:
        self._resend_log.record(frame)
        if self.connected and self._channel is not None:
            self._channel.send(frame)
            self._unsent.discard(getattr(frame, "session", ""))
            return
        if isinstance(frame, wire.Open):
            self._unsent.add(frame.session)
        elif isinstance(frame, wire.Close):
            self._unsent.discard(frame.session)
        if not isinstance(frame, wire.Open | wire.Step):
            self._backlog.append(frame)
        self._ensure_connecting()
        if self.waiting:
            self._on_waiting()

    def flush(self) -> None:
        """What was sent to the next stage leaves now (net.channel.Channel.flush)."""
        if self.connected and self._channel is not None:
            self._channel.flush()

    def end_session(self, session: str, reason: str) -> None:
        """Tell the next stage a session ended here (now, or once the link is back)."""
        dialling = self._connecting is not None and not self._connecting.done()
        if session in self._resend_log and (self.connected or dialling):
            self.send(wire.Close(session, wire.truncate_utf8(reason, 900)))
        else:
            self.forget(session)

    def forget(self, session: str) -> None:
        """A session ended here and the next stage learns it otherwise: do not resend it."""
        self._resend_log.forget(session)
        self._unsent.discard(session)

    def retarget(self, hop: Hop) -> tuple[str, ...]:
        """Send to another next stage from now on (the coordinator replaced the one
        there); return the sessions that ran through the old one: their state is on
        that stage, so they cannot go on here (the client replays them elsewhere).
        Sessions that never reached it go on to the new one (`carried`)."""
        if hop == self.hop:
            return ()
        self.hop = hop
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()  # done only on its next turn: dial anew at once
        self._connecting = None
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close("next stage replaced")
        self.lost_at = None
        moved = carried(self._resend_log.sessions, self._unsent)
        lost = tuple(name for name in self._resend_log.sessions if name not in moved)
        for name in lost:
            self._resend_log.forget(name)
        self._backlog.clear()
        self.relinks_pending = False
        if moved:
            log.info("%d session(s) not yet forwarded go to the new next stage", len(moved))
            self._ensure_connecting()
        return lost

    def _ensure_connecting(self) -> None:
        if self._closing or (self._connecting is not None and not self._connecting.done()):
            return
        self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _dial_once(self, time_left: float) -> tuple[Channel, str]:
        if self._dialer is not None:
            # A dialer falls back through ICE to the relay: give it all the time left.
            dialled = self._dialer(self.hop.node_id, self.hop.address)
            return await asyncio.wait_for(dialled, time_left)
        channel = await connect_channel(
            self.hop.address,
            self._creds,
            self.hop.node_id,
            self._tuning,
            timeout=min(self._timeout, time_left),
        )
        return channel, "direct"

    async def _connect(self) -> None:
        relinking = len(self._resend_log) > 0 and self.relinks_pending
        try:
            channel, path = await dial_until(
                self._dial_once,
                self._relink_timeout if relinking else self._timeout,
                f"next hop {self.hop.node_id}",
                stop_when_unreachable=self._dialer is None,
            )
        except (NetError, OSError, TimeoutError) as exc:
            self._give_up(exc)
            return
        channel.on_frame = self._frame
        channel.on_close = lambda _ch, reason: self._lost(channel, reason)
        self._channel, self.path = channel, path
        self.lost_at = None
        if relinking:
            self.relinks += 1
            log.warning(
                "link to %s re-established (%s); resuming %d session(s)",
                self.hop.node_id,
                path,
                len(self._resend_log),
            )
        self.relinks_pending = False
        # Resend first: a CLOSE in the backlog belongs to a session no longer in the log.
        backlog, self._backlog = self._backlog, []
        for frame in [*self._resend_log.to_resend(), *backlog]:
            channel.send(frame)
        self._unsent.clear()

    def _give_up(self, error: Exception) -> None:
        self._backlog.clear()
        sessions = self._resend_log.sessions
        for name in sessions:
            self._resend_log.forget(name)
        self._unsent.clear()
        self.relinks_pending = False
        log.warning(
            "next hop %s unreachable (%d session(s)): %s", self.hop.node_id, len(sessions), error
        )
        if not self._closing:
            self._on_lost(f"next stage {self.hop.node_id} unreachable: {error}")

    def _frame(self, channel: Channel, frame: wire.Frame) -> None:
        if isinstance(frame, wire.Pong):
            waiter = self._pings.pop(frame.nonce, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(time.perf_counter())
            return
        self._on_frame(channel, frame)

    async def measure_rtt(self, timeout: float = 2.0) -> float | None:
        """Round trip to the next hop in ms (PING/PONG through the whole stack), if connected."""
        if not self.connected or self._channel is None:
            return None
        nonce = secrets.randbits(63)
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pings[nonce] = waiter
        sent = time.perf_counter()
        self._channel.send(wire.Ping(nonce))
        try:
            return (await asyncio.wait_for(waiter, timeout) - sent) * 1e3
        except (TimeoutError, ConnectionError):
            return None
        finally:
            self._pings.pop(nonce, None)

    def update_credentials(self, creds: NodeCredentials) -> None:
        self._creds = creds  # used from the next connection on

    def _lost(self, channel: Channel, reason: str) -> None:
        if self._channel is not channel or self._closing:
            return
        self._channel = None
        self.lost_at = time.monotonic()
        # A PING in flight will get no PONG: its waiter (the heartbeat's RTT) ends now,
        # or the early heartbeat this loss asks for would wait out the PING's timeout.
        for waiter in self._pings.values():
            if not waiter.done():
                waiter.set_exception(ConnectionResetError(reason))
        self._on_waiting()  # the next stage may be gone: the worker asks the coordinator
        if not len(self._resend_log):
            return  # nothing running: the next frame dials again
        log.warning(
            "link to %s lost (%s); re-establishing for %d session(s)",
            self.hop.node_id,
            reason,
            len(self._resend_log),
        )
        self.relinks_pending = True
        self._ensure_connecting()

    async def close(self) -> None:
        self._closing = True
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
        if self._channel is not None:
            channel, self._channel = self._channel, None
            channel.close("worker shutting down")


def carried(sessions: tuple[str, ...], unsent: set[str]) -> tuple[str, ...]:
    """Of the sessions a link to a replaced next stage held, those that go on to the new
    one: none of their frames went out on a link, so no stage downstream holds any part
    of them (pure). The others' state was (or may have been) on the old stage."""
    return tuple(name for name in sessions if name in unsent)
