"""Authenticated channels over real QUIC on loopback (docs/architecture.md, "Links" and "Trust").

ChannelServer and connect_channel over UDP on 127.0.0.1: frames flow both ways once
both sides are authenticated, and a rogue-CA node, a certless node, a wrong-id node and
a revoked node are refused before the server processes any frame. Only contents,
orders and reasons are asserted, never how fast anything was.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import net.channel as channel_mod
from net import auth, wire
from net.channel import (
    AuthenticationFailed,
    Channel,
    ChannelServer,
    NodeCredentials,
    connect_channel,
)
from net.errors import ErrorCode, NetError
from net.protocol import Event, PeerConnection, PeerFrame, PeerIdentity, Side
from net.quic.links import Addr, LinkError, QuicTuning, connect
from net.wire.tensors import WireDtype, decode_rows, encode_rows

pytestmark = pytest.mark.integration

PATIENCE_S = 10.0
"""How long to wait before calling a test failed; never an expectation of speed."""
CA_NAME = "swarm-ca"
SERVER_ID = "stage1"
CLIENT_ID = "client1"
# Short idle timeouts so a stuck test ends soon; keepalive off keeps the loops quiet.
TUNING = QuicTuning(idle_timeout=PATIENCE_S, keepalive=0)


# ---------------------------------------------------------------- credentials


def certified(ca: auth.CertifiedKey, node_id: str, role: str) -> auth.CertifiedKey:
    key = auth.new_private_key()
    cert = auth.issue_node_certificate(ca, node_id, key.public_key(), role)
    return auth.CertifiedKey(certificate=cert, private_key=key)


def creds(
    ca: auth.CertifiedKey,
    node_id: str,
    role: str,
    *,
    trust: auth.CertifiedKey | None = None,
    revoked: frozenset[int] = frozenset(),
) -> NodeCredentials:
    """A node certified by `ca` that trusts `trust` (default: the same CA)."""
    return NodeCredentials(
        certified=certified(ca, node_id, role),
        ca_certificate_pem=auth.certificate_pem((trust or ca).certificate),
        revoked_serials=revoked,
    )


@dataclass(frozen=True)
class Swarm:
    ca: auth.CertifiedKey
    rogue_ca: auth.CertifiedKey
    server: NodeCredentials
    client: NodeCredentials


@pytest.fixture(scope="module")
def swarm() -> Swarm:
    ca = auth.create_ca(CA_NAME)
    rogue_ca = auth.create_ca(CA_NAME)  # same subject name: only the key differs
    assert rogue_ca.certificate.subject == ca.certificate.subject
    return Swarm(
        ca=ca,
        rogue_ca=rogue_ca,
        server=creds(ca, SERVER_ID, "worker"),
        client=creds(ca, CLIENT_ID, "client"),
    )


# ---------------------------------------------------------------- what the server saw


class RecordingPeerConnection(PeerConnection):
    """Records every event each connection emits, so a test can prove no frame ran."""

    log: list[tuple[Side, Event]]

    def receive_data(self, data: bytes) -> list[Event]:
        events = super().receive_data(data)
        self.log.extend((self.role, ev) for ev in events)
        return events


@pytest.fixture
def protocol_events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Side, Event]]]:
    log: list[tuple[Side, Event]] = []
    recording = type("Recording", (RecordingPeerConnection,), {"log": log})
    monkeypatch.setattr(channel_mod, "PeerConnection", recording)
    yield log


def frames_processed_by_server(log: list[tuple[Side, Event]]) -> list[wire.Frame]:
    return [ev.frame for role, ev in log if role is Side.ACCEPTOR and isinstance(ev, PeerFrame)]


@dataclass
class Server:
    """A ChannelServer whose callbacks only record what reached the application."""

    creds: NodeCredentials
    allowed_roles: tuple[str, ...] = ("worker", "client", "coordinator")
    channels: list[Channel] = field(default_factory=list)
    frames: asyncio.Queue[tuple[Channel, wire.Frame]] = field(default_factory=asyncio.Queue)
    closes: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    address: Addr = ("", 0)
    server: ChannelServer | None = None

    def on_channel(self, ch: Channel) -> None:
        self.channels.append(ch)
        ch.on_frame = lambda c, f: self.frames.put_nowait((c, f))
        ch.on_close = lambda _c, reason: self.closes.put_nowait(reason)

    async def __aenter__(self) -> Server:
        self.server = ChannelServer(self.creds, self.on_channel, TUNING, self.allowed_roles)
        self.address = await self.server.listen("127.0.0.1", 0)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await asyncio.sleep(0)

    def assert_untouched(self) -> None:
        assert self.channels == [], "on_channel ran for a refused peer"
        assert self.frames.empty(), "on_frame ran for a refused peer"


def run(coro_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coro_fn(), PATIENCE_S * 2)

    asyncio.run(bounded())


async def within(fut: asyncio.Future[Any] | Coroutine[Any, Any, Any]) -> Any:
    return await asyncio.wait_for(fut, PATIENCE_S)


async def next_frame(queue: asyncio.Queue[tuple[Channel, wire.Frame]]) -> wire.Frame:
    item: tuple[Channel, wire.Frame] = await within(queue.get())
    return item[1]


def open_frame(session: str) -> wire.Open:
    return wire.Open(
        session=session,
        model="tiny",
        wire_dtype=WireDtype.F32,
        sampling=wire.SamplingSpec(temperature=0.7, top_k=40, seed=3),
        reply_to=CLIENT_ID,
        max_tokens=16,
        prompt_len=4,
    )


async def dial_with_proof(
    address: Addr,
    client: NodeCredentials,
    make_proof: Callable[[bytes], bytes],
    pipelined: tuple[wire.Frame, ...] = (),
) -> Channel:
    """connect_channel with our own proof, and frames written right behind the proof.

    The frames leave in the same packet as the PROOF (a misbehaving client does not wait
    for WELCOME), so the server sees them in the same read as the proof it refuses.
    """
    link = await connect(address, client.tls(), SERVER_ID, tuning=TUNING, timeout=PATIENCE_S)
    loop = asyncio.get_running_loop()

    def proof_then_frames(nonce: bytes) -> bytes:
        for frame in pipelined:
            # Runs before the link's coalesced transmit, right after the PROOF is queued.
            loop.call_soon(link.send, wire.encode(frame))
        return make_proof(nonce)

    conn = PeerConnection(
        Side.INITIATOR,
        make_proof=proof_then_frames,
        expected_peer=PeerIdentity(SERVER_ID, "worker"),
    )
    ch = Channel(link, conn)
    ch.start()
    return ch


async def refused(ch: Channel) -> str:
    with pytest.raises(AuthenticationFailed) as info:
        await within(asyncio.shield(ch.authenticated))
    await within(ch.closed)
    return str(info.value)


# ---------------------------------------------------------------- (a) frames both ways


def test_authenticated_peers_exchange_frames_both_ways(
    swarm: Swarm, protocol_events: list[tuple[Side, Event]]
) -> None:
    async def main() -> None:
        async with Server(swarm.server) as srv:
            client = await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
            assert client.peer == PeerIdentity(SERVER_ID, "worker")
            received: asyncio.Queue[tuple[Channel, wire.Frame]] = asyncio.Queue()
            client.on_frame = lambda c, f: received.put_nowait((c, f))

            client.send(open_frame("s1"))
            assert await next_frame(srv.frames) == open_frame("s1")
            [server_side] = srv.channels
            assert server_side.peer == PeerIdentity(CLIENT_ID, "client")
            assert server_side.conn.owned_sessions == {"s1"}

            tokens = wire.Tokens(
                "s1", 0, (11, 12), (13,), 1, False, (wire.StageTiming(0, 1.5, 0.25, 2.0),)
            )
            error = wire.Error("s1", ErrorCode.STAGE_ERROR, "stage fell over ✗")
            server_side.send(tokens)
            server_side.send(error)
            assert await next_frame(received) == tokens
            assert await next_frame(received) == error

            client.close("done")
            assert await within(srv.closes.get()) == "done"

    run(main)
    assert frames_processed_by_server(protocol_events) == [open_frame("s1")]


def test_large_hidden_state_step_arrives_intact(swarm: Swarm) -> None:
    rows, width = 640, 640  # ~1.6 MB of f32: well over a thousand QUIC packets
    hidden = np.random.default_rng(7).standard_normal((rows, width), dtype=np.float32)
    step = wire.Step(
        session="s1",
        step_id=1,
        start=12,
        tokens=tuple(range(rows)),
        hidden=encode_rows(hidden, WireDtype.F32),
        n_rows=rows,
        width=width,
        wire_dtype=WireDtype.F32,
        sent_at_ns=123,
    )

    async def main() -> None:
        async with Server(swarm.server) as srv:
            client = await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
            client.send(open_frame("s1"))
            client.send(step)
            client.send(wire.Ping(5))  # answered by the protocol, never reaches on_frame
            client.send(wire.Close("s1", "bye"))
            got = [await next_frame(srv.frames) for _ in range(3)]
            assert got[0] == open_frame("s1")
            assert got[2] == wire.Close("s1", "bye")
            arrived = got[1]
            assert isinstance(arrived, wire.Step) and arrived.hidden is not None
            assert arrived == step
            back = decode_rows(arrived.hidden, WireDtype.F32, rows, width)
            np.testing.assert_array_equal(back, hidden)
            assert srv.frames.empty()
            client.close()

    run(main)


# ---------------------------------------------------------------- (b) rogue CA client


def test_client_from_a_rogue_ca_is_refused_before_any_frame(
    swarm: Swarm, protocol_events: list[tuple[Side, Event]]
) -> None:
    # Certified by a CA of the same name, and it trusts the real CA, so TLS succeeds.
    rogue = creds(swarm.rogue_ca, CLIENT_ID, "client", trust=swarm.ca)

    async def main() -> None:
        async with Server(swarm.server) as srv:
            with pytest.raises(AuthenticationFailed) as info:
                await connect_channel(srv.address, rogue, SERVER_ID, TUNING, PATIENCE_S)
            message = str(info.value)
            # Told by the server's ERROR frame, which leaves before its CONNECTION_CLOSE.
            assert message.startswith("peer refused us: authentication refused")
            assert "does not verify with the swarm CA key" in message
            await asyncio.sleep(0)
            srv.assert_untouched()

    run(main)
    assert frames_processed_by_server(protocol_events) == []


def test_frames_pipelined_behind_a_rogue_proof_are_never_processed(
    swarm: Swarm, protocol_events: list[tuple[Side, Event]]
) -> None:
    rogue = creds(swarm.rogue_ca, CLIENT_ID, "client", trust=swarm.ca)
    server_hash = swarm.server.certificate_sha256

    def make(nonce: bytes) -> bytes:
        return auth.make_client_proof(rogue.certified, nonce, server_hash).encode()

    async def main() -> None:
        async with Server(swarm.server) as srv:
            ch = await dial_with_proof(
                srv.address, rogue, make, pipelined=(open_frame("s1"), wire.Ping(1))
            )
            message = await refused(ch)
            assert "does not verify with the swarm CA key" in message
            srv.assert_untouched()

    run(main)
    assert frames_processed_by_server(protocol_events) == []


# ---------------------------------------------------------------- (c) no valid proof


def _stolen_certificate_proof(swarm: Swarm) -> Callable[[bytes], bytes]:
    """A certless node presents someone else's (public) certificate, signed with its own key."""
    victim = swarm.client.certified.certificate
    own_key = auth.new_private_key()

    def make(nonce: bytes) -> bytes:
        message = auth.PROOF_LABEL + nonce + swarm.server.certificate_sha256
        proof = auth.ClientProof(auth.certificate_pem(victim), own_key.sign(message))
        return proof.encode()

    return make


