"""The delay proxy's lanes over TCP: llama.cpp's RPC runs on TCP, Sangama's links on UDP.

For bench/rpc_compare.py, so both sides of the comparison wait on the same mechanism:
each byte chunk read from one side is queued in a `net.delay_proxy` lane (the FIFO and
timer the UDP proxy uses: `delay_ms` one way, never reordered) and written to the other
side when due. One connection upstream per accepted connection; closing one side closes
the other's sending side (a half-close) once its queue has drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from net.delay_proxy import _Lane

Address = tuple[str, int]


class TcpDelayProxy:
    def __init__(self, target: Address, delay_ms: float) -> None:
        self.target = target
        self.delay_s = delay_ms / 1e3
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*self.target)
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            self._pump(loop, down_r, up_w), self._pump(loop, up_r, down_w), return_exceptions=True
        )
        for w in (up_w, down_w):  # both directions ended: close the sockets
            w.close()

    async def _pump(
        self,
        loop: asyncio.AbstractEventLoop,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        def send(data: bytes) -> bool:
            if data:
                writer.write(data)
            else:  # the end marker, due after every byte before it: half-close, as TCP does
                with contextlib.suppress(OSError):
                    writer.write_eof()
                done.set_result(None)
            return True

        done: asyncio.Future[None] = loop.create_future()
        lane = _Lane(loop, send)
        try:
            while data := await reader.read(1 << 16):
                lane.push(data, self.delay_s)
        finally:
            lane.push(b"", self.delay_s)
        await done


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
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
