"""Authenticated frame channels: the asyncio shell around `PeerConnection`.

A channel is one byte link (QUIC normally; plain TCP only for benchmarks) plus the
sans-IO protocol state. `connect_channel` dials and authenticates; `ChannelServer`
accepts. Either way, frames reach `on_frame` only after both sides are authenticated.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography.hazmat.primitives import serialization

from net import auth, wire
from net.errors import ErrorCode, NetError
from net.peer_limits import DEFAULT_LINK_LIMITS, LinkLimits
from net.protocol import (
    Authenticated,
    ConnectionFailed,
    PeerConnection,
    PeerFrame,
    PeerIdentity,
    SessionRejected,
    Side,
)
from net.quic.links import Addr, QuicLink, QuicServer, QuicTuning, Receiver, TlsIdentity, connect
from net.wire.versions import this_release

log = logging.getLogger(__name__)


class AuthenticationFailed(NetError):
    """The peer refused us, or we refused the peer; the message says why."""


class ByteLink(Protocol):
    closed: asyncio.Future[str]
    on_data: Callable[[bytes], None]
    on_close: Callable[[str], None]
    peer_address: Addr

    def send(self, data: bytes) -> None: ...

    def flush(self) -> None: ...

    def close(self, reason: str = "closed", error_code: int = 0) -> None: ...


@dataclass(frozen=True)
class NodeCredentials:
    """Everything a node needs to talk to the swarm: its certified key and the CA."""

    certified: auth.CertifiedKey
    ca_certificate_pem: bytes
    revoked_serials: frozenset[int] = field(default_factory=frozenset)

    @property
    def node_id(self) -> str:
        return auth.node_id_of(self.certified.certificate)

    def tls(self) -> TlsIdentity:
        return TlsIdentity(
            certificate_pem=self.certified.certificate.public_bytes(serialization.Encoding.PEM),
            private_key_pem=auth.private_key_pem(self.certified.private_key),
            ca_pem=self.ca_certificate_pem,
        )

    @property
    def certificate_sha256(self) -> bytes:
        der = self.certified.certificate.public_bytes(serialization.Encoding.DER)
        return hashlib.sha256(der).digest()


FrameHandler = Callable[["Channel", wire.Frame], None]

EARLY_FRAMES = 256
"""Frames kept for a channel whose owner has not set `on_frame` yet (beyond: dropped)."""


class Channel:
    def __init__(self, link: ByteLink, conn: PeerConnection) -> None:
        self.link = link
        self.conn = conn
        loop = asyncio.get_running_loop()
        self.authenticated: asyncio.Future[PeerIdentity] = loop.create_future()
        self._on_frame: FrameHandler | None = None
        self._early: list[wire.Frame] = []
        """Frames that came before `on_frame` was set: a peer may send right behind the
        handshake (a last stage sends a redialling client its latest TOKENS at once),
        before the dialler's `await connect_channel` has even resumed."""
        self.on_close: Callable[[Channel, str], None] = lambda _ch, _r: None
        self.closed = link.closed
        link.on_data = self._data_received
        link.on_close = self._link_closed

    @property
    def on_frame(self) -> FrameHandler:
        return self._on_frame or _ignore

    @on_frame.setter
    def on_frame(self, handler: FrameHandler) -> None:
        self._on_frame = handler
        early, self._early = self._early, []
        for frame in early:
            handler(self, frame)

    @property
    def peer(self) -> PeerIdentity | None:
        return self.conn.peer

    def start(self) -> None:
        if self.conn.role is Side.INITIATOR:
            self.conn.initiate()
            self._flush()

    def send(self, frame: wire.Frame) -> None:
        self.conn.send(frame)
        self._flush()

    def flush(self) -> None:
        """Put the frames sent so far on the wire now instead of at the end of this loop
        turn (net.quic.links.QuicLink.flush): for the hot path, after a step's output."""
        if not self.link.closed.done():
            self.link.flush()

    def close(self, reason: str = "closed") -> None:
        self.link.close(reason)

    def release(self, session: str) -> None:
        """The application is done with `session` on this link (ended, refused, or taken
        over by another link): the link stops treating it as its own."""
        self.conn.release(session)

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.link.closed.done():
            self.link.send(data)

    def _data_received(self, data: bytes) -> None:
        events = self.conn.receive_data(data)
        self._flush()
        for ev in events:
            if isinstance(ev, PeerFrame):
                if self._on_frame is not None:
                    self._on_frame(self, ev.frame)
                elif len(self._early) < EARLY_FRAMES:
                    self._early.append(ev.frame)
            elif isinstance(ev, Authenticated):
                if not self.authenticated.done():
                    self.authenticated.set_result(ev.peer)
            elif isinstance(ev, SessionRejected):
                log.warning("peer %s: session %s rejected: %s", self.peer, ev.session, ev.message)
            elif isinstance(ev, ConnectionFailed):
                who = "peer refused us" if ev.by_peer else "we refused the peer"
                self._fail(f"{who}: {ev.message}")
                self.link.close(ev.message[:200], error_code=0x100 + int(ev.code))

    def _fail(self, reason: str) -> None:
        if not self.authenticated.done():
            self.authenticated.set_exception(AuthenticationFailed(reason))
            self.authenticated.exception()

    def _link_closed(self, reason: str) -> None:
        self._fail(f"link closed before authentication: {reason}")
        self.on_close(self, reason)


