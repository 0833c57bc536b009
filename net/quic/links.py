"""QUIC links carrying one byte stream each (with net.quic.backend, the only modules that
import a QUIC library).

A link is one QUIC connection whose datagrams go through a `DatagramPath`: a plain UDP
socket today, an ICE connection later, so nothing above this module changes when NAT
traversal arrives. aioquic's `QuicConnection` is sans-IO; this module is its thin
asyncio driver: datagrams in, timer, datagrams out.

TLS authenticates the server (its certificate must chain to the swarm CA and name the
expected node id). Clients prove themselves at the application layer (net.protocol),
because stock aioquic servers neither request nor verify client certificates.

Cheap wins taken (docs/architecture.md, "Links"; figures in bench/README.md): qh3 (a Rust
packet core) is the default library; transmissions are coalesced to once per event-loop
turn, both for frames sent and for datagrams received (a burst read in one wake-up,
net.quic.udp, is answered by one transmit after the whole burst, not an ACK per datagram);
the loss/ACK timer is re-armed only when it must fire earlier; the packet pacer is bypassed
for the small bursts a token's hidden state makes; on plain UDP paths (Linux) qh3 links
discover the path MTU (net.quic.path_mtu: padded probes from 1200 up, adopted once
acknowledged), so a hidden state takes one or two datagrams instead of three.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from net.errors import NetError
from net.peer_limits import DEFAULT_LINK_LIMITS, LinkLimits, admit_link
from net.quic.ack_policy import hold_ack_until
from net.quic.backend import (
    ALPN,
    DEFAULT_LIBRARY,
    QUIC_LIBRARIES,
    QuicTuning,
    TlsIdentity,
)
from net.quic.backend import backend as quic_backend
from net.quic.counts import LinkCounts
from net.quic.path_mtu import may_probe
from net.quic.timer import keep_armed
from net.quic.udp import Receiver, UdpPath

# Re-exported: callers import paths, the tuning and the identity from here.
__all__ = [
    "ALPN",
    "DEFAULT_LIBRARY",
    "QUIC_LIBRARIES",
    "Addr",
    "QuicTuning",
    "Receiver",
    "TlsIdentity",
    "UdpPath",
]

log = logging.getLogger(__name__)

Addr = tuple[str, int]
STREAM_ID = 0  # the client's first bidirectional stream carries everything
ACK_SOON = 0.002
"""A pending ACK due this soon (seconds) leaves with the transmit at hand, not by timer."""


class LinkError(NetError):
    """A QUIC link could not be established or was lost."""


class PeerUnreachable(LinkError):
    """The peer's host answered that nothing listens there (ICMP port unreachable): the
    process is gone, so redialling the same address is pointless."""


# ---------------------------------------------------------------- datagram paths


class DatagramPath(Protocol):
    """Where a link's datagrams go: UDP now, ICE later."""

    def send(self, data: bytes, addr: Addr) -> None: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------- a link


