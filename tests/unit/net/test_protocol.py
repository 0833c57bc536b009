"""net.protocol: the sans-IO handshake and session ownership, pumped in memory.

Two PeerConnection objects (initiator and acceptor) exchange bytes through `pump`; the
proofs are real net.auth proofs, so every refusal here is the one a real peer would get.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import pytest

from net import auth, wire
from net.errors import ErrorCode
from net.protocol import (
    Authenticated,
    ConnectionFailed,
    Event,
    PeerConnection,
    PeerFrame,
    PeerIdentity,
    SessionRejected,
    Side,
    State,
)
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

SERVER_ID = "stage1"
CLIENT_ID = "client1"
CA_NAME = "swarm-ca"


# ---------------------------------------------------------------- credentials


def node(ca: auth.CertifiedKey, node_id: str, role: str) -> auth.CertifiedKey:
    key = auth.new_private_key()
    cert = auth.issue_node_certificate(ca, node_id, key.public_key(), role)
    return auth.CertifiedKey(certificate=cert, private_key=key)


@dataclass(frozen=True)
class Swarm:
    ca: auth.CertifiedKey
    server: auth.CertifiedKey
    client: auth.CertifiedKey

    @property
    def server_hash(self) -> bytes:
        return auth.certificate_digest(self.server.certificate)


@pytest.fixture(scope="module")
def swarm() -> Swarm:
    ca = auth.create_ca(CA_NAME)
    return Swarm(ca, node(ca, SERVER_ID, "worker"), node(ca, CLIENT_ID, "client"))


def proof_maker(client: auth.CertifiedKey, server_hash: bytes) -> Callable[[bytes], bytes]:
    """Like net.channel: sign the acceptor's nonce and certificate hash."""

    def make(nonce: bytes) -> bytes:
        return auth.make_client_proof(client, nonce, server_hash).encode()

    return make


def proof_checker(
    ca: auth.CertifiedKey, server_hash: bytes, revoked: Collection[int | str] = ()
) -> Callable[[bytes, bytes], PeerIdentity]:
    """Like net.channel: check chain, expiry, revocation and the signature over our nonce."""

    def check(data: bytes, nonce: bytes) -> PeerIdentity:
        proof = auth.ClientProof.decode(data)
        ident = auth.verify_client_proof(proof, ca.certificate, nonce, server_hash, revoked=revoked)
        return PeerIdentity(ident.node_id, ident.role)

    return check


def fixed_nonces(*nonces: bytes) -> Callable[[], bytes]:
    it = iter(nonces)
    return lambda: next(it)


def initiator(swarm: Swarm, client: auth.CertifiedKey | None = None) -> PeerConnection:
    return PeerConnection(
        Side.INITIATOR,
        make_proof=proof_maker(client or swarm.client, swarm.server_hash),
        expected_peer=PeerIdentity(SERVER_ID, "worker"),
    )


def acceptor(
    swarm: Swarm,
    revoked: Collection[int | str] = (),
    new_nonce: Callable[[], bytes] = auth.new_nonce,
) -> PeerConnection:
    return PeerConnection(
        Side.ACCEPTOR,
        check_proof=proof_checker(swarm.ca, swarm.server_hash, revoked),
        new_nonce=new_nonce,
    )


# ---------------------------------------------------------------- pumping


def pump(a: PeerConnection, b: PeerConnection) -> tuple[list[Event], list[Event]]:
    """Move queued bytes both ways until both are quiet; return (a's events, b's events)."""
    a_events: list[Event] = []
    b_events: list[Event] = []
    for _ in range(32):
        to_b, to_a = a.data_to_send(), b.data_to_send()
        if not to_a and not to_b:
            return a_events, b_events
        if to_b:
            b_events += b.receive_data(to_b)
        if to_a:
            a_events += a.receive_data(to_a)
    raise AssertionError("pump did not settle")


def frames_in(data: bytes) -> list[wire.Frame]:
    return wire.FrameDecoder().feed(data)


def connected(swarm: Swarm) -> tuple[PeerConnection, PeerConnection]:
    a, b = initiator(swarm), acceptor(swarm)
    a.initiate()
    a_events, b_events = pump(a, b)
    assert a.state is State.READY and b.state is State.READY
    assert a_events == [Authenticated(PeerIdentity(SERVER_ID, "worker"))]
    assert b_events == [Authenticated(PeerIdentity(CLIENT_ID, "client"))]
    return a, b