def _ignore(_channel: Channel, _frame: wire.Frame) -> None:
    pass


def _proof_maker(creds: NodeCredentials, server_cert_sha256: bytes) -> Callable[[bytes], bytes]:
    def make(nonce: bytes) -> bytes:
        return auth.make_client_proof(creds.certified, nonce, server_cert_sha256).encode()

    return make


def identity_checker(
    creds: NodeCredentials, revoked: Callable[[], Collection[int]] | None = None
) -> Callable[[bytes, bytes], auth.NodeIdentity]:
    """Verify a client's proof, giving all its certificate says (serial included);
    `revoked` gives the current revocation list at each call."""
    ca = auth.load_certificate(creds.ca_certificate_pem)
    own_hash = creds.certificate_sha256

    def check(data: bytes, nonce: bytes) -> auth.NodeIdentity:
        proof = auth.ClientProof.decode(data)
        serials = creds.revoked_serials if revoked is None else revoked()
        return auth.verify_client_proof(proof, ca, nonce, own_hash, revoked=serials)

    return check


def proof_checker(
    creds: NodeCredentials, revoked: Callable[[], Collection[int]] | None = None
) -> Callable[[bytes, bytes], PeerIdentity]:
    """Verify a client's proof; `revoked` gives the current revocation list at each call."""
    verify = identity_checker(creds, revoked)

    def check(data: bytes, nonce: bytes) -> PeerIdentity:
        ident = verify(data, nonce)
        return PeerIdentity(ident.node_id, ident.role)

    return check


async def connect_channel(
    address: Addr,
    creds: NodeCredentials,
    expected_node_id: str,
    tuning: QuicTuning = QuicTuning(),
    timeout: float = 10.0,
    path_factory: Callable[[Receiver, Callable[[Exception], None]], Any] | None = None,
) -> Channel:
    """Dial a node over QUIC and authenticate both ways; raise NetError on failure.
    `path_factory` (e.g. `net.ice.paths.IceSession.path_factory`) replaces the UDP socket."""
    link = await connect(
        address,
        creds.tls(),
        expected_node_id,
        tuning=tuning,
        timeout=timeout,
        path_factory=path_factory,
    )
    server_hash = link.peer_certificate_sha256()
    assert server_hash is not None  # TLS completed, so the server presented a certificate
    conn = PeerConnection(
        Side.INITIATOR,
        make_proof=_proof_maker(creds, server_hash),
        expected_peer=PeerIdentity(expected_node_id, "worker"),
        release=this_release(),
    )
    channel = Channel(link, conn)
    channel.start()
    try:
        await asyncio.wait_for(asyncio.shield(channel.authenticated), timeout)
    except TimeoutError:
        link.close("authentication timed out")
        raise AuthenticationFailed(
            f"{expected_node_id} did not answer our proof in {timeout:.0f} s"
        ) from None
    return channel


