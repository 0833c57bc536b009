"""net.peer_limits and what net.protocol does with it: before WELCOME a peer's frames are
capped at what the handshake needs; after it, at the general caps, even for frames
that arrived in the same bytes as the WELCOME. Real proofs, pumped in memory."""

from __future__ import annotations

import numpy as np
import pytest

from net import auth, wire
from net.errors import ErrorCode
from net.peer_limits import (
    LinkLimits,
    admit_link,
    pre_auth_frame_bytes,
    pre_auth_limits,
)
from net.protocol import (
    Authenticated,
    ConnectionFailed,
    PeerConnection,
    PeerFrame,
    PeerIdentity,
    Side,
    State,
)
from net.wire.tensors import WireDtype, encode_rows

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ca() -> auth.CertifiedKey:
    return auth.create_ca("swarm-ca")


def certified(ca: auth.CertifiedKey, node_id: str, role: str) -> auth.CertifiedKey:
    key = auth.new_private_key()
    cert = auth.issue_node_certificate(ca, node_id, key.public_key(), role)
    return auth.CertifiedKey(certificate=cert, private_key=key)


def pair(ca: auth.CertifiedKey) -> tuple[PeerConnection, PeerConnection]:
    server, client = certified(ca, "stage1", "worker"), certified(ca, "client1", "client")
    server_hash = auth.certificate_digest(server.certificate)

    def check(data: bytes, nonce: bytes) -> PeerIdentity:
        proof = auth.ClientProof.decode(data)
        ident = auth.verify_client_proof(proof, ca.certificate, nonce, server_hash)
        return PeerIdentity(ident.node_id, ident.role)

    initiator = PeerConnection(
        Side.INITIATOR,
        make_proof=lambda n: auth.make_client_proof(client, n, server_hash).encode(),
        expected_peer=PeerIdentity("stage1", "worker"),
    )
    acceptor = PeerConnection(Side.ACCEPTOR, check_proof=check, new_nonce=auth.new_nonce)
    return initiator, acceptor


def big_step() -> wire.Step:
    rows, width = 64, 512  # 128 KiB of rows: far over the handshake's cap
    hidden = np.ones((rows, width), dtype=np.float32)
    return wire.Step(
        session="s1",
        step_id=0,
        start=0,
        tokens=(),
        hidden=encode_rows(hidden, WireDtype.F32),
        n_rows=rows,
        width=width,
        wire_dtype=WireDtype.F32,
    )


def test_the_handshake_cap_holds_the_largest_proof_and_is_far_under_the_general_cap() -> None:
    proof = wire.Proof(b"p" * wire.DEFAULT_LIMITS.max_proof_bytes)
    assert len(wire.encode(proof)) == pre_auth_frame_bytes()
    limits = pre_auth_limits()
    assert wire.decode(wire.encode(proof), limits) == proof
    assert limits.max_frame_bytes * 1000 < wire.DEFAULT_LIMITS.max_frame_bytes
    small = wire.Limits(max_frame_bytes=1024)
    assert pre_auth_limits(small).max_frame_bytes == 1024  # never above the general cap


def test_a_hello_announcing_a_huge_body_is_refused_from_its_length_prefix(
    ca: auth.CertifiedKey,
) -> None:
    _, acceptor = pair(ca)
    # What an outsider announces: a body of the general cap, which it then trickles.
    head = wire.HEADER.pack(wire.DEFAULT_LIMITS.max_frame_bytes - 6, wire.VERSION, 8)
    [failure] = acceptor.receive_data(head[:4])
    assert isinstance(failure, ConnectionFailed) and failure.code is ErrorCode.TOO_LARGE
    assert acceptor.state is State.CLOSED
    assert acceptor.receive_data(bytes(1 << 16)) == []  # nothing more is buffered
    told = wire.FrameDecoder().feed(acceptor.data_to_send())
    assert [type(f) for f in told] == [wire.Error]


def test_frames_right_behind_welcome_are_read_under_the_general_caps(
    ca: auth.CertifiedKey,
) -> None:
    initiator, acceptor = pair(ca)
    initiator.initiate()
    acceptor.receive_data(initiator.data_to_send())  # HELLO -> CHALLENGE
    initiator.receive_data(acceptor.data_to_send())  # CHALLENGE -> PROOF
    [authed] = acceptor.receive_data(initiator.data_to_send())  # PROOF -> WELCOME
    assert isinstance(authed, Authenticated)
    acceptor.send(big_step())  # the acceptor sends at once: one chunk, WELCOME first
    events = initiator.receive_data(acceptor.data_to_send())
    assert [type(e) for e in events] == [Authenticated, PeerFrame]
    assert initiator.state is State.READY
    # And the acceptor takes large frames once the peer has proved itself.
    initiator.send(wire.Open("s1", "m", WireDtype.F32, wire.SamplingSpec(), "client1", 4, 64))
    initiator.send(big_step())
    events = acceptor.receive_data(initiator.data_to_send())
    assert [type(e) for e in events] == [PeerFrame, PeerFrame]


def test_a_large_frame_before_welcome_is_refused(ca: auth.CertifiedKey) -> None:
    initiator, acceptor = pair(ca)
    initiator.initiate()
    acceptor.receive_data(initiator.data_to_send())
    events = acceptor.receive_data(wire.encode(big_step()))
    assert [type(e) for e in events] == [ConnectionFailed]
    assert events[0].code is ErrorCode.TOO_LARGE  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("host_pending", "host_links", "pending", "admitted"),
    [
        (0, 0, 0, True),
        (7, 7, 7, True),
        (8, 8, 8, False),  # one host's unauthenticated links
        (0, 128, 0, False),  # one host's links of any state
        (0, 0, 128, False),  # every host's unauthenticated links
        (3, 100, 127, True),
    ],
)
def test_admit_link_caps_per_host_and_in_all(
    host_pending: int, host_links: int, pending: int, admitted: bool
) -> None:
    refusal = admit_link(LinkLimits(), host_pending, host_links, pending)
    assert (refusal is None) is admitted


def test_link_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        LinkLimits(auth_timeout_s=0)
    with pytest.raises(ValueError):
        LinkLimits(max_pending=0)
