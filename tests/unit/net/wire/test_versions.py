"""Peers of different releases in one swarm: net.wire.versions' table and negotiation, frames
of the previous wire version (protocol 1) as fixtures, and a peer of protocol 1 pumped
in memory against one of this release (net.protocol with `protocol=1` refuses the tails
of protocol 2 as the older release's reader did: "trailing bytes in body")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from net import auth, wire
from net.errors import ErrorCode, FrameError
from net.protocol import (
    Authenticated,
    ConnectionFailed,
    Event,
    PeerConnection,
    PeerFrame,
    PeerIdentity,
    Side,
    State,
)
from net.wire import versions
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

SERVER_ID, CLIENT_ID = "stage1", "client1"

# Bytes a protocol 1 release sends, written out by hand: header >IBB (length, VERSION 1,
# type) then the body. HELLO is empty; WELCOME is the node id alone.
V1_HELLO = bytes.fromhex("000000000108")
V1_WELCOME = bytes.fromhex("00000009010b") + b"\x00\x07client1"
V1_PING = bytes.fromhex("000000080106") + (7).to_bytes(8, "big")


def tokens(**tail: object) -> wire.Tokens:
    base = wire.Tokens("s1", 3, (11, 12), (), 0, False, ())
    return wire.Tokens(**{**base.__dict__, **tail})


def open_frame(**tail: object) -> wire.Open:
    base = wire.Open("s1", "tiny", WireDtype.F32, wire.SamplingSpec(), CLIENT_ID, 8, 4)
    return wire.Open(**{**base.__dict__, **tail})


RING = wire.Loop(SERVER_ID, "10.0.0.2:7000", "stage3", guesses=2)


# ---------------------------------------------------------------- the table, pure


def test_every_tail_names_a_field_with_a_default() -> None:
    for tail in versions.TAILS:
        assert 2 <= tail.since <= wire.PROTOCOL_VERSION
        assert tail.field in {f.name for f in dataclasses.fields(tail.frame)}


@pytest.mark.parametrize(
    ("frame", "need"),
    [
        (tokens(), 1),
        (tokens(looped=True), 2),
        (tokens(guessed=3), 2),
        (open_frame(), 1),
        (open_frame(loop=RING), 2),
        (open_frame(resumes="s0", resume_held=4, resume_digest=b"d" * 32), 2),
        (wire.Hello(), 1),
        (wire.Hello(2, "0.2.0"), 2),
        (wire.Ping(1), 1),
    ],
)
def test_needed_is_the_newest_set_tail(frame: wire.Frame, need: int) -> None:
    assert versions.needed(frame) == need


def test_downgrade_drops_only_what_the_older_protocol_lacks() -> None:
    ring = open_frame(loop=RING, resumes="s0", resume_held=4, resume_digest=b"d" * 32)
    assert versions.downgrade(ring, 1) == open_frame()
    assert versions.downgrade(ring, 2) is ring
    step = wire.Step("s1", 1, 0, (5, 6), None, 2, 0, WireDtype.F32, one_by_one=True)
    assert versions.downgrade(step, 1) == wire.Step("s1", 1, 0, (5, 6), None, 2, 0, WireDtype.F32)
    assert versions.downgrade(wire.Welcome("n", 2, "0.2.0"), 1) == wire.Welcome("n")


def test_negotiate_takes_the_lower_and_refuses_the_too_old() -> None:
    assert versions.negotiate(2, 1, oldest=1) == 1
    assert versions.negotiate(2, 7, oldest=1) == 2
    with pytest.raises(versions.PeerTooOld) as caught:
        versions.negotiate(2, 1, oldest=2)
    assert (caught.value.theirs, caught.value.oldest) == (1, 2)
    assert "update Sangama" in str(caught.value)


def test_release_order() -> None:
    key = versions.release_key
    assert key("0.1.0") < key("0.2.0") < key("0.10.0") < key("1.0")
    assert key("0.2") == key("0.2.0") == key("0.2.0rc1") == key(" 0.2.0+local ")
    for bad in ("", "v0.2", "latest", "0." + "1" * 80):
        with pytest.raises(versions.BadRelease):
            key(bad)


# ---------------------------------------------------------------- bytes of both versions


def test_protocol_1_fixtures_decode_as_protocol_1() -> None:
    assert wire.decode(V1_HELLO) == wire.Hello(1, "")
    assert wire.decode(V1_WELCOME) == wire.Welcome(CLIENT_ID, 1, "")
    assert wire.decode(V1_PING, version=1) == wire.Ping(7)
    # What protocol 1 writes is still byte for byte what it wrote.
    assert wire.encode(wire.Hello()) == V1_HELLO
    assert wire.encode(wire.Welcome(CLIENT_ID, 2, "0.2.0"), version=1) == V1_WELCOME


def test_version_tail_round_trips_and_has_one_encoding() -> None:
    hello = wire.Hello(2, "0.2.0")
    assert wire.decode(wire.encode(hello)) == hello
    body = b"\x00\x01" + b"\x00\x00"  # a tail saying protocol 1: protocol 1 sends none
    with pytest.raises(FrameError, match="version tail saying protocol 1"):
        wire.decode(len(body).to_bytes(4, "big") + b"\x01\x08" + body)
    with pytest.raises(FrameError, match="release without a protocol"):
        wire.encode(wire.Hello(1, "0.2.0"))


def test_tails_never_reach_a_protocol_1_reader() -> None:
    ring = tokens(looped=True, guessed=2)
    old_reader = wire.FrameDecoder(version=1)
    with pytest.raises(FrameError, match="trailing bytes"):
        wire.FrameDecoder(version=1).feed(wire.encode(ring))
    sent = wire.encode(ring, version=1)
    assert sent == wire.encode(tokens())
    assert old_reader.feed(sent) == [tokens()]
    # This release reads every tail whatever was negotiated: lenient in, strict out.
    assert wire.decode(wire.encode(ring)) == ring


# ---------------------------------------------------------------- pumped in memory


@pytest.fixture(scope="module")
def keys() -> tuple[auth.CertifiedKey, auth.CertifiedKey, auth.CertifiedKey]:
    ca = auth.create_ca("swarm-ca")

    def node(node_id: str, role: str) -> auth.CertifiedKey:
        key = auth.new_private_key()
        cert = auth.issue_node_certificate(ca, node_id, key.public_key(), role)
        return auth.CertifiedKey(certificate=cert, private_key=key)

    return ca, node(SERVER_ID, "worker"), node(CLIENT_ID, "client")


Pair = Callable[..., tuple[PeerConnection, PeerConnection]]


@pytest.fixture
def pair(keys: tuple[auth.CertifiedKey, auth.CertifiedKey, auth.CertifiedKey]) -> Pair:
    ca, server, client = keys
    server_hash = auth.certificate_digest(server.certificate)

    def make(
        a_protocol: int, b_protocol: int, b_oldest: int = 1
    ) -> tuple[PeerConnection, PeerConnection]:
        def prove(nonce: bytes) -> bytes:
            return auth.make_client_proof(client, nonce, server_hash).encode()

        def check(data: bytes, nonce: bytes) -> PeerIdentity:
            proof = auth.ClientProof.decode(data)
            ident = auth.verify_client_proof(proof, ca.certificate, nonce, server_hash)
            return PeerIdentity(ident.node_id, ident.role)

        a = PeerConnection(
            Side.INITIATOR,
            make_proof=prove,
            expected_peer=PeerIdentity(SERVER_ID, "worker"),
            protocol=a_protocol,
            release="0.2.0" if a_protocol > 1 else "",
        )
        b = PeerConnection(
            Side.ACCEPTOR,
            check_proof=check,
            new_nonce=auth.new_nonce,
            protocol=b_protocol,
            oldest_protocol=b_oldest,
            release="0.2.0" if b_protocol > 1 else "",
        )
        return a, b

    return make


def pump(a: PeerConnection, b: PeerConnection) -> tuple[list[Event], list[Event]]:
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


def test_same_release_negotiates_this_protocol_and_keeps_tails(pair: Pair) -> None:
    a, b = pair(wire.PROTOCOL_VERSION, wire.PROTOCOL_VERSION)
    a.initiate()
    a_events, b_events = pump(a, b)
    assert a_events == [Authenticated(PeerIdentity(SERVER_ID, "worker"), 2, "0.2.0")]
    assert b_events == [Authenticated(PeerIdentity(CLIENT_ID, "client"), 2, "0.2.0")]
    b.send(tokens(looped=True, guessed=2))
    assert pump(a, b)[0] == [PeerFrame(tokens(looped=True, guessed=2))]


def test_an_older_initiator_works_with_this_acceptor_without_tails(pair: Pair) -> None:
    old, new = pair(1, wire.PROTOCOL_VERSION)
    old.initiate()
    old_events, new_events = pump(old, new)
    # The older peer got a WELCOME it reads (no tail) and both speak protocol 1.
    assert old_events == [Authenticated(PeerIdentity(SERVER_ID, "worker"), 1, "")]
    assert new_events == [Authenticated(PeerIdentity(CLIENT_ID, "client"), 1, "")]
    assert (old.state, new.state, new.negotiated) == (State.READY, State.READY, 1)
    old.send(open_frame())
    new.send(tokens(looped=True, guessed=2))  # the ring's tail is left out for it
    old_events, new_events = pump(old, new)
    assert new_events == [PeerFrame(open_frame())]
    assert old_events == [PeerFrame(tokens())]
    assert not old.closed and not new.closed


def test_this_initiator_is_refused_by_an_older_acceptor(pair: Pair) -> None:
    """Why the coordinator admits only releases that announce their protocol: a release
    of protocol 1 cannot take a connection from this one (its reader refuses HELLO's
    version tail), so the two cannot share a chain."""
    new, old = pair(wire.PROTOCOL_VERSION, 1)
    new.initiate()
    new_events, old_events = pump(new, old)
    [failed] = old_events
    assert isinstance(failed, ConnectionFailed) and failed.code is ErrorCode.MALFORMED
    assert "trailing bytes" in failed.message
    [told] = new_events
    assert isinstance(told, ConnectionFailed) and told.by_peer


def test_an_acceptor_refuses_a_peer_older_than_it_admits(pair: Pair) -> None:
    old, new = pair(1, wire.PROTOCOL_VERSION, b_oldest=2)
    old.initiate()
    old_events, new_events = pump(old, new)
    [refused] = new_events
    assert isinstance(refused, ConnectionFailed)
    assert refused.code is ErrorCode.UNSUPPORTED_VERSION and not refused.by_peer
    assert "needs protocol 2 or later: update Sangama" in refused.message
    [told] = old_events
    assert isinstance(told, ConnectionFailed) and told.by_peer
    assert told.code is ErrorCode.UNSUPPORTED_VERSION and "update Sangama" in told.message
    assert new.peer is None and new.closed


def test_an_initiator_refuses_an_acceptor_older_than_it_admits(pair: Pair) -> None:
    a, b = pair(wire.PROTOCOL_VERSION, wire.PROTOCOL_VERSION)
    a.oldest_protocol = 3  # as a later release would: this acceptor is then too old
    a.initiate()
    a_events, _ = pump(a, b)
    [refused] = a_events
    assert isinstance(refused, ConnectionFailed)
    assert refused.code is ErrorCode.UNSUPPORTED_VERSION
    assert "Sangama 0.2.0 speaks protocol 2" in refused.message
    assert a.closed and a.peer is None