@pytest.mark.parametrize("kind", ["garbage", "stolen-certificate"])
def test_client_without_a_valid_proof_is_refused(
    swarm: Swarm, protocol_events: list[tuple[Side, Event]], kind: str
) -> None:
    def garbage(_nonce: bytes) -> bytes:
        return b"no certificate here, just bytes"

    make = garbage if kind == "garbage" else _stolen_certificate_proof(swarm)

    async def main() -> None:
        async with Server(swarm.server) as srv:
            ch = await dial_with_proof(srv.address, swarm.client, make, (open_frame("s1"),))
            message = await refused(ch)
            assert "authentication refused" in message
            if kind == "garbage":
                assert "proof" in message
            else:
                assert "does not verify" in message
            srv.assert_untouched()

    run(main)
    assert frames_processed_by_server(protocol_events) == []


# ---------------------------------------------------------------- (d) wrong node id


def test_server_with_another_node_id_is_refused_by_tls(
    swarm: Swarm, protocol_events: list[tuple[Side, Event]]
) -> None:
    stage2 = creds(swarm.ca, "stage2", "worker")

    async def main() -> None:
        async with Server(stage2) as srv:
            with pytest.raises(NetError) as info:
                await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
            assert isinstance(info.value, LinkError)
            srv.assert_untouched()

    run(main)
    assert frames_processed_by_server(protocol_events) == []


