"""Both QUIC libraries behind net.quic.links (aioquic, qh3) carry authenticated channels."""

from __future__ import annotations

import asyncio

import pytest

from net import auth, wire
from net.channel import (
    AuthenticationFailed,
    Channel,
    ChannelServer,
    NodeCredentials,
    connect_channel,
)
from net.errors import NetError
from net.quic.links import QuicTuning
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.integration

LIBRARIES = ["aioquic", "qh3"]


def _creds(
    ca: auth.CertifiedKey, node_id: str, role: str, trust: auth.CertifiedKey
) -> NodeCredentials:
    key = auth.new_private_key()
    cert = auth.issue_node_certificate(ca, node_id, key.public_key(), role)
    return NodeCredentials(auth.CertifiedKey(cert, key), auth.certificate_pem(trust.certificate))


async def _exchange(
    server_lib: str, client_lib: str, client: NodeCredentials, server: NodeCredentials
) -> list[wire.Frame]:
    got: list[wire.Frame] = []
    replies: list[wire.Frame] = []

    def ready(ch: Channel) -> None:
        def on_frame(c: Channel, f: wire.Frame) -> None:
            got.append(f)
            c.send(wire.Close("s", "echo"))

        ch.on_frame = on_frame

    srv = ChannelServer(server, ready, QuicTuning(library=server_lib, keepalive=0))
    addr = await srv.listen("127.0.0.1", 0)
    try:
        ch = await connect_channel(
            addr, client, "stage1", QuicTuning(library=client_lib, keepalive=0), timeout=5
        )
        ch.on_frame = lambda _c, f: replies.append(f)
        big = bytes(range(256)) * 40  # 10 KiB of hidden rows: several packets
        ch.send(wire.Open("s", "m", WireDtype.F32, wire.SamplingSpec(), "client1", 1, 4))
        ch.send(wire.Step("s", 0, 0, (), big, 4, 640, WireDtype.F32))
        for _ in range(200):
            if len(replies) >= 2:
                break
            await asyncio.sleep(0.02)
        ch.close()
        assert replies[:2] == [wire.Close("s", "echo")] * 2
        return got
    finally:
        srv.close()


@pytest.mark.parametrize("server_lib", LIBRARIES)
@pytest.mark.parametrize("client_lib", LIBRARIES)
def test_each_library_pair_authenticates_and_carries_frames(
    server_lib: str, client_lib: str
) -> None:
    ca = auth.create_ca("swarm")
    server = _creds(ca, "stage1", "worker", ca)
    client = _creds(ca, "client1", "client", ca)
    got = asyncio.run(_exchange(server_lib, client_lib, client, server))
    assert [type(f) for f in got] == [wire.Open, wire.Step]
    step = got[1]
    assert isinstance(step, wire.Step) and step.hidden == bytes(range(256)) * 40


@pytest.mark.parametrize("library", LIBRARIES)
def test_each_library_refuses_a_rogue_client_and_a_rogue_server(library: str) -> None:
    ca, rogue = auth.create_ca("swarm"), auth.create_ca("swarm")
    server = _creds(ca, "stage1", "worker", ca)
    with pytest.raises(AuthenticationFailed, match="refused"):
        asyncio.run(_exchange(library, library, _creds(rogue, "client1", "client", ca), server))
    with pytest.raises(NetError):  # TLS: the server's certificate does not chain to our CA
        asyncio.run(
            _exchange(
                library,
                library,
                _creds(ca, "client1", "client", ca),
                _creds(rogue, "stage1", "worker", ca),
            )
        )


def test_unknown_library_is_refused() -> None:
    with pytest.raises(ValueError, match="QUIC library"):
        QuicTuning(library="quiche")