class QuicLink:
    """One QUIC connection; bytes in order in both directions on one stream."""

    def __init__(self, quic: Any, path: DatagramPath, peer: Addr, tuning: QuicTuning) -> None:
        self._quic = quic
        self._backend = quic_backend(tuning.library)
        self._events = self._backend.events
        self._path = path
        self.peer_address = peer
        self._tuning = tuning
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._timer_held = False
        """`_timer` is a held ACK's: cancelled once that ACK has left (it would fire for
        nothing, a wake-up a frame)."""
        self._clock_floor = 0.0
        """When `_timer` fires (wall clock, as the QUIC library's deadlines)."""
        self._keepalive: asyncio.TimerHandle | None = None
        self._transmit_scheduled = False
        self._transmit_handle: asyncio.Handle | None = None
        self._deferred: asyncio.TimerHandle | None = None
        self._received = False
        """Datagrams arrived that `flush_received` has not acted on yet."""
        self._inbox: list[bytes] = []
        self._inbox_addr: Addr | None = None
        """A burst's datagrams not yet given to the library (`receives_bursts`), and
        where they came from."""
        self._data_at: float | None = None
        self._data_gap: float | None = None
        """When the last data burst arrived, and the time since the one before it."""
        self._ack_held = False
        """An ACK is being held for the next frame (net.quic.ack_policy); the timer is set
        for when it must leave at the latest."""
        self.burst_aware = False
        """True when the path calls `flush_received` at the end of every burst."""
        self._last_activity = time.monotonic()
        self.connected: asyncio.Future[None] = self._loop.create_future()
        self.closed: asyncio.Future[str] = self._loop.create_future()
        self.on_data: Callable[[bytes], None] = lambda _data: None
        self.on_close: Callable[[str], None] = lambda _reason: None
        self.owns_path = False
        self.bytes_sent = 0
        self.bytes_received = 0
        self.counts = LinkCounts()
        self._stream_queued = False
        """Stream data was queued since the last transmit (else what leaves is control)."""

    # -- identity
    @property
    def is_client(self) -> bool:
        return bool(self._quic._is_client)

    def peer_certificate_sha256(self) -> bytes | None:
        """The server certificate TLS verified (client side), for the client's proof."""
        der = self._backend.peer_certificate_der(self._quic)
        return None if der is None else hashlib.sha256(der).digest()

    # -- input
    def datagram_received(self, data: bytes, addr: Addr) -> None:
        self.counts.datagrams_received += 1
        if self.burst_aware and self._backend.receives_bursts:
            # Kept until the burst ends: `flush_received` hands them over in one call.
            if self._inbox and addr != self._inbox_addr:
                self._receive_inbox()
            self._inbox.append(data)
            self._inbox_addr = addr
            self._received = True
            return
        self._last_activity = time.monotonic()
        self.counts.bursts_received += 1
        try:
            self._quic.receive_datagram(data, addr, now=self._now())
        except Exception as exc:  # a bug or hostile input in one link must not hang it
            self._internal_error(exc)
            return
        if not self._received:
            self._received = True
            if not self.burst_aware:
                self._loop.call_soon(self.flush_received)

    def flush_received(self) -> None:
        """Act on the datagrams received since the last call: deliver the stream's bytes
        (one `on_data` for a whole burst), then transmit once (ACKs, and frames the
        handlers sent) at the end of this loop turn. The path calls this at the end of a
        burst (`burst_aware`); otherwise it runs on the next loop turn."""
        if not self._received:
            return
        self._received = False
        if self._inbox and not self._receive_inbox():
            return
        delivered = self.bytes_received
        try:
            self._process_events()
        except Exception as exc:  # a handler's bug must not hang the link
            self._internal_error(exc)
            return
        if self.bytes_received != delivered:
            now = time.monotonic()
            if self._data_at is not None:
                self._data_gap = now - self._data_at
            self._data_at = now
        elif not self._transmit_scheduled:
            # Nothing for the handlers (an ACK, a PING): nothing is forwarded ahead of
            # this link's answer, so it leaves now rather than a loop turn later.
            if not self.closed.done():
                self._transmit()
            return
        self._schedule_transmit()

    def _receive_inbox(self) -> bool:
        """Give the burst held so far to the library in one call; False if it failed."""
        batch, addr = self._inbox, self._inbox_addr
        self._inbox = []
        assert addr is not None
        self._last_activity = time.monotonic()
        self.counts.bursts_received += 1
        try:
            self._quic.receive_many_datagrams(batch, addr, now=self._now())
        except Exception as exc:  # a bug or hostile input in one link must not hang it
            self._internal_error(exc)
            return False
        return True

    def _internal_error(self, exc: Exception) -> None:
        log.exception("link to %s failed", self.peer_address)
        self._quic.close(error_code=0x1, reason_phrase="internal error")
        self._transmit()
        self._terminate(f"internal error: {exc}")

    def path_error(self, exc: Exception) -> None:
        self._terminate(f"peer unreachable ({exc})", PeerUnreachable)

    def _on_timer(self) -> None:
        self._timer = None
        self._ack_held = False
        self.counts.timer_fires += 1
        self._quic.handle_timer(now=self._now())
        self._process_events()
        self._transmit()

    def _process_events(self) -> None:
        chunks: list[bytes] = []
        while (ev := self._quic.next_event()) is not None:
            if isinstance(ev, self._events.StreamDataReceived):
                if ev.data:
                    chunks.append(ev.data)
            elif isinstance(ev, self._events.HandshakeCompleted):
                if not self.connected.done():
                    self.connected.set_result(None)
                self._arm_keepalive()
            elif isinstance(ev, self._events.ConnectionTerminated):
                self._deliver(chunks)  # what arrived before the close is still the peer's
                chunks = []
                reason = ev.reason_phrase or f"QUIC error {ev.error_code:#x}"
                self._terminate(reason)
        self._deliver(chunks)

    def _deliver(self, chunks: list[bytes]) -> None:
        if chunks and not self.closed.done():
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            self.bytes_received += len(data)
            self.on_data(data)

    # -- output
    def send(self, data: bytes) -> None:
        if self.closed.done():
            raise LinkError(f"link to {self.peer_address} is closed: {self.closed.result()}")
        self._quic.send_stream_data(STREAM_ID, data)
        self.bytes_sent += len(data)
        self._stream_queued = True
        self._schedule_transmit()

    def flush(self) -> None:
        """Transmit what was sent during this loop turn now, not at its end: a stage's
        output then leaves ahead of the ACKs its other links queued earlier in the turn
        (each ACK is a send and a wake-up of its peer, on the critical path when it goes
        first). A transmit held by the upload throttle stays held."""
        if self._transmit_handle is not None and self._deferred is None:
            self._transmit_handle.cancel()
            self._transmit()

    def _schedule_transmit(self) -> None:
        if not self._transmit_scheduled:
            # Coalesce: everything sent during this loop turn leaves in one transmit.
            self._transmit_scheduled = True
            self._transmit_handle = self._loop.call_soon(self._transmit)

    def _transmit(self, force: bool = False) -> None:
        self._transmit_scheduled = False
        self._transmit_handle = None
        throttle = self._tuning.send_throttle
        if throttle is not None and not force:
            if self._deferred is not None:
                self._transmit_scheduled = True  # the deferred transmit takes this too
                return
            wait = throttle.delay()
            if wait > 0:  # over the upload cap: everything queued leaves in one go later
                self._transmit_scheduled = True
                self._deferred = self._loop.call_later(wait, self._deferred_transmit)
                return
        now = self._now()
        due = self._backend.ack_due(self._quic)
        pending = due is not None and due - now <= ACK_SOON
        # Frames coming close together: this ACK waits for the next frame (and then
        # leaves acknowledging both); the timer below is its latest moment.
        hold_until = (
            hold_ack_until(now, self._data_gap, self._ack_held, self._tuning.ack_hold)
            if pending
            else now
        )
        self._ack_held = hold_until > now
        if pending and not self._ack_held:
            assert due is not None
            # The ACK of a one-packet frame is due within a millisecond or two: send it in
            # this transmit (the one that ends the burst) rather than from a timer of its
            # own, a wake-up and a lone datagram later. The library's clock is moved to
            # just past the deadline (it fires only once a deadline has passed), and
            # `_now` never lets it run back.
            now = self._clock_floor = max(now, due + 1e-4)
            self._quic.handle_timer(now=now)
        sent = 0
        counts = self.counts
        counts.transmits += 1
        datagrams = self._backend.datagrams_to_send(self._quic, now)
        for data, addr in datagrams:
            self._path.send(data, addr)
            sent += len(data)
        counts.datagrams_sent += len(datagrams)
        if not self._stream_queued:
            counts.control_datagrams_sent += len(datagrams)
        self._stream_queued = False
        if throttle is not None:
            throttle.sent(sent)
        if not self.closed.done():
            self._reschedule_timer(now, hold_until if hold_until > now else None)

    def _now(self) -> float:
        """The QUIC library's clock: wall time, never before a time it was already given."""
        return max(time.time(), self._clock_floor)

    def _deferred_transmit(self) -> None:
        self._deferred = None
        self._transmit()

    def _reschedule_timer(self, now: float, held_until: float | None = None) -> None:
        deadline = self._quic.get_timer()
        if held_until is not None and deadline is not None:
            deadline = max(deadline, held_until)  # the held ACK's timer, pushed back
        if self._timer is not None:
            if keep_armed(now, self._timer_at, deadline, self._timer_held):
                return  # net.quic.timer: early by little, or far away; it fires and re-arms
            self._timer.cancel()
            self._timer = None
        self._timer_held = held_until is not None
        if deadline is not None:
            self._timer_at = deadline
            self.counts.timers_armed += 1
            self._timer = self._loop.call_later(max(0.0, deadline - now), self._on_timer)

    def _arm_keepalive(self) -> None:
        if self._tuning.keepalive <= 0 or self.closed.done():
            return
        self._keepalive = self._loop.call_later(self._tuning.keepalive, self._keepalive_tick)

    def _keepalive_tick(self) -> None:
        if self.closed.done():
            return
        if time.monotonic() - self._last_activity >= self._tuning.keepalive:
            try:
                self._quic.send_ping(0)
            except Exception as exc:  # qh3: its connection closed before we saw the event
                self._terminate(f"connection closed: {exc}")
                return
            self._transmit()
        self._arm_keepalive()

    # -- closing
    def close(self, reason: str = "closed", error_code: int = 0) -> None:
        if self.closed.done():
            return
        # Flush first: once a close is pending aioquic sends only the CONNECTION_CLOSE, so
        # frames sent in this loop turn (a refusal's ERROR, a last CLOSE) would be lost.
        # Forced past the upload cap: a close must leave now, not after the link is gone.
        self._transmit(force=True)
        self._quic.close(error_code=error_code, reason_phrase=reason)
        self._transmit(force=True)
        self._terminate(reason)

    def _terminate(self, reason: str, error: type[LinkError] = LinkError) -> None:
        if self.closed.done():
            return
        for handle in (self._timer, self._keepalive, self._deferred):
            if handle is not None:
                handle.cancel()
        self.closed.set_result(reason)
        if not self.connected.done():
            self.connected.set_exception(error(reason))
            self.connected.exception()  # mark retrieved; callers see it via wait_connected
        if self.owns_path:
            self._path.close()
        self.on_close(reason)

    async def wait_connected(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self.connected), timeout)
        except TimeoutError:
            self.close("handshake timed out")
            raise LinkError(
                f"QUIC handshake with {self.peer_address} timed out after {timeout:.0f} s"
            ) from None
        except LinkError:
            raise
        except Exception as exc:  # TLS alerts surface here
            raise LinkError(str(exc)) from exc