# ---------------------------------------------------------------- (e) revoked client


def test_revoked_client_is_refused(swarm: Swarm, protocol_events: list[tuple[Side, Event]]) -> None:
    serial = swarm.client.certified.certificate.serial_number
    revoking = NodeCredentials(
        certified=swarm.server.certified,
        ca_certificate_pem=swarm.server.ca_certificate_pem,
        revoked_serials=frozenset({serial}),
    )

    async def main() -> None:
        async with Server(revoking) as srv:
            with pytest.raises(AuthenticationFailed) as info:
                await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
            assert "revoked" in str(info.value)
            srv.assert_untouched()
            # Another, unrevoked client still gets in.
            other = creds(swarm.ca, "client2", "client")
            ch = await connect_channel(srv.address, other, SERVER_ID, TUNING, PATIENCE_S)
            ch.send(open_frame("s2"))
            assert await next_frame(srv.frames) == open_frame("s2")
            ch.close()

    run(main)
    assert frames_processed_by_server(protocol_events) == [open_frame("s2")]


def test_a_link_open_when_its_certificate_is_revoked_is_closed(swarm: Swarm) -> None:
    serial = swarm.client.certified.certificate.serial_number

    async def main() -> None:
        async with Server(swarm.server) as srv:
            assert srv.server is not None
            bad = await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
            other = creds(swarm.ca, "client3", "client")
            good = await connect_channel(srv.address, other, SERVER_ID, TUNING, PATIENCE_S)
            bad.send(open_frame("s1"))
            good.send(open_frame("s3"))
            assert {await next_frame(srv.frames), await next_frame(srv.frames)} == {
                open_frame("s1"),
                open_frame("s3"),
            }
            # The coordinator publishes the revocation: the next refresh closes the link.
            srv.server.revoked_serials = frozenset({serial})
            assert "revoked" in await within(srv.closes.get())
            await within(bad.closed)
            assert srv.closes.empty()  # the other client's link is untouched, and works
            good.send(wire.Close("s3", "done"))
            assert await next_frame(srv.frames) == wire.Close("s3", "done")
            with pytest.raises(AuthenticationFailed, match="revoked"):
                await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
            good.close()

    run(main)


