"""app.lab.wan.proxy against a real UDP echo server on loopback.

Only counts, contents and order are asserted, never how fast anything was; the one
timing check is a lower bound (RTT >= 2 x delay), which a slow machine cannot break.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

import pytest

from app.lab.wan.errors import ProxyError
from app.lab.wan.proxy import DelayProxy, ProxyStats, parse_address

pytestmark = pytest.mark.integration

LOCAL = ("127.0.0.1", 0)
PATIENCE_S = 20.0
"""How long to wait before calling a test failed; never an expectation of speed."""
ROOT = Path(__file__).resolve().parents[2]


class Echo(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.received += 1
        assert self.transport is not None
        self.transport.sendto(data, addr)


class Client(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.replies.put_nowait(data)


async def echo_server() -> tuple[asyncio.DatagramTransport, Echo]:
    loop = asyncio.get_running_loop()
    return await loop.create_datagram_endpoint(Echo, local_addr=LOCAL)


async def client_of(port: int) -> tuple[asyncio.DatagramTransport, Client]:
    loop = asyncio.get_running_loop()
    return await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", port))


def port_of(transport: asyncio.DatagramTransport) -> int:
    port: int = transport.get_extra_info("sockname")[1]
    return port


async def replies(client: Client, n: int) -> list[bytes]:
    return [await asyncio.wait_for(client.replies.get(), PATIENCE_S) for _ in range(n)]


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.005)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 4 * PATIENCE_S))


def packets(n: int) -> list[bytes]:
    """Numbered payloads of varied sizes, so a swap or a mix-up shows."""
    return [i.to_bytes(4, "big") + bytes([i % 251]) * (i % 37) for i in range(n)]


def test_replies_arrive_and_counters_match() -> None:
    async def body() -> None:
        echo_transport, echo = await echo_server()
        async with DelayProxy(LOCAL, ("127.0.0.1", port_of(echo_transport)), 2.0) as proxy:
            transport, client = await client_of(proxy.bound_port)
            sent = packets(40)
            for p in sent:
                transport.sendto(p)
            got = await replies(client, len(sent))
            assert sorted(got) == sorted(sent)
            size = sum(map(len, sent))
            assert proxy.stats == ProxyStats(40, size, 40, size, 0, 0, flows=1, errors=0)
            assert echo.received == 40
            # Every forwarded datagram's lateness is recorded, and none left early.
            assert proxy.late_up.packets == 40 and proxy.late_down.packets == 40
            assert proxy.late_up.max_ms >= 0 and proxy.late_down.mean_ms >= 0
            transport.close()
        echo_transport.close()

    run(body)


def test_jitter_never_reorders_a_flow() -> None:
    async def body() -> None:
        echo_transport, _ = await echo_server()
        target = ("127.0.0.1", port_of(echo_transport))
        # Jitter larger than the delay: without the monotonic rule most packets would swap.
        async with DelayProxy(LOCAL, target, 3.0, jitter_ms=3.0, seed=7) as proxy:
            transport, client = await client_of(proxy.bound_port)
            sent = packets(200)
            for i, p in enumerate(sent):
                transport.sendto(p)
                if i % 20 == 0:
                    await asyncio.sleep(0.001)  # spread sends over time so jitter matters
            assert await replies(client, len(sent)) == sent
            transport.close()
        echo_transport.close()

    run(body)


def test_loss_one_drops_everything() -> None:
    async def body() -> None:
        echo_transport, echo = await echo_server()
        target = ("127.0.0.1", port_of(echo_transport))
        async with DelayProxy(LOCAL, target, 1.0, loss=1.0) as proxy:
            transport, client = await client_of(proxy.bound_port)
            for p in packets(25):
                transport.sendto(p)
            # Drops happen on arrival, so once all 25 are counted nothing is in flight.
            await until(lambda: proxy.stats.up_dropped == 25)
            assert proxy.stats.up_packets == 0 and proxy.stats.down_packets == 0
            assert echo.received == 0 and client.replies.empty()
            transport.close()
        echo_transport.close()

    run(body)


def test_partial_loss_is_accounted_for() -> None:
    async def body() -> None:
        echo_transport, echo = await echo_server()
        target = ("127.0.0.1", port_of(echo_transport))
        async with DelayProxy(LOCAL, target, 1.0, loss=0.3, seed=1) as proxy:
            transport, client = await client_of(proxy.bound_port)
            for p in packets(100):
                transport.sendto(p)

            def settled() -> bool:
                s = proxy.stats
                return (
                    s.up_packets + s.up_dropped == 100
                    and s.down_packets + s.down_dropped == echo.received == s.up_packets
                    and client.replies.qsize() == s.down_packets
                )

            await until(settled)
            s = proxy.stats
            assert 0 < s.up_dropped < 100 and s.down_dropped > 0  # 30 % of 100 and of ~70
            transport.close()
        echo_transport.close()

    run(body)


def test_two_clients_get_their_own_replies() -> None:
    async def body() -> None:
        echo_transport, _ = await echo_server()
        target = ("127.0.0.1", port_of(echo_transport))
        async with DelayProxy(LOCAL, target, 2.0, jitter_ms=1.0) as proxy:
            a_transport, a = await client_of(proxy.bound_port)
            b_transport, b = await client_of(proxy.bound_port)
            a_sent = [b"a" + p for p in packets(30)]
            b_sent = [b"b" + p for p in packets(30)]
            for pa, pb in zip(a_sent, b_sent, strict=True):
                a_transport.sendto(pa)
                b_transport.sendto(pb)
            assert await replies(a, 30) == a_sent
            assert await replies(b, 30) == b_sent
            assert a.replies.empty() and b.replies.empty()
            assert proxy.stats.flows == 2
            a_transport.close()
            b_transport.close()
        echo_transport.close()

    run(body)


def test_round_trip_takes_at_least_twice_the_delay() -> None:
    delay_ms = 25.0

    async def body() -> None:
        echo_transport, _ = await echo_server()
        target = ("127.0.0.1", port_of(echo_transport))
        async with DelayProxy(LOCAL, target, delay_ms) as proxy:
            transport, client = await client_of(proxy.bound_port)
            for i in range(3):
                t0 = time.monotonic()
                transport.sendto(bytes([i]))
                assert await replies(client, 1) == [bytes([i])]
                # 1 ms of slack only for clock granularity; slowness only makes it longer.
                assert time.monotonic() - t0 >= 2 * delay_ms / 1000 - 0.001
            transport.close()
        echo_transport.close()

    run(body)


def test_lifecycle_and_argument_checks() -> None:
    async def body() -> None:
        proxy = DelayProxy(LOCAL, ("127.0.0.1", 9), 1.0)
        with pytest.raises(ProxyError):
            _ = proxy.bound_port
        await proxy.start()
        with pytest.raises(ProxyError):
            await proxy.start()
        await proxy.close()

    run(body)
    for bad in ({"delay_ms": -1.0}, {"jitter_ms": float("nan")}, {"loss": 1.5}):
        args: dict[str, Any] = {"delay_ms": 1.0, **bad}
        with pytest.raises(ValueError):
            DelayProxy(LOCAL, LOCAL, **args)
    assert parse_address("127.0.0.1:9000") == ("127.0.0.1", 9000)
    assert parse_address("[::1]:53") == ("::1", 53)


def test_the_command_line_forwards_and_reports() -> None:
    async def body() -> None:
        echo_transport, _ = await echo_server()
        target = f"127.0.0.1:{port_of(echo_transport)}"
        argv = ["-m", "app.lab.wan.proxy", "--listen", "127.0.0.1:0", "--target", target,
                "--delay-ms", "5", "--jitter-ms", "1", "--seed", "3"]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), PATIENCE_S)).decode()
            assert line.startswith("listening on 127.0.0.1:"), line
            port = int(line.split()[2].rsplit(":", 1)[1])
            transport, client = await client_of(port)
            sent = packets(10)
            for p in sent:
                transport.sendto(p)
            assert await replies(client, 10) == sent
            transport.close()
            proc.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(proc.communicate(), PATIENCE_S)
            assert proc.returncode == 0, err.decode()
            assert "stats: up 10 pkts" in out.decode()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            echo_transport.close()

    run(body)