# ---------------------------------------------------------------- client and server


async def connect(
    address: Addr,
    identity: TlsIdentity,
    expected_node_id: str,
    tuning: QuicTuning = QuicTuning(),
    timeout: float = 10.0,
    path_factory: Callable[[Receiver, Callable[[Exception], None]], Any] | None = None,
) -> QuicLink:
    """Open a link to `address`; TLS checks the server is `expected_node_id` in our swarm."""
    backend = quic_backend(tuning.library)
    holder: list[QuicLink] = []

    def receive(data: bytes, addr: Addr) -> None:
        if holder:
            holder[0].datagram_received(data, addr)

    def error(exc: Exception) -> None:
        if holder:
            holder[0].path_error(exc)

    if path_factory is not None:
        path = await path_factory(receive, error)
    else:
        path = await UdpPath.connect(address, receive, error)
    # Only a plain socket with Don't Fragment set may probe (an ICE or TURN path's sockets
    # are aioice's: a fragmented probe would pass for a larger MTU), and only to a peer
    # whose path MTU cannot shrink under the link (net.quic.path_mtu: no black-hole fallback).
    probe = isinstance(path, UdpPath) and path.dont_fragment and may_probe(path.remote_host)
    config = backend.configuration(identity, True, tuning, expected_node_id, probe=probe)
    quic = backend.new_connection(config, tuning)
    link = QuicLink(quic, path, address, tuning)
    link.owns_path = True
    if isinstance(path, UdpPath) and path.reads_bursts:
        path.on_burst_end = link.flush_received
        link.burst_aware = True
    holder.append(link)
    quic.connect(address, now=time.time())
    link._transmit()
    await link.wait_connected(timeout)
    return link


