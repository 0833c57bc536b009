"""The upload cap on a real QUIC link: what the capped side sends is held back once its
burst is spent, arrives whole and in order, and the bytes it was charged are the bytes
that left. Counts only: transmissions deferred, bytes charged; never how long it took."""

from __future__ import annotations

import asyncio

import pytest

from net import auth, wire
from net.channel import Channel, ChannelServer, NodeCredentials, connect_channel
from net.quic.links import QuicTuning
from net.rate import AsyncThrottle
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.integration


def _creds(ca: auth.CertifiedKey, node_id: str, role: str) -> NodeCredentials:
    key = auth.new_private_key()
    cert = auth.issue_node_certificate(ca, node_id, key.public_key(), role)
    return NodeCredentials(auth.CertifiedKey(cert, key), auth.certificate_pem(ca.certificate))


@pytest.mark.parametrize("library", ["aioquic", "qh3"])
def test_a_capped_sender_defers_then_delivers_everything(library: str) -> None:
    ca = auth.create_ca("swarm")
    steps = 12
    rows = bytes(range(256)) * 160  # 40 KiB of hidden rows per step: 480 KiB in all

    async def run() -> tuple[list[wire.Frame], AsyncThrottle]:
        got: list[wire.Frame] = []
        done = asyncio.Event()

        def ready(ch: Channel) -> None:
            def on_frame(_c: Channel, f: wire.Frame) -> None:
                got.append(f)
                if len(got) == steps + 1:
                    done.set()

            ch.on_frame = on_frame

        srv = ChannelServer(_creds(ca, "stage1", "worker"), ready, QuicTuning(library=library))
        addr = await srv.listen("127.0.0.1", 0)
        throttle = AsyncThrottle(200_000)  # 200 kB/s, a 64 KiB burst: most must wait
        tuning = QuicTuning(library=library, send_throttle=throttle)
        try:
            ch = await connect_channel(addr, _creds(ca, "w0", "worker"), "stage1", tuning, 5)
            ch.send(wire.Open("s", "m", WireDtype.F32, wire.SamplingSpec(), "w0", 1, 4))
            for i in range(steps):
                ch.send(wire.Step("s", i, i * 16, (), rows, 16, 640, WireDtype.F32))
            await asyncio.wait_for(done.wait(), 60)
            ch.close()
        finally:
            srv.close()
        return got, throttle

    got, throttle = asyncio.run(run())
    assert [type(f) for f in got] == [wire.Open] + [wire.Step] * steps
    received = [f for f in got if isinstance(f, wire.Step)]
    assert [f.step_id for f in received] == list(range(steps))
    assert all(f.hidden == rows for f in received)
    assert throttle.deferred > 0  # the cap held the sender back
    payload = steps * len(rows)
    # Every datagram went through the cap: the payload plus QUIC's and the frames' headers.
    assert payload < throttle.sent_bytes < payload * 1.2