def state(conn: PeerConnection) -> State:
    """The state, read through a call so the type checker does not pin it between steps."""
    return conn.state


def open_frame(session: str) -> wire.Open:
    return wire.Open(
        session=session,
        model="tiny",
        wire_dtype=WireDtype.F32,
        sampling=wire.SamplingSpec(),
        reply_to=CLIENT_ID,
        max_tokens=8,
        prompt_len=3,
    )


def step_frame(session: str, step_id: int = 0) -> wire.Step:
    return wire.Step(
        session=session,
        step_id=step_id,
        start=0,
        tokens=(1, 2, 3),
        hidden=None,
        n_rows=3,
        width=0,
        wire_dtype=WireDtype.F32,
    )


def refused_by_peer(events: list[Event]) -> ConnectionFailed:
    assert events, "the initiator was told nothing"
    last = events[-1]
    assert isinstance(last, ConnectionFailed)
    assert last.by_peer
    assert not any(isinstance(e, Authenticated | PeerFrame) for e in events)
    return last


def refuse_handshake(
    a: PeerConnection, b: PeerConnection
) -> tuple[ConnectionFailed, ConnectionFailed]:
    """Run a handshake that the acceptor must refuse; return (acceptor's, initiator's) failure."""
    a.initiate()
    b.receive_data(a.data_to_send())  # HELLO -> CHALLENGE
    a.receive_data(b.data_to_send())  # CHALLENGE -> PROOF
    b_events = b.receive_data(a.data_to_send())
    assert len(b_events) == 1
    failure = b_events[0]
    assert isinstance(failure, ConnectionFailed)
    assert failure.code is ErrorCode.UNAUTHENTICATED and not failure.by_peer
    assert b.state is State.CLOSED and b.peer is None and not b.owned_sessions
    reply = b.data_to_send()
    [error] = frames_in(reply)
    assert isinstance(error, wire.Error)
    assert error.session == "" and error.code is ErrorCode.UNAUTHENTICATED
    told = refused_by_peer(a.receive_data(reply))
    assert told.code is ErrorCode.UNAUTHENTICATED
    assert told.message == error.message
    assert a.state is State.CLOSED and a.peer is None
    return failure, told


# ---------------------------------------------------------------- handshake


def test_full_handshake_authenticates_both_sides(swarm: Swarm) -> None:
    a, b = initiator(swarm), acceptor(swarm)
    assert (a.state, b.state) == (State.SEND_HELLO, State.AWAIT_HELLO)
    a.initiate()
    assert state(a) is State.AWAIT_CHALLENGE
    hello = a.data_to_send()
    assert frames_in(hello) == [wire.Hello(wire.PROTOCOL_VERSION)]

    assert b.receive_data(hello) == []
    assert state(b) is State.AWAIT_PROOF
    [challenge] = frames_in(challenge_bytes := b.data_to_send())
    assert isinstance(challenge, wire.Challenge) and len(challenge.nonce) == auth.NONCE_SIZE

    assert a.receive_data(challenge_bytes) == []
    assert state(a) is State.AWAIT_WELCOME
    [proof] = frames_in(proof_bytes := a.data_to_send())
    assert isinstance(proof, wire.Proof)

    assert b.receive_data(proof_bytes) == [Authenticated(PeerIdentity(CLIENT_ID, "client"))]
    assert state(b) is State.READY
    assert b.peer == PeerIdentity(CLIENT_ID, "client")
    welcome_bytes = b.data_to_send()
    assert frames_in(welcome_bytes) == [wire.Welcome(CLIENT_ID, wire.PROTOCOL_VERSION)]

    assert a.receive_data(welcome_bytes) == [Authenticated(PeerIdentity(SERVER_ID, "worker"))]
    assert state(a) is State.READY
    assert a.peer == PeerIdentity(SERVER_ID, "worker")
    assert a.data_to_send() == b"" and b.data_to_send() == b""


def test_handshake_survives_byte_by_byte_delivery(swarm: Swarm) -> None:
    a, b = initiator(swarm), acceptor(swarm)
    a.initiate()
    a_events: list[Event] = []
    b_events: list[Event] = []
    for _ in range(8):
        for byte in a.data_to_send():
            b_events += b.receive_data(bytes([byte]))
        for byte in b.data_to_send():
            a_events += a.receive_data(bytes([byte]))
    assert [type(e) for e in a_events] == [Authenticated]
    assert [type(e) for e in b_events] == [Authenticated]
    assert a.state is State.READY and b.state is State.READY


