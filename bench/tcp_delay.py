"""The delay proxy's lanes over TCP: llama.cpp's RPC runs on TCP, Sangama's links on UDP.

For bench/rpc_compare.py, so both sides of the comparison wait on the same mechanism:
each byte chunk read from one side is held in a `app.lab.wan.proxy.TimedRelease` lane (the
FIFO, schedule and early-wake timer the UDP proxy uses: `delay_ms` one way, never reordered)
and written to the other side when due. One connection upstream per accepted one;
closing one side half-closes the other once the bytes before the close are through.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from app.lab.wan.proxy import TimedRelease

Address = tuple[str, int]
Lane = tuple[int, str]


class TcpDelayProxy:
    """One listening port forwarding to `target`; all its connections share one schedule."""

    def __init__(self, target: Address, delay_ms: float) -> None:
        self.target = target
        self.delay_s = delay_ms / 1e3
        self._server: asyncio.Server | None = None
        self.port = 0
        # The UDP proxy's timing: one timer, woken early by its measured lateness, the
        # last fraction of a millisecond waited out, never sent before due.
        self._release: TimedRelease[Lane] = TimedRelease(self._deliver)
        self._writers: dict[Lane, asyncio.StreamWriter] = {}
        self._ended: dict[Lane, asyncio.Future[None]] = {}
        self._next_id = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        self._release.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        # Python 3.11's start_server asks a cancelled handler task for its exception,
        # which raises and prints a traceback per connection; a handler cancelled at
        # teardown (delayed_links' end) returns instead.
        with contextlib.suppress(asyncio.CancelledError):
            await self._forward(down_r, down_w)

    async def _forward(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*self.target)
        self._next_id += 1
        up, down = (self._next_id, "up"), (self._next_id, "down")
        self._writers[up], self._writers[down] = up_w, down_w
        await asyncio.gather(self._pump(down_r, up), self._pump(up_r, down), return_exceptions=True)
        for lane in (up, down):  # both directions ended: close the sockets
            self._writers.pop(lane).close()

    async def _pump(self, reader: asyncio.StreamReader, lane: Lane) -> None:
        loop = asyncio.get_running_loop()
        self._ended[lane] = loop.create_future()
        try:
            while data := await reader.read(1 << 16):
                self._hold(lane, data)
        finally:
            self._hold(lane, b"")  # the end marker, due after every byte before it
        await self._ended.pop(lane)

    def _hold(self, lane: Lane, data: bytes) -> None:
        self._release.push(lane, data, self.delay_s)

    def _deliver(self, lane: Lane, data: bytes, _late_s: float) -> None:
        writer = self._writers.get(lane)
        if writer is None:
            return
        if data:
            writer.write(data)
            return
        with contextlib.suppress(OSError):  # a half-close, as TCP does
            writer.write_eof()
        ended = self._ended.get(lane)
        if ended is not None and not ended.done():
            ended.set_result(None)


@contextlib.contextmanager
def delayed_links(targets: list[Address], delay_ms: float) -> Iterator[list[Address]]:
    """Proxies to every target, run on their own loop in a thread; yields their addresses."""
    loop = asyncio.new_event_loop()
    proxies = [TcpDelayProxy(t, delay_ms) for t in targets]
    thread = threading.Thread(target=loop.run_forever, name="tcp-delay", daemon=True)
    thread.start()
    try:
        for p in proxies:
            asyncio.run_coroutine_threadsafe(p.start(), loop).result(10)
        yield [("127.0.0.1", p.port) for p in proxies]
    finally:
        for p in proxies:
            asyncio.run_coroutine_threadsafe(p.close(), loop).result(10)
        asyncio.run_coroutine_threadsafe(_cancel_rest(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


async def _cancel_rest() -> None:
    """Connections still open when the bench is done: end their tasks before the loop."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