class ChannelServer:
    """Accepts QUIC links and authenticates each peer before handing its channel over.

    A link whose peer has not proved itself `limits.auth_timeout_s` after its first
    datagram is closed; until then it counts against the QUIC server's caps on
    unauthenticated links (net.peer_limits)."""

    def __init__(
        self,
        creds: NodeCredentials,
        on_channel: Callable[[Channel], None],
        tuning: QuicTuning = QuicTuning(),
        allowed_roles: Collection[str] = ("worker", "client", "coordinator"),
        limits: LinkLimits = DEFAULT_LINK_LIMITS,
    ) -> None:
        self._creds = creds
        self._on_channel = on_channel
        self._revoked: frozenset[int] = creds.revoked_serials
        self._check = identity_checker(creds, lambda: self._revoked)
        self._certs: dict[Channel, auth.NodeIdentity] = {}
        """The certificate each authenticated channel's peer proved, for revocations."""
        self._allowed_roles = frozenset(allowed_roles)
        self._limits = limits
        self._server = QuicServer(creds.tls(), self._link_accepted, tuning, limits)
        self.channels: set[Channel] = set()
        self.timed_out = 0
        """Links closed because their peer did not authenticate in time."""

    @property
    def quic(self) -> QuicServer:
        return self._server

    async def listen(self, host: str, port: int) -> Addr:
        return await self._server.listen(host, port)

    async def accept_path(
        self,
        path_factory: Callable[[Receiver, Callable[[Exception], None]], Any],
        peer: Addr,
        timeout: float = 10.0,
    ) -> Channel:
        """Serve one peer over a path of its own (an ICE connection): the channel, once the
        peer is authenticated (`on_channel` runs too, as for any channel)."""
        link = await self._server.accept(path_factory, peer, timeout)
        channel = next((ch for ch in self.channels if ch.link is link), None)
        if channel is None:  # the link closed right after its handshake
            raise AuthenticationFailed(f"link from {peer} closed before authentication")
        try:
            await asyncio.wait_for(asyncio.shield(channel.authenticated), timeout)
        except TimeoutError:
            link.close("authentication timed out")
            raise AuthenticationFailed(f"{peer} did not prove itself in {timeout:.0f} s") from None
        return channel

    def update_credentials(self, creds: NodeCredentials) -> None:
        """A renewed certificate: new connections are served and checked with it."""
        self._creds = creds
        self._check = identity_checker(creds, lambda: self._revoked)
        self._server.update_identity(creds.tls())

    @property
    def revoked_serials(self) -> frozenset[int]:
        return self._revoked

    @revoked_serials.setter
    def revoked_serials(self, serials: frozenset[int]) -> None:
        """Refuse newly revoked nodes (the coordinator publishes them): new connections
        from them fail authentication, and links they hold open now are closed (see
        `refresh_trust`), so a certificate is not trusted a moment past its next refresh."""
        self.refresh_trust(serials)

    def refresh_trust(self, serials: frozenset[int], now: dt.datetime | None = None) -> int:
        """Close every open link whose peer's certificate is now revoked or has expired
        (`now`: the time to judge by, the current UTC time by default); how many closed.
        Links are checked at authentication only, so this is what ends a long-lived link
        from a node that lost its trust while it was connected."""
        self._revoked = serials
        at = now or dt.datetime.now(dt.UTC)
        closed = 0
        for channel, ident in list(self._certs.items()):
            if ident.serial in serials:
                why = f"certificate of {ident.node_id} (serial {ident.serial:x}) revoked"
            elif ident.not_after < at:
                why = f"certificate of {ident.node_id} expired at {ident.not_after.isoformat()}"
            else:
                continue
            log.warning("closing the link of %s: %s", ident.node_id, why)
            channel.close(why)
            self._certs.pop(channel, None)
            closed += 1
        return closed

    def _check_role(self, data: bytes, nonce: bytes, channel: Channel) -> PeerIdentity:
        ident = self._check(data, nonce)
        if ident.role not in self._allowed_roles:
            raise auth.AuthError(f"role {ident.role!r} may not connect here")
        if not channel.closed.done():
            self._certs[channel] = ident
        return PeerIdentity(ident.node_id, ident.role)

    def _link_accepted(self, link: ByteLink) -> None:
        channel: Channel | None = None

        def check(data: bytes, nonce: bytes) -> PeerIdentity:
            assert channel is not None  # proofs arrive after the link is set up
            return self._check_role(data, nonce, channel)

        conn = PeerConnection(
            Side.ACCEPTOR, check_proof=check, new_nonce=auth.new_nonce, release=this_release()
        )
        channel = ch = Channel(link, conn)
        self.channels.add(ch)

        def forget(_f: object) -> None:
            self.channels.discard(ch)
            self._certs.pop(ch, None)

        ch.closed.add_done_callback(forget)
        deadline = asyncio.get_running_loop().call_later(
            self._limits.auth_timeout_s, self._auth_expired, ch
        )

        def ready(fut: asyncio.Future[PeerIdentity]) -> None:
            deadline.cancel()
            if not fut.cancelled() and fut.exception() is None:
                if isinstance(link, QuicLink):
                    self._server.trusted(link)
                self._on_channel(ch)

        ch.authenticated.add_done_callback(ready)
        ch.start()

    def _auth_expired(self, channel: Channel) -> None:
        if channel.authenticated.done() or channel.closed.done():
            return
        self.timed_out += 1
        why = f"not authenticated within {self._limits.auth_timeout_s:g} s"
        log.info("closing the link of %s: %s", channel.link.peer_address, why)
        channel.close(why)

    def close(self) -> None:
        self._server.close()


__all__ = [
    "AuthenticationFailed",
    "Channel",
    "ChannelServer",
    "ErrorCode",
    "NodeCredentials",
    "connect_channel",
]