def test_each_connection_gets_a_fresh_challenge(swarm: Swarm) -> None:
    nonces = []
    for _ in range(2):
        a, b = initiator(swarm), acceptor(swarm)
        a.initiate()
        b.receive_data(a.data_to_send())
        [challenge] = frames_in(b.data_to_send())
        assert isinstance(challenge, wire.Challenge)
        nonces.append(challenge.nonce)
    assert nonces[0] != nonces[1]


def test_constructor_requires_the_callables_of_its_role(swarm: Swarm) -> None:
    with pytest.raises(ValueError):
        PeerConnection(Side.INITIATOR, expected_peer=PeerIdentity(SERVER_ID, "worker"))
    with pytest.raises(ValueError):
        PeerConnection(Side.INITIATOR, make_proof=proof_maker(swarm.client, swarm.server_hash))
    with pytest.raises(ValueError):
        PeerConnection(Side.ACCEPTOR, new_nonce=auth.new_nonce)
    with pytest.raises(ValueError):
        PeerConnection(Side.ACCEPTOR, check_proof=proof_checker(swarm.ca, swarm.server_hash))


def test_initiate_only_once_and_only_by_the_initiator(swarm: Swarm) -> None:
    a, b = initiator(swarm), acceptor(swarm)
    a.initiate()
    with pytest.raises(RuntimeError):
        a.initiate()
    with pytest.raises(RuntimeError):
        b.initiate()


# ---------------------------------------------------------------- nothing before authentication


@pytest.mark.parametrize("with_hello", [True, False], ids=["after-hello", "instead-of-hello"])
def test_frame_before_authentication_is_refused(swarm: Swarm, with_hello: bool) -> None:
    a, b = initiator(swarm), acceptor(swarm)
    a.initiate()
    hello = a.data_to_send()
    # send() refuses before READY, so write the frame as a misbehaving peer would.
    sneaky = (hello if with_hello else b"") + wire.encode(open_frame("s1"))
    b_events = b.receive_data(sneaky)
    assert len(b_events) == 1
    failure = b_events[0]
    assert isinstance(failure, ConnectionFailed)
    assert failure.code is ErrorCode.UNAUTHENTICATED and not failure.by_peer
    assert "Open before authentication" in failure.message
    assert b.state is State.CLOSED and b.peer is None and not b.owned_sessions

    reply = b.data_to_send()
    errors = [f for f in frames_in(reply) if isinstance(f, wire.Error)]
    assert [(e.session, e.code) for e in errors] == [("", ErrorCode.UNAUTHENTICATED)]

    told = refused_by_peer(a.receive_data(reply))
    assert told.code is ErrorCode.UNAUTHENTICATED
    assert "Open before authentication" in told.message
    assert a.state is State.CLOSED and a.peer is None

    # A closed acceptor processes nothing more, not even a correct handshake.
    assert b.receive_data(wire.encode(wire.Hello())) == []
    assert b.data_to_send() == b""


def test_frame_pipelined_behind_a_refused_proof_is_never_processed(swarm: Swarm) -> None:
    rogue_ca = auth.create_ca(CA_NAME)
    a, b = initiator(swarm, client=node(rogue_ca, CLIENT_ID, "client")), acceptor(swarm)
    a.initiate()
    b.receive_data(a.data_to_send())
    a.receive_data(b.data_to_send())
    proof = a.data_to_send()
    events = b.receive_data(proof + wire.encode(open_frame("s1")) + wire.encode(wire.Ping(1)))
    assert [type(e) for e in events] == [ConnectionFailed]
    assert not b.owned_sessions
    assert [type(f) for f in frames_in(b.data_to_send())] == [wire.Error]


def test_proof_from_a_rogue_ca_of_the_same_name_is_refused(swarm: Swarm) -> None:
    rogue_ca = auth.create_ca(CA_NAME)
    assert rogue_ca.certificate.subject == swarm.ca.certificate.subject
    rogue = node(rogue_ca, CLIENT_ID, "client")
    failure, told = refuse_handshake(initiator(swarm, client=rogue), acceptor(swarm))
    for message in (failure.message, told.message):
        assert message.startswith("authentication refused")
        # The signature check is what tells the CAs apart: the name is the same.
        assert "does not verify with the swarm CA key" in message


