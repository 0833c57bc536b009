"""Sans-IO state of one peer connection: authentication first, then frames.

Bytes go in with `receive_data`, events come out; frames to send are taken with
`data_to_send`. No sockets, no asyncio, no clock: the shell (net.channel) does IO.

Authentication (docs/architecture.md, "Trust"): TLS has already proved the acceptor's
identity to the initiator. The initiator then proves its own: HELLO -> CHALLENGE(nonce) ->
PROOF(certificate, signature over nonce and the acceptor's certificate hash) ->
WELCOME. Nothing else is processed before WELCOME; a refused peer is told why.

Versions (net.wire.versions): HELLO carries the initiator's protocol and release, WELCOME the
acceptor's, only when the HELLO had them (an initiator of protocol 1 refuses a WELCOME
with a tail). Each side then sends frames of the lower protocol: optional tails the peer
does not read never leave. A peer older than `oldest_protocol` is refused with
UNSUPPORTED_VERSION and a message saying to update.

Once ready, the acceptor checks session ownership: STEP and CLOSE frames must name a
session this connection opened. A violation is answered with an ERROR for that
session; the connection and the other sessions carry on.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, auto

from net import wire
from net.errors import ErrorCode, FrameError
from net.peer_limits import pre_auth_limits
from net.wire.versions import PeerTooOld, negotiate


class Side(Enum):
    """Which end of the connection this is: the initiator proves its identity, the
    acceptor checks it (net.auth.Role is what a certificate allows instead)."""

    INITIATOR = auto()
    ACCEPTOR = auto()


class State(Enum):
    SEND_HELLO = auto()
    AWAIT_HELLO = auto()
    AWAIT_CHALLENGE = auto()
    AWAIT_PROOF = auto()
    AWAIT_WELCOME = auto()
    READY = auto()
    CLOSED = auto()


@dataclass(frozen=True)
class PeerIdentity:
    node_id: str
    role: str


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class Authenticated:
    peer: PeerIdentity
    protocol: int = wire.PROTOCOL_VERSION
    """The protocol negotiated: the lower of both sides'."""
    peer_release: str = ""
    """The package version the peer announced ("": a release before the exchange)."""


@dataclass(frozen=True)
class PeerFrame:
    """A frame from the authenticated peer that passed the connection's checks."""

    frame: wire.Frame


@dataclass(frozen=True)
class SessionRejected:
    """A frame broke a session rule; an ERROR was queued for the peer."""

    session: str
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class ConnectionFailed:
    """The connection is unusable (malformed bytes, failed authentication); close it."""

    code: ErrorCode
    message: str
    by_peer: bool


Event = Authenticated | PeerFrame | SessionRejected | ConnectionFailed

ProofMaker = Callable[[bytes], bytes]
"""Initiator: nonce -> encoded proof of our identity."""
ProofChecker = Callable[[bytes, bytes], PeerIdentity]
"""Acceptor: (encoded proof, nonce we sent) -> identity; raises on a bad proof."""


