"""Userspace WAN emulation: a UDP forwarder that delays, jitters and drops datagrams.

These machines lack netem, so tests and benchmarks put this between QUIC peers. Each
client address gets its own upstream socket, so the target's replies find their way
back; both directions get `delay_ms` one way; jitter never reorders the packets of one
flow and direction (netem without reordering); `loss` drops packets as they arrive.
All lanes share one time-ordered schedule and one timer, woken early by the loop's
measured lateness (app.lab.wan.schedule), so a datagram leaves at its due time, not up to
a millisecond after; `late_up`/`late_down` say how late they really left.

    python -m app.lab.wan.proxy --listen 127.0.0.1:9000 --target 127.0.0.1:9001 --delay-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import random
import signal
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from app.lab.wan.errors import ProxyError
from app.lab.wan.schedule import LaneSchedule, WakeLead

log = logging.getLogger(__name__)

L = TypeVar("L", bound=Hashable)

Address = tuple[str, int]


@dataclass
class _Counters:
    up_packets: int = 0
    up_bytes: int = 0
    down_packets: int = 0
    down_bytes: int = 0
    up_dropped: int = 0
    down_dropped: int = 0
    errors: int = 0


@dataclass(frozen=True)
class ProxyStats:
    """Counters since start. `*_packets`/`*_bytes` count datagrams forwarded after their
    delay; `*_dropped` count emulated loss. Up is client -> target, down the reverse."""

    up_packets: int = 0
    up_bytes: int = 0
    down_packets: int = 0
    down_bytes: int = 0
    up_dropped: int = 0
    down_dropped: int = 0
    flows: int = 0
    errors: int = 0
    """Socket errors reported by the OS (e.g. ICMP port unreachable from the target)."""


class TimedRelease(Generic[L]):
    """The asyncio shell of a `LaneSchedule`: one timer for every lane, asked for early by
    the loop's measured lateness (`WakeLead`), the last fraction of a millisecond waited
    out here, so `deliver(lane, data, late_s)` runs at the due time, never before."""

    def __init__(self, deliver: Callable[[L, bytes, float], None]) -> None:
        self.schedule: LaneSchedule[L] = LaneSchedule()
        self._deliver = deliver
        self._lead = WakeLead()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def push(self, lane: L, data: bytes, delay_s: float) -> None:
        now = asyncio.get_running_loop().time()
        self.schedule.push(lane, data, now, delay_s)
        self._arm(now)

    def release(self, lane: L) -> None:
        """A held lane may send again (see `LaneSchedule.hold`)."""
        self.schedule.release(lane)
        self._arm(asyncio.get_running_loop().time())

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, now: float) -> None:
        due = self.schedule.next_due()
        if due is None:
            return
        if due <= now:
            self._release_due(now)
            return
        wake = due - self._lead.lead
        if self._timer is not None:
            if self._timer_at <= wake:
                return  # already armed early enough
            self._timer.cancel()
        self._timer_at = wake
        self._timer = asyncio.get_running_loop().call_at(wake, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        woke = loop.time()
        self._lead.observe(self._timer_at, woke)
        due = self.schedule.next_due()
        if due is not None and 0 < due - woke <= self._lead.cap_s:
            # Woken early on purpose: wait out the fraction of a millisecond that the
            # loop's timer cannot resolve, yielding the CPU meanwhile.
            while loop.time() < due:
                time.sleep(0)
        self._release_due(loop.time())

    def _release_due(self, now: float) -> None:
        for lane, data, due in self.schedule.pop_due(now):
            self._deliver(lane, data, now - due)
        self._arm(now)


class _Flow:
    """One client address: its own upstream socket and a lane each way."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.upstream: asyncio.DatagramTransport | None = None
        self.up = (client, "up")
        self.down = (client, "down")


@dataclass(frozen=True)
class Lateness:
    """How long after their due time datagrams left (the proxy's own error, on top of
    the delay asked for); never negative, nothing leaves early."""

    packets: int = 0
    total_ms: float = 0.0
    max_ms: float = 0.0

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.packets if self.packets else 0.0

    def add(self, late_s: float) -> Lateness:
        ms = max(late_s, 0.0) * 1e3
        return Lateness(self.packets + 1, self.total_ms + ms, max(self.max_ms, ms))