def test_revoked_node_is_refused(swarm: Swarm) -> None:
    serial = swarm.client.certificate.serial_number
    failure, told = refuse_handshake(initiator(swarm), acceptor(swarm, revoked={serial}))
    assert "revoked" in failure.message and "revoked" in told.message
    assert CLIENT_ID in told.message


def test_revoked_by_fingerprint_is_refused(swarm: Swarm) -> None:
    fp = auth.fingerprint(swarm.client.certificate)
    _, told = refuse_handshake(initiator(swarm), acceptor(swarm, revoked={fp}))
    assert "revoked" in told.message


def test_proof_replayed_against_another_nonce_is_refused(swarm: Swarm) -> None:
    first, second = b"\x01" * auth.NONCE_SIZE, b"\x02" * auth.NONCE_SIZE
    a, b1 = initiator(swarm), acceptor(swarm, new_nonce=fixed_nonces(first))
    a.initiate()
    b1.receive_data(a.data_to_send())
    a.receive_data(b1.data_to_send())
    captured = a.data_to_send()  # a valid PROOF, signed over `first`

    # An eavesdropper replays it to a new connection, which challenges with `second`.
    b2 = acceptor(swarm, new_nonce=fixed_nonces(second))
    assert b2.receive_data(wire.encode(wire.Hello())) == []
    [challenge] = frames_in(b2.data_to_send())
    assert challenge == wire.Challenge(second)
    [failure] = b2.receive_data(captured)
    assert isinstance(failure, ConnectionFailed)
    assert failure.code is ErrorCode.UNAUTHENTICATED
    assert "does not verify" in failure.message
    assert b2.state is State.CLOSED and b2.peer is None

    # The same bytes are good for the nonce they were made for.
    assert b1.receive_data(captured) == [Authenticated(PeerIdentity(CLIENT_ID, "client"))]


def test_proof_made_for_another_server_is_refused(swarm: Swarm) -> None:
    other_server = node(swarm.ca, "stage9", "worker")
    a = PeerConnection(
        Side.INITIATOR,
        make_proof=proof_maker(swarm.client, auth.certificate_digest(other_server.certificate)),
        expected_peer=PeerIdentity(SERVER_ID, "worker"),
    )
    _, told = refuse_handshake(a, acceptor(swarm))
    assert "does not verify" in told.message


@pytest.mark.parametrize(
    "garbage",
    [b"not a proof", b"\x01\x00\x05\x00\x40" + b"x" * 69],
    ids=["unframed", "certificate-garbage"],
)
def test_proof_without_a_certificate_is_refused(swarm: Swarm, garbage: bytes) -> None:
    a = PeerConnection(
        Side.INITIATOR,
        make_proof=lambda _nonce: garbage,
        expected_peer=PeerIdentity(SERVER_ID, "worker"),
    )
    _, told = refuse_handshake(a, acceptor(swarm))
    assert told.message.startswith("authentication refused")
    assert "proof" in told.message or "certificate" in told.message


def test_checker_crash_refuses_instead_of_raising(swarm: Swarm) -> None:
    def broken(_data: bytes, _nonce: bytes) -> PeerIdentity:
        raise KeyError("boom")

    a = initiator(swarm)
    b = PeerConnection(Side.ACCEPTOR, check_proof=broken, new_nonce=auth.new_nonce)
    failure, _ = refuse_handshake(a, b)
    assert "boom" in failure.message


# ---------------------------------------------------------------- malformed bytes

UNKNOWN_FRAME_TYPE = wire.HEADER.pack(0, wire.VERSION, 99)


def test_malformed_bytes_close_the_connection(swarm: Swarm) -> None:
    b = acceptor(swarm)
    events = b.receive_data(UNKNOWN_FRAME_TYPE)
    assert len(events) == 1
    failure = events[0]
    assert isinstance(failure, ConnectionFailed)
    assert failure.code is ErrorCode.MALFORMED and not failure.by_peer
    assert failure.message.startswith("malformed frame")
    assert b.state is State.CLOSED
    [error] = frames_in(b.data_to_send())
    assert isinstance(error, wire.Error) and error.code is ErrorCode.MALFORMED

    # Nothing further is processed or answered.
    assert b.receive_data(wire.encode(wire.Hello())) == []
    assert b.receive_data(UNKNOWN_FRAME_TYPE) == []
    assert b.data_to_send() == b""
    assert b.state is State.CLOSED