class PeerConnection:
    def __init__(
        self,
        role: Side,
        *,
        make_proof: ProofMaker | None = None,
        check_proof: ProofChecker | None = None,
        new_nonce: Callable[[], bytes] | None = None,
        expected_peer: PeerIdentity | None = None,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        protocol: int = wire.PROTOCOL_VERSION,
        oldest_protocol: int = wire.MIN_PROTOCOL_VERSION,
        release: str = "",
    ) -> None:
        """`protocol` below PROTOCOL_VERSION makes this side behave as a peer of that
        protocol (tests pump one against the current one); `release` is announced."""
        if role is Side.INITIATOR and (make_proof is None or expected_peer is None):
            raise ValueError("an initiator needs make_proof and the peer TLS verified")
        if role is Side.ACCEPTOR and (check_proof is None or new_nonce is None):
            raise ValueError("an acceptor needs check_proof and new_nonce")
        self.role = role
        self.state = State.SEND_HELLO if role is Side.INITIATOR else State.AWAIT_HELLO
        self.peer: PeerIdentity | None = None
        self._make_proof = make_proof
        self._check_proof = check_proof
        self._new_nonce = new_nonce
        self._expected_peer = expected_peer
        self._nonce = b""
        if not 1 <= protocol <= wire.PROTOCOL_VERSION or not 1 <= oldest_protocol <= protocol:
            raise ValueError(f"protocol {protocol}, oldest {oldest_protocol}")
        self.protocol = protocol
        self.oldest_protocol = oldest_protocol
        self.own_release = release if protocol > 1 else ""
        self.negotiated = protocol
        """The protocol frames are sent in: ours until the peer's HELLO or WELCOME says."""
        self.peer_protocol = 0
        self.peer_release = ""
        self._decoder = wire.FrameDecoder(pre_auth_limits(limits), protocol)
        """Handshake-sized caps until READY (net.peer_limits), then `limits`; tails of
        protocols newer than ours are refused, as a peer of our protocol does."""
        self._limits = limits
        self._out = bytearray()
        self.owned_sessions: set[str] = set()

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    # ------------------------------------------------------------ output

    def initiate(self) -> None:
        if self.state is not State.SEND_HELLO:
            raise RuntimeError(f"initiate() in state {self.state.name}")
        self._queue(wire.Hello(self.protocol, self.own_release))
        self.state = State.AWAIT_CHALLENGE

    def send(self, frame: wire.Frame) -> None:
        if self.state is not State.READY:
            raise RuntimeError(f"cannot send {type(frame).__name__} in state {self.state.name}")
        self._queue(frame)

    def data_to_send(self) -> bytes:
        data = bytes(self._out)
        self._out.clear()
        return data

    def _queue(self, frame: wire.Frame) -> None:
        self._out += wire.encode(frame, self._limits, self.negotiated)

    # ------------------------------------------------------------ input

    def receive_data(self, data: bytes) -> list[Event]:
        if self.state is State.CLOSED:
            return []
        events: list[Event] = []
        while True:
            # Before READY one frame at a time: the frames behind WELCOME (a peer may send
            # at once) are read under the general caps, not the handshake's.
            ready = self.state is State.READY
            try:
                frames = self._decoder.feed(data, None if ready else 1)
            except FrameError as exc:
                return [*events, self._fail(exc.code, f"malformed frame: {exc}")]
            data = b""
            for frame in frames:
                events.extend(self._handle(frame))
                if self.closed:
                    return events
            if ready or not frames:
                return events
            if self.state is State.READY:
                self._decoder.limits = self._limits

    def _handle(self, frame: wire.Frame) -> list[Event]:
        handler = _HANDLERS.get((self.state, type(frame)))
        if handler is not None:
            return handler(self, frame)
        if isinstance(frame, wire.Error) and self.state is not State.READY:
            self.state = State.CLOSED
            return [ConnectionFailed(frame.code, frame.message, by_peer=True)]
        if self.state is not State.READY:
            return [
                self._fail(
                    ErrorCode.UNAUTHENTICATED, f"{type(frame).__name__} before authentication"
                )
            ]
        return [PeerFrame(frame)]

    def _fail(self, code: ErrorCode, message: str) -> ConnectionFailed:
        if self.state is not State.CLOSED:
            self._queue(wire.Error("", code, wire.truncate_utf8(message, self._limits.max_string)))
        self.state = State.CLOSED
        return ConnectionFailed(code, message, by_peer=False)

    # ------------------------------------------------------------ handlers (one per row)

    def _agree(self, theirs: int, release: str) -> ConnectionFailed | None:
        """Settle the protocol with the peer's announcement; a refusal when too old."""
        self.peer_protocol, self.peer_release = theirs, release
        try:
            self.negotiated = negotiate(self.protocol, theirs, self.oldest_protocol)
        except PeerTooOld:
            too_old = PeerTooOld(theirs, self.oldest_protocol, release)  # names the release
            return self._fail(ErrorCode.UNSUPPORTED_VERSION, str(too_old))
        return None

    def _on_hello(self, frame: wire.Frame) -> list[Event]:
        assert isinstance(frame, wire.Hello) and self._new_nonce is not None
        refused = self._agree(frame.protocol, frame.release)
        if refused is not None:
            return [refused]
        self._nonce = self._new_nonce()
        self._queue(wire.Challenge(self._nonce))
        self.state = State.AWAIT_PROOF
        return []

    def _on_challenge(self, frame: wire.Frame) -> list[Event]:
        assert isinstance(frame, wire.Challenge) and self._make_proof is not None
        self._queue(wire.Proof(self._make_proof(frame.nonce)))
        self.state = State.AWAIT_WELCOME
        return []

    def _on_proof(self, frame: wire.Frame) -> list[Event]:
        assert isinstance(frame, wire.Proof) and self._check_proof is not None
        try:
            peer = self._check_proof(frame.data, self._nonce)
        except Exception as exc:  # any verification failure refuses the peer, with the reason
            return [self._fail(ErrorCode.UNAUTHENTICATED, f"authentication refused: {exc}")]
        self.peer = peer
        # Encoded at the negotiated protocol: an initiator of protocol 1 gets no tail.
        self._queue(wire.Welcome(peer.node_id, self.protocol, self.own_release))
        self.state = State.READY
        return [Authenticated(peer, self.negotiated, self.peer_release)]

    def _on_welcome(self, frame: wire.Frame) -> list[Event]:
        assert isinstance(frame, wire.Welcome) and self._expected_peer is not None
        refused = self._agree(frame.protocol, frame.release)
        if refused is not None:
            return [refused]
        self.peer = self._expected_peer
        self.state = State.READY
        return [Authenticated(self._expected_peer, self.negotiated, self.peer_release)]

    def _on_ping(self, frame: wire.Frame) -> list[Event]:
        assert isinstance(frame, wire.Ping)
        self._queue(wire.Pong(frame.nonce))
        return []

    def _on_open(self, frame: wire.Frame) -> list[Event]:
        assert isinstance(frame, wire.Open)
        if self.role is Side.ACCEPTOR:
            if frame.session in self.owned_sessions:
                return [self._reject(frame.session, ErrorCode.NOT_OWNER, "session already open")]
            self.owned_sessions.add(frame.session)
        return [PeerFrame(frame)]

    def _on_owned(self, frame: wire.Frame) -> list[Event]:
        assert isinstance(frame, wire.Step | wire.Close)
        if self.role is Side.ACCEPTOR and frame.session not in self.owned_sessions:
            return [
                self._reject(
                    frame.session, ErrorCode.NOT_OWNER, "session not opened on this connection"
                )
            ]
        if isinstance(frame, wire.Close):
            self.owned_sessions.discard(frame.session)
        return [PeerFrame(frame)]

    def _reject(self, session: str, code: ErrorCode, message: str) -> SessionRejected:
        self._queue(wire.Error(session, code, message))
        return SessionRejected(session, code, message)

    def release(self, session: str) -> None:
        """The application ended a session (error or finished); forget its ownership."""
        self.owned_sessions.discard(session)


