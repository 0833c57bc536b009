"""app.lab.wan.process: delay proxies in child processes, against a real UDP echo
server on loopback. Counts, contents and order are asserted; the one timing check is a
lower bound (RTT >= 2 x delay), which a slow machine cannot break."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from app.lab.wan.errors import ProxyError
from app.lab.wan.process import ProxyPool, ProxyProcess
from tests.integration.test_delay_proxy import client_of, echo_server, port_of, replies, run

pytestmark = pytest.mark.integration


def test_a_pool_forwards_through_each_process_and_reports_in_order() -> None:
    async def scenario() -> None:
        echo_t, echo = await echo_server()
        pool = ProxyPool(processes=2)
        await pool.start()
        try:
            target = ("127.0.0.1", port_of(echo_t))
            # Three proxies over two processes: the third goes to the emptier one.
            addrs = [await pool.add(target, d) for d in (0.0, 15.0, 0.0)]
            assert [p.count for p in pool.processes] == [2, 1]
            assert len(set(pool.pids)) == 2 and os.getpid() not in pool.pids
            sent = {0: 3, 1: 2, 2: 1}
            for i, (_, port) in enumerate(addrs):
                t, c = await client_of(port)
                started = time.perf_counter()
                for k in range(sent[i]):
                    t.sendto(f"{i}:{k}".encode())
                got = await replies(c, sent[i])
                rtt = time.perf_counter() - started
                t.close()
                assert got == [f"{i}:{k}".encode() for k in range(sent[i])]  # order kept
                if i == 1:
                    assert rtt >= 2 * 0.015, "the delay was not applied both ways"
            reports = await pool.reports()
            assert [r.stats.up_packets for r in reports] == [3, 2, 1]
            assert [r.stats.down_packets for r in reports] == [3, 2, 1]
            assert [r.late_up.packets for r in reports] == [3, 2, 1]
            assert all(r.stats.flows == 1 for r in reports)
            assert echo.received == 6
        finally:
            await pool.close()
            echo_t.close()
        for proc in pool.processes:
            assert proc._proc is not None and proc._proc.returncode == 0

    run(scenario)


def test_loss_set_from_the_parent_drops_and_bad_requests_are_refused() -> None:
    async def scenario() -> None:
        echo_t, echo = await echo_server()
        pool = ProxyPool()
        await pool.start()
        try:
            _, port = await pool.add(("127.0.0.1", port_of(echo_t)), 0.0)
            await pool.set_loss(0, 1.0)
            t, c = await client_of(port)
            for _ in range(4):
                t.sendto(b"lost")
            await asyncio.sleep(0.2)
            assert (await pool.reports())[0].stats.up_dropped == 4
            assert echo.received == 0
            await pool.set_loss(0, 0.0)
            t.sendto(b"kept")
            assert await replies(c, 1) == [b"kept"]
            t.close()
            with pytest.raises(ProxyError, match="loss must be in"):
                await pool.set_loss(0, 2.0)
            with pytest.raises(ProxyError, match="IndexError"):
                await pool.processes[0].set_loss(5, 0.0)
            # A refused request leaves the process serving.
            assert len(await pool.reports()) == 1
        finally:
            await pool.close()
            echo_t.close()

    run(scenario)


def test_the_child_stops_when_its_stdin_closes() -> None:
    async def scenario() -> None:
        proc = ProxyProcess()
        await proc.start()
        assert await proc.close() == 0
        with pytest.raises(ProxyError, match="not running"):
            await proc.reports()
        with pytest.raises(ValueError):
            ProxyPool(processes=0)

    run(scenario)
