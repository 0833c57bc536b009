"""Delay proxies in a process of their own, driven over its stdin and stdout.

A benchmark that runs its clients and a chain's 21 `DelayProxy` forwarders in one
event loop measures its own loop as much as the chain: every datagram of every link
waits for the same Python thread that decodes the client's tokens. `ProxyProcess`
starts `python -m app.lab.wan.process`, which hosts any number of proxies in one
loop (uvloop where net.event_loop picks it), and `ProxyPool` spreads proxies over a
few such processes. The parent asks for a proxy (`add`), reads every proxy's counters
and lateness (`reports`), and may set a proxy's loss; the child answers one JSON line
per request, in order. EOF on the child's stdin (the parent closed it, or died) stops
the child, so it never outlives the process that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from app.lab.wan.errors import ProxyError
from app.lab.wan.proxy import Address, DelayProxy, Lateness, ProxyStats

READY = "delay-proxies ready"
"""The child's first line: its loop runs and it reads requests."""


@dataclass(frozen=True)
class ProxyReport:
    """One proxy's counters and lateness, as the child last saw them."""

    stats: ProxyStats
    late_up: Lateness
    late_down: Lateness


def _report(proxy: DelayProxy) -> dict[str, Any]:
    return {
        "stats": asdict(proxy.stats),
        "late_up": asdict(proxy.late_up),
        "late_down": asdict(proxy.late_down),
    }


def _parse_report(raw: dict[str, Any]) -> ProxyReport:
    return ProxyReport(
        ProxyStats(**raw["stats"]), Lateness(**raw["late_up"]), Lateness(**raw["late_down"])
    )


# --- the child --------------------------------------------------------------------------


class _Host:
    """The child's proxies and what each request does to them (one request at a time)."""

    def __init__(self) -> None:
        self.proxies: list[DelayProxy] = []

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "add":
            host, port = request["target"]
            proxy = DelayProxy(
                (str(request.get("listen_host", "127.0.0.1")), 0),
                (str(host), int(port)),
                float(request["delay_ms"]),
                float(request.get("jitter_ms", 0.0)),
                float(request.get("loss", 0.0)),
                request.get("seed"),
            )
            await proxy.start()
            self.proxies.append(proxy)
            return {"ok": True, "index": len(self.proxies) - 1, "port": proxy.bound_port}
        if op == "reports":
            return {"ok": True, "reports": [_report(p) for p in self.proxies]}
        if op == "set_loss":
            proxy = self.proxies[int(request["index"])]
            loss = float(request["loss"])
            if not 0.0 <= loss <= 1.0:
                raise ValueError(f"loss must be in [0, 1], got {loss}")
            proxy.loss = loss
            return {"ok": True}
        raise ValueError(f"unknown request {op!r}")

    async def close(self) -> None:
        for proxy in self.proxies:
            await proxy.close()


async def _child_main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    host = _Host()
    out = sys.stdout
    out.write(READY + "\n")
    out.flush()
    try:
        while line := await reader.readline():
            try:
                reply = await host.handle(json.loads(line))
            except (ValueError, KeyError, TypeError, IndexError, OSError, ProxyError) as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()
    finally:
        await host.close()


def main() -> int:
    from net.event_loop import run

    with contextlib.suppress(KeyboardInterrupt):
        run(_child_main())
    return 0


# --- the parent -------------------------------------------------------------------------


class ProxyProcess:
    """One child process of delay proxies; its methods are coroutines of the parent's loop."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self.count = 0
        """Proxies this process hosts."""

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise ProxyError("the proxy process is not started")
        return self._proc.pid

    async def start(self, timeout: float = 30.0) -> None:
        if self._proc is not None:
            raise ProxyError("a ProxyProcess starts once")
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app.lab.wan.process",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), timeout)
        except TimeoutError:
            await self.close()
            raise ProxyError(f"the proxy process did not start within {timeout:.0f} s") from None
        if line.decode(errors="replace").strip() != READY:
            await self.close()
            raise ProxyError(f"the proxy process did not start: {line!r}")

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            raise ProxyError("the proxy process is not running")
        assert proc.stdin is not None and proc.stdout is not None
        async with self._lock:  # one request in flight: replies come back in order
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            await proc.stdin.drain()
            line = await proc.stdout.readline()
        if not line:
            raise ProxyError(f"the proxy process ended (exit code {proc.returncode})")
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            raise ProxyError(f"the proxy process refused {request['op']}: {reply.get('error')}")
        return reply

    async def add(self, target: Address, delay_ms: float, jitter_ms: float = 0.0,
                  loss: float = 0.0, seed: int | None = None) -> tuple[int, Address]:  # fmt: skip
        """A new proxy to `target`: (its index in this process, the address to send to)."""
        reply = await self._ask(
            {
                "op": "add",
                "target": list(target),
                "delay_ms": delay_ms,
                "jitter_ms": jitter_ms,
                "loss": loss,
                "seed": seed,
            }
        )
        self.count += 1
        return int(reply["index"]), ("127.0.0.1", int(reply["port"]))

    async def reports(self) -> list[ProxyReport]:
        reply = await self._ask({"op": "reports"})
        return [_parse_report(r) for r in reply["reports"]]

    async def set_loss(self, index: int, loss: float) -> None:
        await self._ask({"op": "set_loss", "index": index, "loss": loss})

    async def close(self, timeout: float = 10.0) -> int | None:
        """Close stdin (the child closes its proxies and exits), kill it if it lingers."""
        proc = self._proc
        if proc is None:
            return None
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        try:
            return await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
            return await proc.wait()


class ProxyPool:
    """Delay proxies spread over `processes` child processes, in the order they were added."""

    def __init__(self, processes: int = 1) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.processes = [ProxyProcess() for _ in range(processes)]
        self._where: list[tuple[ProxyProcess, int]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def __len__(self) -> int:
        return len(self._where)

    async def start(self) -> None:
        try:
            await asyncio.gather(*(p.start() for p in self.processes))
        except BaseException:
            await self.close()
            raise

    async def add(self, target: Address, delay_ms: float) -> Address:
        """A proxy to `target` in the process that holds the fewest; its address."""
        proc = min(self.processes, key=lambda p: p.count)
        index, address = await proc.add(target, delay_ms)
        self._where.append((proc, index))
        return address

    async def reports(self) -> list[ProxyReport]:
        """Every proxy's report, in the order they were added."""
        per = {id(p): await p.reports() for p in self.processes}
        return [per[id(proc)][index] for proc, index in self._where]

    async def set_loss(self, proxy: int, loss: float) -> None:
        proc, index = self._where[proxy]
        await proc.set_loss(index, loss)

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self.processes), return_exceptions=True)


def reports_of(proxies: Sequence[DelayProxy]) -> list[ProxyReport]:
    """The same reports for proxies in this process."""
    return [ProxyReport(p.stats, p.late_up, p.late_down) for p in proxies]


if __name__ == "__main__":
    raise SystemExit(main())