def test_malformed_bytes_after_authentication_drop_the_frames_around_them(swarm: Swarm) -> None:
    a, b = connected(swarm)
    a.send(open_frame("s1"))
    assert pump(a, b)[1] == [PeerFrame(open_frame("s1"))]
    # A good frame in the same chunk as garbage is not trusted either.
    events = b.receive_data(wire.encode(step_frame("s1")) + UNKNOWN_FRAME_TYPE)
    assert [type(e) for e in events] == [ConnectionFailed]
    assert b.state is State.CLOSED
    assert b.receive_data(wire.encode(step_frame("s1", 1))) == []
    # After READY an Error is an ordinary frame for the initiator: it is passed up.
    [told] = a.receive_data(b.data_to_send())
    assert isinstance(told, PeerFrame) and isinstance(told.frame, wire.Error)
    assert told.frame.session == "" and told.frame.code is ErrorCode.MALFORMED


def test_oversize_frame_is_refused_from_its_length_prefix(swarm: Swarm) -> None:
    b = PeerConnection(
        Side.ACCEPTOR,
        check_proof=proof_checker(swarm.ca, swarm.server_hash),
        new_nonce=auth.new_nonce,
        limits=wire.Limits(max_frame_bytes=1024),
    )
    [failure] = b.receive_data((1 << 20).to_bytes(4, "big"))
    assert isinstance(failure, ConnectionFailed) and failure.code is ErrorCode.TOO_LARGE
    assert b.state is State.CLOSED


# ---------------------------------------------------------------- after authentication


def test_ping_is_answered_with_pong_both_ways(swarm: Swarm) -> None:
    a, b = connected(swarm)
    a.send(wire.Ping(7))
    b_events = b.receive_data(a.data_to_send())
    assert b_events == []  # answered by the protocol, not passed up
    assert frames_in(pong := b.data_to_send()) == [wire.Pong(7)]
    assert a.receive_data(pong) == [PeerFrame(wire.Pong(7))]

    b.send(wire.Ping(2**64 - 1))
    assert a.receive_data(b.data_to_send()) == []
    assert b.receive_data(a.data_to_send()) == [PeerFrame(wire.Pong(2**64 - 1))]


def test_frames_flow_both_ways_once_ready(swarm: Swarm) -> None:
    a, b = connected(swarm)
    tokens = wire.Tokens("s1", 0, (5,), (), 0, False, ())
    a.send(open_frame("s1"))
    a.send(step_frame("s1"))
    b.send(tokens)
    a_events, b_events = pump(a, b)
    assert b_events == [PeerFrame(open_frame("s1")), PeerFrame(step_frame("s1"))]
    assert a_events == [PeerFrame(tokens)]


def test_step_and_close_need_a_session_opened_on_this_connection(swarm: Swarm) -> None:
    a, b = connected(swarm)
    a.send(open_frame("mine"))
    a.send(step_frame("theirs"))
    a.send(wire.Close("theirs", "bye"))
    a.send(step_frame("mine", 1))
    a_events, b_events = pump(a, b)

    assert b_events[0] == PeerFrame(open_frame("mine"))
    rejections = b_events[1:3]
    for rejected in rejections:
        assert isinstance(rejected, SessionRejected)
        assert rejected.session == "theirs" and rejected.code is ErrorCode.NOT_OWNER
    # The owned session carries on after its neighbour's violations.
    assert b_events[3] == PeerFrame(step_frame("mine", 1))
    assert len(b_events) == 4
    assert b.owned_sessions == {"mine"}
    assert b.state is State.READY

    # The initiator is told, per session, with an Error frame.
    errors = [e.frame for e in a_events if isinstance(e, PeerFrame)]
    assert len(errors) == 2 == len(a_events)
    for error in errors:
        assert isinstance(error, wire.Error)
        assert error.session == "theirs" and error.code is ErrorCode.NOT_OWNER
    assert a.state is State.READY


def test_sessions_are_owned_per_connection(swarm: Swarm) -> None:
    a1, b1 = connected(swarm)
    a2, b2 = connected(swarm)
    a1.send(open_frame("s1"))
    pump(a1, b1)
    # The other connection to the same acceptor node cannot drive s1.
    a2.send(step_frame("s1"))
    _, b2_events = pump(a2, b2)
    [rejected] = b2_events
    assert isinstance(rejected, SessionRejected) and rejected.code is ErrorCode.NOT_OWNER
    a1.send(step_frame("s1"))
    assert pump(a1, b1)[1] == [PeerFrame(step_frame("s1"))]