# ---------------------------------------------------------------- OVERLOADED hints


@dataclass(frozen=True)
class OverloadHint:
    """What an OVERLOADED refusal tells the client: when to ask this route again (0:
    never, the request does not fit here at all) and whether to ask for another route."""

    retry_after_ms: int
    try_another_route: bool


_HINT = re.compile(r"^\[retry-after-ms=(\d{1,9}) another-route=([01])\] ?")


def overloaded(session: str, message: str, hint: OverloadHint) -> wire.Error:
    """An ERROR(OVERLOADED) carrying `hint`. The hint rides at the head of the message
    (`[retry-after-ms=N another-route=0|1] why`), so the frame layout and VERSION stay as
    they are: a peer of any version decodes it, and reads it as plain text at worst."""
    if hint.retry_after_ms < 0:
        raise ValueError("retry_after_ms must be >= 0")
    head = f"[retry-after-ms={hint.retry_after_ms} another-route={int(hint.try_another_route)}] "
    text = wire.truncate_utf8(head + message, wire.DEFAULT_LIMITS.max_string)
    return wire.Error(session, ErrorCode.OVERLOADED, text)


def overload_hint(code: ErrorCode, message: str) -> tuple[OverloadHint | None, str]:
    """The hint of an OVERLOADED error and the message without it; (None, message) for
    other codes and for OVERLOADED from peers that send no hint."""
    m = _HINT.match(message) if code is ErrorCode.OVERLOADED else None
    if m is None:
        return None, message
    return OverloadHint(int(m.group(1)), m.group(2) == "1"), message[m.end() :]


_Handler = Callable[[PeerConnection, wire.Frame], list[Event]]

_HANDLERS: dict[tuple[State, type], _Handler] = {
    (State.AWAIT_HELLO, wire.Hello): PeerConnection._on_hello,
    (State.AWAIT_CHALLENGE, wire.Challenge): PeerConnection._on_challenge,
    (State.AWAIT_PROOF, wire.Proof): PeerConnection._on_proof,
    (State.AWAIT_WELCOME, wire.Welcome): PeerConnection._on_welcome,
    (State.READY, wire.Ping): PeerConnection._on_ping,
    (State.READY, wire.Open): PeerConnection._on_open,
    (State.READY, wire.Step): PeerConnection._on_owned,
    (State.READY, wire.Close): PeerConnection._on_owned,
}