class QuicServer:
    """Accepts links on one UDP socket; each new peer address gets its own connection.

    A link is *pending* until the layer above vouches for its peer (`trusted`): new
    links are accepted only within `limits` (net.peer_limits.admit_link), counted per
    source host and in all, so one host cannot hold every slot or pin memory unbounded.
    """

    def __init__(
        self,
        identity: TlsIdentity,
        on_link: Callable[[QuicLink], None],
        tuning: QuicTuning = QuicTuning(),
        limits: LinkLimits = DEFAULT_LINK_LIMITS,
    ) -> None:
        self._identity = identity
        self._backend = quic_backend(tuning.library)
        self._config = self._backend.configuration(identity, False, tuning, None)
        self._tuning = tuning
        self._on_link = on_link
        self._links: dict[Addr, QuicLink] = {}
        self._path: UdpPath | None = None
        self._path_links: set[QuicLink] = set()
        """Links accepted over paths of their own (`accept`), not the listening socket."""
        self._touched: list[QuicLink] = []
        """Links of the listening socket that received datagrams in the current burst."""
        self._limits = limits
        self._pending: set[QuicLink] = set()
        """Links of the listening socket whose peer is not authenticated yet."""
        self.refused_links = 0
        """New links dropped by `limits` since the server started."""

    def update_identity(self, identity: TlsIdentity) -> None:
        """Use a renewed certificate for new connections; open ones keep theirs."""
        self._identity = identity
        self._config = self._backend.configuration(identity, False, self._tuning, None)

    async def listen(self, host: str, port: int) -> Addr:
        self._path = await UdpPath.bind(host, port, self._datagram_received)
        if self._path.reads_bursts:
            self._path.on_burst_end = self._burst_end
        return self._path.local_address

    def _burst_end(self) -> None:
        touched, self._touched = self._touched, []
        for link in touched:
            link.flush_received()

    @property
    def links(self) -> list[QuicLink]:
        return [*self._links.values(), *self._path_links]

    @property
    def pending(self) -> int:
        """Links of the listening socket not authenticated yet."""
        return len(self._pending)

    def trusted(self, link: QuicLink) -> None:
        """The peer of `link` proved itself: it no longer counts as pending."""
        self._pending.discard(link)

    async def accept(
        self,
        path_factory: Callable[[Receiver, Callable[[Exception], None]], Any],
        peer: Addr,
        timeout: float = 10.0,
    ) -> QuicLink:
        """Serve one link over a path of its own (an ICE connection) instead of the listening
        socket; `on_link` runs as for any link. Returns once the handshake is done."""
        loop = asyncio.get_running_loop()
        created: asyncio.Future[QuicLink] = loop.create_future()
        paths: list[DatagramPath] = []

        def receive(data: bytes, addr: Addr) -> None:
            if created.done():
                if not created.cancelled() and created.exception() is None:
                    created.result().datagram_received(data, addr)
                return
            odcid = self._backend.initial_dcid(data)
            if odcid is None or not paths:
                return  # not a client's Initial (yet): it is retransmitted
            quic = self._backend.new_connection(self._config, self._tuning, odcid)
            link = QuicLink(quic, paths[0], peer, self._tuning)
            link.owns_path = True
            self._path_links.add(link)
            link.closed.add_done_callback(lambda _f: self._path_links.discard(link))
            created.set_result(link)
            self._on_link(link)
            link.datagram_received(data, addr)

        def error(exc: Exception) -> None:
            if not created.done():
                created.set_exception(LinkError(f"path to {peer} failed: {exc}"))
            elif not created.cancelled() and created.exception() is None:
                created.result().path_error(exc)

        path = await path_factory(receive, error)
        paths.append(path)
        try:
            link = await asyncio.wait_for(asyncio.shield(created), timeout)
        except BaseException:
            created.cancel()  # no link yet: later datagrams and errors go nowhere
            path.close()
            raise
        await link.wait_connected(timeout)
        return link

    def _datagram_received(self, data: bytes, addr: Addr) -> None:
        link = self._links.get(addr)
        if link is not None and not link.closed.done():
            self._received(link, data, addr)
            return
        odcid = self._backend.initial_dcid(data)
        if odcid is None:
            return  # not a new QUIC connection: ignore, never crash the listener
        assert self._path is not None
        refusal = self._admit(addr[0])
        if refusal is not None:
            self.refused_links += 1
            if self.refused_links & (self.refused_links - 1) == 0:  # 1st, 2nd, 4th, ...
                log.warning("new link from %s dropped: %s", addr[0], refusal)
            return
        quic = self._backend.new_connection(self._config, self._tuning, odcid)
        link = QuicLink(quic, self._path, addr, self._tuning)
        self._links[addr] = link
        self._pending.add(link)

        def forget(_reason: str, addr: Addr = addr, link: QuicLink = link) -> None:
            self._pending.discard(link)
            if self._links.get(addr) is link:
                del self._links[addr]

        link.closed.add_done_callback(lambda fut: forget(fut.result()))
        self._on_link(link)
        self._received(link, data, addr)

    def _admit(self, host: str) -> str | None:
        host_links = [link for (h, _port), link in self._links.items() if h == host]
        host_pending = sum(1 for link in host_links if link in self._pending)
        return admit_link(self._limits, host_pending, len(host_links), len(self._pending))

    def _received(self, link: QuicLink, data: bytes, addr: Addr) -> None:
        if self._path is not None and self._path.reads_bursts:
            link.burst_aware = True
            if not link._received:
                self._touched.append(link)
        link.datagram_received(data, addr)

    def close(self) -> None:
        for link in [*self._links.values(), *self._path_links]:
            link.close("server shutting down")
        if self._path is not None:
            self._path.close()