class _ClientSide(asyncio.DatagramProtocol):
    def __init__(self, proxy: DelayProxy) -> None:
        self.proxy = proxy

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.proxy._from_client(data, addr)

    def error_received(self, exc: Exception) -> None:
        self.proxy._error(exc)


class _TargetSide(asyncio.DatagramProtocol):
    def __init__(self, proxy: DelayProxy, flow: _Flow) -> None:
        self.proxy = proxy
        self.flow = flow

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.proxy._from_target(self.flow, data)

    def error_received(self, exc: Exception) -> None:
        self.proxy._error(exc)


class DelayProxy:
    """Forwards UDP between clients at `listen` and one `target`, with WAN-like delay."""

    def __init__(
        self,
        listen: Address,
        target: Address,
        delay_ms: float,
        jitter_ms: float = 0.0,
        loss: float = 0.0,
        seed: int | None = None,
    ) -> None:
        if not (math.isfinite(delay_ms) and delay_ms >= 0):
            raise ValueError(f"delay_ms must be finite and >= 0, got {delay_ms}")
        if not (math.isfinite(jitter_ms) and jitter_ms >= 0):
            raise ValueError(f"jitter_ms must be finite and >= 0, got {jitter_ms}")
        if not 0.0 <= loss <= 1.0:
            raise ValueError(f"loss must be in [0, 1], got {loss}")
        self.listen = listen
        self.target = target
        self.delay_ms = delay_ms
        self.jitter_ms = jitter_ms
        self.loss = loss
        # One generator per direction, so each direction's draws depend only on its own
        # packet order, not on how the two directions interleave.
        self._rng_up = random.Random(seed)
        self._rng_down = random.Random(None if seed is None else seed + 1)
        self._counts = _Counters()
        self._flows: dict[Any, _Flow] = {}
        self._connecting: set[asyncio.Task[None]] = set()
        self._transport: asyncio.DatagramTransport | None = None
        self._closed = False
        self._release: TimedRelease[tuple[Any, str]] = TimedRelease(self._deliver)
        self._schedule = self._release.schedule
        self.late_up = Lateness()
        self.late_down = Lateness()
        """Lateness of forwarded datagrams, client -> target and back."""

    async def start(self) -> None:
        if self._transport is not None or self._closed:
            raise ProxyError("a DelayProxy starts once")
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(
            lambda: _ClientSide(self), local_addr=self.listen
        )

    async def close(self) -> None:
        """Stop forwarding; packets still delayed in flight are discarded."""
        self._closed = True
        for task in list(self._connecting):
            task.cancel()
        for task in list(self._connecting):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._release.cancel()
        for flow in self._flows.values():
            self._schedule.discard(flow.up)
            self._schedule.discard(flow.down)
            if flow.upstream is not None:
                flow.upstream.close()
        if self._transport is not None:
            self._transport.close()

    async def __aenter__(self) -> DelayProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def bound_port(self) -> int:
        """The port clients should send to (useful when listening on port 0)."""
        if self._transport is None:
            raise ProxyError("the proxy is not started")
        port: int = self._transport.get_extra_info("sockname")[1]
        return port

    @property
    def stats(self) -> ProxyStats:
        return ProxyStats(**asdict(self._counts), flows=len(self._flows))

    # --- datagrams ----------------------------------------------------------------------

    def _from_client(self, data: bytes, client: Any) -> None:
        if self._closed:
            return
        flow = self._flows.get(client)
        if flow is None:
            flow = self._open_flow(client)
        if self._drop(self._rng_up):
            self._counts.up_dropped += 1
            return
        self._hold(flow.up, data, self._delay(self._rng_up))

    def _from_target(self, flow: _Flow, data: bytes) -> None:
        if self._closed:
            return
        if self._drop(self._rng_down):
            self._counts.down_dropped += 1
            return
        self._hold(flow.down, data, self._delay(self._rng_down))

    def _hold(self, lane: tuple[Any, str], data: bytes, delay_s: float) -> None:
        self._release.push(lane, data, delay_s)

    def _deliver(self, lane: tuple[Any, str], data: bytes, late_s: float) -> None:
        flow = self._flows.get(lane[0])
        if flow is None:
            return
        if lane[1] == "up":
            self._send_up(flow, data)
            self.late_up = self.late_up.add(late_s)
        else:
            self._send_down(flow, data)
            self.late_down = self.late_down.add(late_s)

    def _send_up(self, flow: _Flow, data: bytes) -> None:
        assert flow.upstream is not None  # the up lane is held until it is connected
        flow.upstream.sendto(data)
        self._counts.up_packets += 1
        self._counts.up_bytes += len(data)

    def _send_down(self, flow: _Flow, data: bytes) -> None:
        assert self._transport is not None  # flows only exist after start()
        self._transport.sendto(data, flow.client)
        self._counts.down_packets += 1
        self._counts.down_bytes += len(data)

    def _error(self, exc: Exception) -> None:
        self._counts.errors += 1
        log.debug("delay proxy socket error: %s", exc)

    def _drop(self, rng: random.Random) -> bool:
        return self.loss > 0 and rng.random() < self.loss

    def _delay(self, rng: random.Random) -> float:
        jitter = rng.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else 0.0
        return (self.delay_ms + jitter) / 1000.0

    # --- flows --------------------------------------------------------------------------

    def _open_flow(self, client: Any) -> _Flow:
        loop = asyncio.get_running_loop()
        flow = _Flow(client)
        self._schedule.hold(flow.up)  # until its upstream socket is connected
        self._flows[client] = flow
        task = loop.create_task(self._connect(flow))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)
        return flow

    async def _connect(self, flow: _Flow) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _TargetSide(self, flow), remote_addr=self.target
            )
        except OSError as exc:
            log.warning("delay proxy cannot reach %s: %s", self.target, exc)
            self._counts.errors += 1
            self._counts.up_dropped += self._schedule.discard(flow.up)
            self._schedule.discard(flow.down)
            del self._flows[flow.client]  # the client's next packet tries again
            return
        if self._closed:
            transport.close()
            return
        flow.upstream = transport
        self._release.release(flow.up)


