"""The link from a worker to its next hop: connects lazily, buffers while connecting.

Frames sent while the link is being (re)established wait in order, so an OPEN always
reaches the next stage before the STEPs of its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from app.config import Hop
from net import wire
from net.channel import Channel, NodeCredentials, connect_channel
from net.errors import NetError
from net.quic import QuicTuning

log = logging.getLogger(__name__)


class Downstream:
    def __init__(
        self,
        hop: Hop,
        creds: NodeCredentials,
        tuning: QuicTuning,
        on_frame: Callable[[Channel, wire.Frame], None],
        on_lost: Callable[[str], None],
        connect_timeout: float = 5.0,
        dialer: Callable[[str, tuple[str, int]], Awaitable[tuple[Channel, str]]] | None = None,
    ) -> None:
        self.hop = hop
        self._creds = creds
        self._tuning = tuning
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._timeout = connect_timeout
        self._channel: Channel | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._backlog: list[wire.Frame] = []
        self._pings: dict[int, asyncio.Future[float]] = {}
        self._dialer = dialer
        self.path = "direct"
        """How the link reaches the next hop: direct, punched or relayed."""

    @property
    def connected(self) -> bool:
        return self._channel is not None and not self._channel.closed.done()

    def send(self, frame: wire.Frame) -> None:
        if self._channel is not None and not self._channel.closed.done() and not self._backlog:
            self._channel.send(frame)
            return
        self._backlog.append(frame)
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            if self._dialer is not None:
                channel, self.path = await self._dialer(self.hop.node_id, self.hop.address)
            else:
                channel = await connect_channel(
                    self.hop.address,
                    self._creds,
                    self.hop.node_id,
                    self._tuning,
                    timeout=self._timeout,
                )
        except (NetError, OSError) as exc:
            self._backlog.clear()
            log.warning("next hop %s unreachable: %s", self.hop.node_id, exc)
            self._on_lost(f"next stage {self.hop.node_id} unreachable: {exc}")
            return
        channel.on_frame = self._frame
        channel.on_close = lambda _ch, reason: self._lost(channel, reason)
        self._channel = channel
        backlog, self._backlog = self._backlog, []
        for frame in backlog:
            channel.send(frame)

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
        except TimeoutError:
            return None
        finally:
            self._pings.pop(nonce, None)

    def update_credentials(self, creds: NodeCredentials) -> None:
        self._creds = creds  # used from the next connection on

    def _lost(self, channel: Channel, reason: str) -> None:
        if self._channel is channel:
            self._channel = None
            self._on_lost(f"next stage {self.hop.node_id} lost: {reason}")

    async def close(self) -> None:
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
        if self._channel is not None:
            channel, self._channel = self._channel, None
            channel.close("worker shutting down")
