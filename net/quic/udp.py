"""UDP sockets for QUIC links: the plain `DatagramPath` (ICE paths are in net.ice.paths).

A hidden state is a burst of a few datagrams. asyncio's datagram transport reads one
datagram per wake-up of the event loop, so a 3-packet frame costs three loop turns and
three QUIC transmits (an ACK in the middle of the frame, on the critical path). On event
loops that watch file descriptors (the selector loop, uvloop: Linux and macOS), the socket
is read directly instead: every datagram waiting is taken in one wake-up (`drain`), and
the link transmits once after the whole burst. Loops without `add_reader` (Windows'
proactor) use the transport, one datagram per turn, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Callable
from typing import Any, cast

from net.quic.path_mtu import set_dont_fragment

Addr = tuple[str, int]
Receiver = Callable[[bytes, Addr], None]

BUFFER_BYTES = 4 << 20
"""Socket buffers: larger ones absorb bursts (best effort; the OS may cap them)."""
MAX_DATAGRAM = 65535
DRAIN_LIMIT = 64
"""Datagrams read per wake-up at most, so one busy peer cannot starve the loop."""


def drain(
    read: Callable[[], tuple[bytes, Any]], deliver: Callable[[bytes, Any], None], limit: int
) -> int:
    """Read datagrams until the socket would block (or `limit`); how many were delivered.

    `read` raises BlockingIOError when nothing is left; other OSErrors propagate (a
    connected socket reports ICMP port unreachable this way)."""
    n = 0
    while n < limit:
        try:
            data, addr = read()
        except (BlockingIOError, InterruptedError):
            break
        deliver(data, addr)
        n += 1
    return n


def _enlarge_buffers(sock: Any) -> None:
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, BUFFER_BYTES)


_REFUSED = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)


class UdpPath(asyncio.DatagramProtocol):
    """A UDP socket. Connected (one peer) for outgoing links, so ICMP "port unreachable"
    from a dead peer is reported at once instead of after the idle timeout."""

    def __init__(
        self, receiver: Receiver, on_error: Callable[[Exception], None] | None = None
    ) -> None:
        self._receiver = receiver
        self._on_error = on_error
        self._transport: asyncio.DatagramTransport | None = None
        self._sock: socket.socket | None = None
        """Set when the socket is read directly (`drain`) instead of through a transport."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.connected = False
        self.on_burst_end: Callable[[], None] | None = None
        """Called after every wake-up that read datagrams, once they are all delivered."""
        self.wakeups = 0
        """Loop wake-ups that read datagrams (tests count them against datagrams)."""
        self.datagrams = 0
        self.dont_fragment = False
        """Datagrams leave whole or not at all (net.quic.path_mtu): links may probe the MTU."""
        self._peer: Addr | None = None
        """A connected socket's peer: what every datagram it reads comes from."""

    @classmethod
    async def bind(cls, host: str, port: int, receiver: Receiver) -> UdpPath:
        path = cls(receiver)
        await path._open(local=(host, port), remote=None)
        return path

    @classmethod
    async def connect(
        cls, remote: Addr, receiver: Receiver, on_error: Callable[[Exception], None]
    ) -> UdpPath:
        path = cls(receiver, on_error)
        await path._open(local=None, remote=remote)
        path.connected = True
        if path._sock is not None:
            host, port = path._sock.getpeername()[:2]
            path._peer = (str(host), int(port))
        return path

    async def _open(self, local: Addr | None, remote: Addr | None) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        target = remote if remote is not None else local
        assert target is not None
        infos = await loop.getaddrinfo(*target, type=socket.SOCK_DGRAM)
        family, _, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_DGRAM, proto)
        try:
            sock.setblocking(False)
            _enlarge_buffers(sock)
            self.dont_fragment = set_dont_fragment(sock)
            if local is not None:
                sock.bind(sockaddr)
            else:
                sock.connect(sockaddr)
            loop.add_reader(sock.fileno(), self._readable)
        except NotImplementedError:  # a proactor loop: read through a transport instead
            sock.close()
            await self._open_transport(loop, local, remote)
            return
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    async def _open_transport(
        self, loop: asyncio.AbstractEventLoop, local: Addr | None, remote: Addr | None
    ) -> None:
        await loop.create_datagram_endpoint(lambda: self, local_addr=local, remote_addr=remote)

    # -- the transport's callbacks (proactor loops)
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            _enlarge_buffers(sock)
            self.dont_fragment = set_dont_fragment(sock)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.wakeups += 1
        self._deliver(data, addr)

    def error_received(self, exc: Exception) -> None:
        if self._on_error is not None:
            self._on_error(exc)

    # -- reading the socket directly
    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        peer = self._peer
        try:
            if peer is not None:  # connected: `recv` (no source address built per datagram)
                n = drain(lambda: (sock.recv(MAX_DATAGRAM), peer), self._deliver, DRAIN_LIMIT)
            else:
                n = drain(lambda: sock.recvfrom(MAX_DATAGRAM), self._deliver, DRAIN_LIMIT)
        except OSError as exc:
            self.error_received(exc)
            return
        if n:
            self.wakeups += 1
            if self.on_burst_end is not None:
                self.on_burst_end()

    @property
    def reads_bursts(self) -> bool:
        """True when a wake-up reads every datagram waiting and ends with `on_burst_end`."""
        return self._sock is not None

    def _deliver(self, data: bytes, addr: Any) -> None:
        self.datagrams += 1
        # An IPv4 socket gives (str, int) already; IPv6 adds flow info and scope id.
        self._receiver(data, addr if len(addr) == 2 else (str(addr[0]), int(addr[1])))

    @property
    def remote_host(self) -> str:
        """The numeric address a connected socket sends to ("" when not connected)."""
        if self._sock is None or not self.connected:
            return ""
        try:
            return str(self._sock.getpeername()[0])
        except OSError:
            return ""

    @property
    def local_address(self) -> Addr:
        if self._sock is not None:
            host, port = self._sock.getsockname()[:2]
        else:
            assert self._transport is not None
            host, port = self._transport.get_extra_info("sockname")[:2]
        return str(host), int(port)

    def send(self, data: bytes, addr: Addr) -> None:
        if self._closed:
            return
        sock = self._sock
        if sock is None:
            if self._transport is None or self._transport.is_closing():
                return
            if self.connected:
                self._transport.sendto(data)
            else:
                self._transport.sendto(data, addr)
            return
        try:
            if self.connected:
                sock.send(data)
            else:
                sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            pass  # the send buffer is full: a lost datagram, which QUIC retransmits
        except OSError as exc:
            if exc.errno in _REFUSED:
                self.error_received(exc)
            # Anything else (a route change, EMSGSIZE) is a lost datagram as well.

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        if self._transport is not None:
            self._transport.close()
