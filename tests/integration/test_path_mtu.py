"""Path MTU discovery on real QUIC links (net.quic.path_mtu): a loopback link carries a Gemma
hidden state in one datagram, and a path that drops large datagrams keeps working at the
size it does carry, never losing a frame. About 2 s each."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from net import auth, wire
from net.channel import Channel, ChannelServer, NodeCredentials, connect_channel
from net.quic.links import QuicTuning, UdpPath
from net.quic.path_mtu import BASE_DATAGRAM_SIZE
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.integration

FRAME_ROWS = bytes(range(256)) * 10  # 2560 bytes: 640 f32, one Gemma-270M hidden state


class _ShrunkPath(UdpPath):
    """A UDP socket whose path drops every datagram over `limit` bytes (a router with a
    small MTU that sends no ICMP); records what it sent and what it dropped."""

    limit = 1 << 20
    sent: list[int]
    dropped: list[int]

    def send(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) > self.limit:
            self.dropped.append(len(data))
            return
        self.sent.append(len(data))
        super().send(data, addr)


def _creds(ca: auth.CertifiedKey, node_id: str) -> NodeCredentials:
    key = auth.new_private_key()
    cert = auth.issue_node_certificate(ca, node_id, key.public_key(), "worker")
    return NodeCredentials(auth.CertifiedKey(cert, key), auth.certificate_pem(ca.certificate))


async def _carry(library: str, limit: int, frames: int) -> dict[str, Any]:
    """`frames` STEP frames over a link whose client end drops datagrams over `limit`."""
    ca = auth.create_ca("test-ca")
    got: list[wire.Step] = []
    server_sizes: list[int] = []
    tuning = QuicTuning(library=library, keepalive=0)

    def ready(ch: Channel) -> None:
        link: Any = ch.link
        original = link._path.send

        def send(data: bytes, addr: tuple[str, int]) -> None:
            server_sizes.append(len(data))
            original(data, addr)

        link._path.send = send
        ch.on_frame = lambda _c, f: got.append(f) if isinstance(f, wire.Step) else None

    server = ChannelServer(_creds(ca, "stage1"), ready, tuning)
    addr = await server.listen("127.0.0.1", 0)
    paths: list[_ShrunkPath] = []

    async def shrunk(receive: Any, error: Any) -> _ShrunkPath:
        path = cast(_ShrunkPath, await _ShrunkPath.connect(addr, receive, error))
        path.limit, path.sent, path.dropped = limit, [], []
        paths.append(path)
        return path

    try:
        ch = await connect_channel(
            addr, _creds(ca, "stage0"), "stage1", tuning, timeout=5, path_factory=shrunk
        )
        ch.send(wire.Open("s", "m", WireDtype.F32, wire.SamplingSpec(), "client1", 1, 1))
        await asyncio.sleep(1.0)  # the probes are sent and acknowledged, or lost
        path = paths[0]
        before = len(path.sent)
        for i in range(frames):
            ch.send(wire.Step("s", i, i, (), FRAME_ROWS, 1, 640, WireDtype.F32))
            for _ in range(500):
                if len(got) > i:
                    break
                await asyncio.sleep(0.01)
        steady = path.sent[before:]
        ch.close("done")
    finally:
        server.close()
    return {
        "got": got,
        "steady": steady,
        "dropped": path.dropped,
        "server_max": max(server_sizes),
        "frame_bytes": len(wire.encode(got[0])) if got else 0,
    }


def test_a_loopback_link_carries_a_hidden_state_in_one_datagram() -> None:
    r = asyncio.run(_carry("qh3", 1 << 20, frames=20))
    assert [f.step_id for f in r["got"]] == list(range(20))
    assert all(f.hidden == FRAME_ROWS for f in r["got"])
    data = [n for n in r["steady"] if n > 100]  # ACK-only packets are ~35 bytes
    assert len(data) == 20  # one datagram per frame, not three
    assert min(data) > r["frame_bytes"]
    assert r["server_max"] <= BASE_DATAGRAM_SIZE  # the server end never probes


@pytest.mark.parametrize("limit", [1200, 1300])
def test_a_path_that_drops_large_datagrams_keeps_every_frame(limit: int) -> None:
    r = asyncio.run(_carry("qh3", limit, frames=20))
    assert [f.step_id for f in r["got"]] == list(range(20))
    assert all(f.hidden == FRAME_ROWS for f in r["got"])
    assert r["dropped"]  # larger sizes were probed, and the path lost them
    assert max(r["steady"]) <= limit  # only a size the path carried was adopted
    # Each frame still needs at least three datagrams at these sizes.
    assert sum(1 for n in r["steady"] if n > 100) >= 3 * 20 * BASE_DATAGRAM_SIZE // 1300


def test_aioquic_links_do_not_probe() -> None:
    r = asyncio.run(_carry("aioquic", 1 << 20, frames=5))
    assert [f.step_id for f in r["got"]] == list(range(5))
    assert max(r["steady"]) <= BASE_DATAGRAM_SIZE
    assert r["dropped"] == []