def test_duplicate_open_is_rejected(swarm: Swarm) -> None:
    a, b = connected(swarm)
    a.send(open_frame("s1"))
    a.send(open_frame("s1"))
    a_events, b_events = pump(a, b)
    assert b_events[0] == PeerFrame(open_frame("s1"))
    rejected = b_events[1]
    assert isinstance(rejected, SessionRejected)
    assert rejected.session == "s1" and rejected.code is ErrorCode.NOT_OWNER
    assert "already open" in rejected.message
    assert len(b_events) == 2
    [told] = a_events
    assert isinstance(told, PeerFrame) and isinstance(told.frame, wire.Error)
    assert told.frame.session == "s1" and told.frame.code is ErrorCode.NOT_OWNER
    assert b.owned_sessions == {"s1"}


def test_close_releases_ownership(swarm: Swarm) -> None:
    a, b = connected(swarm)
    a.send(open_frame("s1"))
    a.send(wire.Close("s1", "done"))
    a.send(step_frame("s1"))
    _, b_events = pump(a, b)
    assert b_events[:2] == [
        PeerFrame(open_frame("s1")),
        PeerFrame(wire.Close("s1", "done")),
    ]
    rejected = b_events[2]
    assert isinstance(rejected, SessionRejected) and rejected.code is ErrorCode.NOT_OWNER
    assert not b.owned_sessions

    # Closed sessions can be opened again on the same connection.
    a.send(open_frame("s1"))
    a.send(step_frame("s1", 1))
    assert pump(a, b)[1] == [PeerFrame(open_frame("s1")), PeerFrame(step_frame("s1", 1))]


def test_release_forgets_a_session(swarm: Swarm) -> None:
    a, b = connected(swarm)
    a.send(open_frame("s1"))
    pump(a, b)
    b.release("s1")
    b.release("never-opened")  # harmless
    a.send(step_frame("s1"))
    [rejected] = pump(a, b)[1]
    assert isinstance(rejected, SessionRejected) and rejected.session == "s1"


def test_initiator_does_not_police_sessions(swarm: Swarm) -> None:
    # Tokens and errors flow back to the initiator for sessions it opened elsewhere.
    a, b = connected(swarm)
    b.send(step_frame("elsewhere"))
    b.send(wire.Close("elsewhere", "x"))
    a_events, _ = pump(a, b)
    assert a_events == [
        PeerFrame(step_frame("elsewhere")),
        PeerFrame(wire.Close("elsewhere", "x")),
    ]


# ---------------------------------------------------------------- send() before READY


def test_send_before_ready_raises(swarm: Swarm) -> None:
    a, b = initiator(swarm), acceptor(swarm)
    with pytest.raises(RuntimeError, match="SEND_HELLO"):
        a.send(wire.Ping(1))
    with pytest.raises(RuntimeError, match="AWAIT_HELLO"):
        b.send(wire.Ping(1))
    a.initiate()
    with pytest.raises(RuntimeError, match="AWAIT_CHALLENGE"):
        a.send(open_frame("s1"))
    b.receive_data(a.data_to_send())
    with pytest.raises(RuntimeError, match="AWAIT_PROOF"):
        b.send(wire.Ping(1))
    a.receive_data(b.data_to_send())
    with pytest.raises(RuntimeError, match="AWAIT_WELCOME"):
        a.send(open_frame("s1"))
    assert frames_in(a.data_to_send())[-1].__class__ is wire.Proof  # nothing else queued


def test_send_after_close_raises(swarm: Swarm) -> None:
    b = acceptor(swarm)
    b.receive_data(UNKNOWN_FRAME_TYPE)
    with pytest.raises(RuntimeError, match="CLOSED"):
        b.send(wire.Ping(1))


def test_an_overloaded_error_carries_its_retry_hint_in_a_version_1_frame() -> None:
    from net.protocol import OverloadHint, overload_hint, overloaded

    err = overloaded("s9", "all 256 sessions in use", OverloadHint(1500, True))
    back = wire.decode(wire.encode(err))  # the frame layout is unchanged: any v1 peer reads it
    assert isinstance(back, wire.Error) and back.code is ErrorCode.OVERLOADED
    hint, text = overload_hint(back.code, back.message)
    assert hint == OverloadHint(1500, True) and text == "all 256 sessions in use"
    # From a peer that sends no hint, or under another code: no hint, message untouched.
    assert overload_hint(ErrorCode.OVERLOADED, "full") == (None, "full")
    assert overload_hint(ErrorCode.STAGE_ERROR, err.message) == (None, err.message)