def test_a_link_open_when_its_certificate_expires_is_closed_at_the_next_refresh(
    swarm: Swarm,
) -> None:
    async def main() -> None:
        async with Server(swarm.server) as srv:
            assert srv.server is not None
            ch = await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
            ch.send(open_frame("s4"))
            assert await next_frame(srv.frames) == open_frame("s4")
            not_after = swarm.client.certified.certificate.not_valid_after_utc
            assert srv.server.refresh_trust(frozenset(), now=not_after) == 0  # still valid
            assert srv.closes.empty()
            later = not_after + dt.timedelta(seconds=1)
            assert srv.server.refresh_trust(frozenset(), now=later) == 1
            assert "expired" in await within(srv.closes.get())
            await within(ch.closed)

    run(main)


def test_role_not_allowed_here_is_refused(
    swarm: Swarm, protocol_events: list[tuple[Side, Event]]
) -> None:
    async def main() -> None:
        async with Server(swarm.server, allowed_roles=("worker",)) as srv:
            with pytest.raises(AuthenticationFailed) as info:
                await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
            assert "role" in str(info.value)
            srv.assert_untouched()

    run(main)
    assert frames_processed_by_server(protocol_events) == []


# ---------------------------------------------------------------- (f) rogue CA server


def test_server_from_a_rogue_ca_is_refused_by_tls(
    swarm: Swarm, protocol_events: list[tuple[Side, Event]]
) -> None:
    # Claims the right node id, and trusts the real CA, but its certificate is rogue.
    impostor = creds(swarm.rogue_ca, SERVER_ID, "worker", trust=swarm.ca)

    async def main() -> None:
        async with Server(impostor) as srv:
            with pytest.raises(NetError) as info:
                await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
            assert isinstance(info.value, LinkError)
            srv.assert_untouched()

    run(main)
    # The client never sent a proof, let alone a frame.
    assert [ev for _role, ev in protocol_events] == []


# ---------------------------------------------------------------- (g) closing


def test_closing_the_server_closes_the_client_channel(swarm: Swarm) -> None:
    async def main() -> None:
        srv = Server(swarm.server)
        await srv.__aenter__()
        client = await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
        closes: list[str] = []
        client.on_close = lambda _c, reason: closes.append(reason)
        client.send(open_frame("s1"))
        await next_frame(srv.frames)  # the server side is fully up

        await srv.__aexit__()
        reason = await within(client.closed)
        assert "shutting down" in reason
        assert closes == [reason]

    run(main)


def test_frames_sent_just_before_close_still_arrive(swarm: Swarm) -> None:
    async def main() -> None:
        async with Server(swarm.server) as srv:
            client = await connect_channel(srv.address, swarm.client, SERVER_ID, TUNING, PATIENCE_S)
            received: list[wire.Frame] = []
            client.on_frame = lambda _c, f: received.append(f)
            client.send(open_frame("s1"))
            await next_frame(srv.frames)
            [server_side] = srv.channels
            # A refusal and its close in the same loop turn: the refusal must not be lost.
            server_side.send(wire.Error("s1", ErrorCode.OVERLOADED, "too busy"))
            server_side.close("refusing")
            assert await within(client.closed) == "refusing"
            assert received == [wire.Error("s1", ErrorCode.OVERLOADED, "too busy")]

    run(main)