# --- command line -----------------------------------------------------------------------


def parse_address(text: str) -> Address:
    """'127.0.0.1:9000' or '[::1]:9000' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m app.lab.wan.proxy", description="UDP forwarder with WAN-like delay."
    )
    p.add_argument("--listen", type=parse_address, required=True, help="HOST:PORT to accept on")
    p.add_argument("--target", type=parse_address, required=True, help="HOST:PORT to forward to")
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay, each direction")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="uniform +- jitter, no reorder")
    p.add_argument("--loss", type=float, default=0.0, help="drop probability per packet")
    p.add_argument("--seed", type=int, default=None, help="seed for jitter and loss")
    return p


def _describe(stats: ProxyStats) -> str:
    return (
        f"up {stats.up_packets} pkts/{stats.up_bytes} B, down {stats.down_packets} pkts/"
        f"{stats.down_bytes} B, dropped {stats.up_dropped} up/{stats.down_dropped} down, "
        f"{stats.flows} flows, {stats.errors} errors"
    )


async def _serve(args: argparse.Namespace) -> None:
    proxy = DelayProxy(args.listen, args.target, args.delay_ms, args.jitter_ms, args.loss,
                       args.seed)  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # Windows: Ctrl-C raises instead
            loop.add_signal_handler(sig, stop.set)
    async with proxy:
        host, port = args.listen[0], proxy.bound_port
        print(f"listening on {host}:{port} -> {args.target[0]}:{args.target[1]}", flush=True)
        await stop.wait()
        print(f"stats: {_describe(proxy.stats)}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        asyncio.run(_serve(args))
    except ValueError as exc:  # bad --delay-ms, --jitter-ms or --loss
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # cannot bind --listen
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
