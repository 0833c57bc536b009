"""net.quic.udp: a burst of datagrams is read in one wake-up and ends with one call."""

from __future__ import annotations

import asyncio
import socket

import pytest

from net import event_loop
from net.quic.udp import UdpPath, drain


def test_drain_reads_until_the_socket_would_block() -> None:
    waiting = [b"a", b"b", b"c"]
    got: list[bytes] = []

    def read() -> tuple[bytes, object]:
        if not waiting:
            raise BlockingIOError
        return waiting.pop(0), ("h", 1)

    assert drain(read, lambda d, _a: got.append(d), limit=64) == 3
    assert got == [b"a", b"b", b"c"]


def test_drain_stops_at_its_limit() -> None:
    got: list[bytes] = []
    assert drain(lambda: (b"x", ("h", 1)), lambda d, _a: got.append(d), limit=5) == 5
    assert len(got) == 5


def test_a_burst_is_one_wake_up_and_one_burst_end() -> None:
    async def scenario() -> tuple[list[bytes], int, int, int]:
        got: list[bytes] = []
        ends = 0

        def end() -> None:
            nonlocal ends
            ends += 1

        path = await UdpPath.bind("127.0.0.1", 0, lambda d, _a: got.append(d))
        assert path.reads_bursts  # the selector loop and uvloop both watch sockets
        path.on_burst_end = end
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for i in range(3):  # sent before the loop runs again: one burst
                sender.sendto(bytes([i]) * 1200, path.local_address)
            for _ in range(200):
                await asyncio.sleep(0.01)
                if len(got) == 3:
                    break
        finally:
            sender.close()
            path.close()
        return got, path.wakeups, path.datagrams, ends

    got, wakeups, datagrams, ends = asyncio.run(scenario())
    assert [d[0] for d in got] == [0, 1, 2]
    assert datagrams == 3
    assert wakeups == ends
    assert wakeups == 1  # all three were waiting when the loop looked: one wake-up


def test_a_connected_path_reports_an_unreachable_peer() -> None:
    async def scenario() -> list[Exception]:
        errors: list[Exception] = []
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()  # nothing listens there now
        path = await UdpPath.connect(("127.0.0.1", port), lambda _d, _a: None, errors.append)
        try:
            for _ in range(100):
                path.send(b"hello", ("127.0.0.1", port))
                await asyncio.sleep(0.01)
                if errors:
                    break
        finally:
            path.close()
        return errors

    errors = asyncio.run(scenario())
    assert errors and isinstance(errors[0], ConnectionRefusedError)


def test_the_loop_is_uvloop_on_linux_unless_asked_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uvloop = pytest.importorskip("uvloop", reason="uvloop is a Linux dependency")
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.delenv("SANGAMA_LOOP", raising=False)
    assert event_loop.loop_factory() is uvloop.new_event_loop
    assert event_loop.run(_loop_class()) == "Loop"
    monkeypatch.setenv("SANGAMA_LOOP", "asyncio")
    assert event_loop.loop_factory() is None
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.delenv("SANGAMA_LOOP")
    assert event_loop.loop_factory() is None


async def _loop_class() -> str:
    return type(asyncio.get_running_loop()).__name__
