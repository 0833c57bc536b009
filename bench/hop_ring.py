"""Per-hop software cost: STEP frames around a ring of forwarder processes, QUIC vs TCP.

Each forwarder decodes the frame, turns the hidden rows into an f32 array and back
(exactly what a worker does around its compute), and sends it on. The origin sends one
frame at a time and measures the round trip; per-hop cost = round trip / links. Zero
compute, so what remains is transport plus handling.

QUIC links are the real authenticated channels (net.channel); TCP links carry the
same frames on plain asyncio streams, without TLS or authentication. `mtu` is the QUIC
links' path-MTU probing ceiling (net.quic.path_mtu): 1200 turns probing off, every datagram
1200 bytes, as before path MTU discovery; `measure` runs both side by side.

Back to back (the default) every forwarder stays warm. `--gap-ms` pauses before each
frame, as a swarm's processes idle between tokens: each hop then also pays a wake-up
from sleep and caches gone cold, on TCP as on QUIC (bench/README.md, "Measuring on a
noisy machine").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import psutil

from app.credentials import init_ca, issue_node, load_credentials
from app.ports import free_tcp_port, free_udp_port
from net import event_loop, wire
from net.channel import Channel, ChannelServer, NodeCredentials, connect_channel
from net.quic import counts as quic_counts
from net.quic.ack_policy import ACK_HOLD
from net.quic.links import DEFAULT_LIBRARY, QUIC_LIBRARIES, QuicTuning
from net.quic.path_mtu import PROBE_CEILING
from net.wire.tensors import WireDtype, decode_rows, encode_rows

Send = Callable[[wire.Frame], None]
TRANSPORTS = ("quic", "aioquic", "qh3", "tcp")
"""quic: the default QUIC library (net.quic.links.DEFAULT_LIBRARY); aioquic, qh3: that library;
tcp: plain asyncio TCP. All on the event loop net.event_loop picks (uvloop on Linux)."""


def _library(transport: str) -> str:
    return DEFAULT_LIBRARY if transport == "quic" else transport


def _reencode(frame: wire.Frame) -> wire.Frame:
    if isinstance(frame, wire.Step) and frame.hidden is not None:
        dtype = WireDtype(frame.wire_dtype)
        rows = decode_rows(frame.hidden, dtype, frame.n_rows, frame.width)
        return wire.Step(
            frame.session,
            frame.step_id,
            frame.start,
            frame.tokens,
            encode_rows(rows, dtype),
            frame.n_rows,
            frame.width,
            dtype,
            timings=frame.timings,
            sent_at_ns=frame.sent_at_ns,
        )
    return frame


# ---------------------------------------------------------------- transports


async def _tcp_server(port: int, on_frame: Callable[[wire.Frame], None]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = wire.FrameDecoder()
        while data := await reader.read(1 << 20):
            for f in decoder.feed(data):
                on_frame(f)

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def _tcp_sender(port: int) -> Send:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            break
        except OSError:
            await asyncio.sleep(0.05)
    else:
        raise OSError(f"no TCP listener on {port}")
    sock = writer.get_extra_info("socket")
    import socket

    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return lambda f: writer.write(wire.encode(f))


def _tuning(mtu: int, lib: str, ack_hold: float = ACK_HOLD) -> QuicTuning:
    return QuicTuning(probe_max_datagram_size=mtu, library=lib, ack_hold=ack_hold)


async def _quic_server(
    creds: NodeCredentials,
    port: int,
    on_frame: Callable[[wire.Frame], None],
    mtu: int,
    lib: str,
    ack_hold: float = ACK_HOLD,
) -> ChannelServer:
    def ready(ch: Channel) -> None:
        ch.on_frame = lambda _c, f: on_frame(f)

    server = ChannelServer(creds, ready, _tuning(mtu, lib, ack_hold))
    await server.listen("127.0.0.1", port)
    return server


async def _quic_channel(
    creds: NodeCredentials, port: int, node_id: str, mtu: int, lib: str, ack_hold: float = ACK_HOLD
) -> Channel:
    for _ in range(200):
        try:
            return await connect_channel(
                ("127.0.0.1", port),
                creds,
                node_id,
                _tuning(mtu, lib, ack_hold),
                timeout=2,
            )
        except Exception:
            await asyncio.sleep(0.05)
    raise OSError(f"no QUIC listener on {port}")


async def _quic_sender(
    creds: NodeCredentials, port: int, node_id: str, mtu: int, lib: str, ack_hold: float = ACK_HOLD
) -> Send:
    return (await _quic_channel(creds, port, node_id, mtu, lib, ack_hold)).send


# ---------------------------------------------------------------- forwarder process


async def forward(args: argparse.Namespace) -> None:
    out: list[Send] = []

    def on_frame(f: wire.Frame) -> None:
        out[0](_reencode(f))

    if args.transport != "tcp":
        lib = _library(args.transport)
        creds = load_credentials(Path(args.creds), args.id)
        hold = args.ack_hold
        out.append(await _quic_sender(creds, args.next, args.next_id, args.mtu, lib, hold))
        server: object = await _quic_server(creds, args.listen, on_frame, args.mtu, lib, hold)
    else:
        out.append(await _tcp_sender(args.next))
        server = await _tcp_server(args.listen, on_frame)
    print("READY", flush=True)  # connected downstream and listening upstream
    await asyncio.Event().wait()
    del server


# ---------------------------------------------------------------- origin


async def measure(
    transport: str,
    hops: int,
    dtype: WireDtype,
    width: int,
    n: int,
    mtu: int,
    ack_hold: float = ACK_HOLD,
    gap_s: float = 0.0,
) -> dict[str, float]:
    """Round trips of `n` one-row STEP frames through `hops` forwarders; `ack_hold` is the
    QUIC links' (net.quic.ack_policy; 0: every ACK at once, none held); `gap_s`:
    a pause before each frame (a decode's cadence: every process idle between frames, as
    a swarm's are between tokens, so each hop pays a wake-up from sleep)."""
    tmp = tempfile.TemporaryDirectory(prefix="sangama-ring-")
    wd = Path(tmp.name)
    init_ca(wd / "ca")
    ids = ["origin"] + [f"hop{i}" for i in range(hops)]
    for node in ids:
        issue_node(wd / "ca", node, "worker", out_dir=wd / node)
    ports = [free_udp_port() if transport != "tcp" else free_tcp_port() for _ in ids]
    lib = _library(transport)
    procs = []
    arrived: asyncio.Queue[float] = asyncio.Queue()

    def back_home(_f: wire.Frame) -> None:
        arrived.put_nowait(time.perf_counter())

    try:
        creds = load_credentials(wd / "origin", "origin")
        if transport != "tcp":
            server: object = await _quic_server(creds, ports[0], back_home, mtu, lib, ack_hold)
        else:
            server = await _tcp_server(ports[0], back_home)
        for i in range(len(ids) - 1, 0, -1):  # from the end, so each next hop is up
            nxt = (i + 1) % len(ids)
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    __file__,
                    "forward",
                    "--transport",
                    transport,
                    "--listen",
                    str(ports[i]),
                    "--next",
                    str(ports[nxt]),
                    "--id",
                    ids[i],
                    "--next-id",
                    ids[nxt],
                    "--creds",
                    str(wd / ids[i]),
                    "--mtu",
                    str(mtu),
                    "--ack-hold",
                    str(ack_hold),
                    stdout=asyncio.subprocess.PIPE,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            )
            assert procs[-1].stdout is not None
            await asyncio.wait_for(procs[-1].stdout.readline(), 60)
        send = await (
            _quic_sender(creds, ports[1], ids[1], mtu, lib, ack_hold)
            if transport != "tcp"
            else _tcp_sender(ports[1])
        )
        await asyncio.sleep(1.0)  # path MTU probes settle (net.quic.path_mtu)
        rows = np.random.default_rng(0).standard_normal((1, width)).astype(np.float32)
        payload = encode_rows(rows, dtype)
        frame = wire.Step("bench", 0, 0, (), payload, 1, width, dtype)
        send(wire.Open("bench", "ring", dtype, wire.SamplingSpec(), "origin", 1, 1))
        await asyncio.wait_for(arrived.get(), 10)
        trips = []
        forwarders = [psutil.Process(p.pid) for p in procs]
        for i in range(n + 20):
            if i == 20:  # warm-up done: handshakes, congestion windows, caches
                cpu0 = sum(_cpu_s(f) for f in forwarders)
            if gap_s:
                await asyncio.sleep(gap_s)
            t0 = time.perf_counter()
            send(frame)
            t1 = await asyncio.wait_for(arrived.get(), 10)
            if i >= 20:
                trips.append((t1 - t0) * 1e3)
        cpu = sum(_cpu_s(f) for f in forwarders) - cpu0
        links = hops + 1
        med = statistics.median(trips)
        return {
            "trip_ms": med,
            "hop_ms": med / links,
            # A forwarder receives on one link and sends on the next for every frame: the
            # software of one hop, both ends. CPU time hardly depends on the machine's load,
            # where the round trip does (every wake-up waits for a core).
            "cpu_ms_per_hop": cpu * 1e3 / (n * hops),
            "links": links,
            "frame_bytes": len(wire.encode(frame)),
        }
    finally:
        for p in procs:
            p.kill()
            await p.wait()
        del server
        tmp.cleanup()


# ---------------------------------------------------------------- profile (one process)


async def profile(library: str, n: int, top: int, mtu: int = PROBE_CEILING) -> None:
    """Two authenticated QUIC links in this process, A -> B -> A, one frame at a time,
    under cProfile: where a hop's CPU goes, and how many transmits, datagrams and loop
    wake-ups one frame costs (the counts are what bench/README.md compares)."""
    import cProfile
    import pstats

    tmp = tempfile.TemporaryDirectory(prefix="sangama-ring-profile-")
    wd = Path(tmp.name)
    init_ca(wd / "ca")
    for node in ("a", "b"):
        issue_node(wd / "ca", node, "worker", out_dir=wd / node)
    ca, cb = load_credentials(wd / "a", "a"), load_credentials(wd / "b", "b")
    pa, pb = free_udp_port(), free_udp_port()
    arrived: asyncio.Queue[float] = asyncio.Queue()
    back: list[Send] = []
    server_a = await _quic_server(ca, pa, lambda _f: arrived.put_nowait(0.0), mtu, library)
    server_b = await _quic_server(cb, pb, lambda f: back[0](_reencode(f)), mtu, library)
    back_channel = await _quic_channel(cb, pa, "a", mtu, library)
    back.append(back_channel.send)
    out_channel = await _quic_channel(ca, pb, "b", mtu, library)
    send = out_channel.send
    quic_links = [
        ch.link for ch in (back_channel, out_channel, *server_a.channels, *server_b.channels)
    ]
    rows = np.random.default_rng(0).standard_normal((1, 640)).astype(np.float32)
    frame = wire.Step("bench", 0, 0, (), encode_rows(rows, WireDtype.F32), 1, 640, WireDtype.F32)
    send(wire.Open("bench", "ring", WireDtype.F32, wire.SamplingSpec(), "a", 1, 1))
    await asyncio.wait_for(arrived.get(), 10)
    await asyncio.sleep(1.0)  # path MTU probes settle (net.quic.path_mtu)
    for _ in range(100):  # warm-up
        send(frame)
        await asyncio.wait_for(arrived.get(), 10)
    prof = cProfile.Profile()
    counts0 = quic_counts.add(*(_counts(link) for link in quic_links))
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(n):
        send(frame)
        await asyncio.wait_for(arrived.get(), 10)
    prof.disable()
    elapsed = time.perf_counter() - t0
    counted = quic_counts.per_frame(
        counts0, quic_counts.add(*(_counts(link) for link in quic_links)), 2 * n
    )
    stats = pstats.Stats(prof)
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    # Calls made by the links' code (net/, the QUIC library), not by this benchmark's
    # harness (its queue and wait_for make a future, a wake-up and a timer per frame);
    # a function with no recorded caller (the loop's `_run_once`) counts whole.
    calls: dict[str, int] = {}
    for k, v in raw.items():
        callers: dict[tuple[str, int, str], tuple[Any, ...]] = v[4]
        mine = [int(c[0]) for ck, c in callers.items() if _linkside(ck[0])]
        calls[f"{Path(k[0]).name}:{k[2]}"] = sum(mine) if callers else int(v[1])
    links = 2 * n

    def per_link(*names: str) -> float:
        return sum(calls.get(name, 0) for name in names) / links

    print(
        f"{library}, loop {event_loop.loop_name()}: {elapsed / links * 1e3:.3f} ms per link "
        "(profiled; both ends in this process)"
    )
    # The link's own counters (net.quic.counts), then what only the profiler sees: the
    # standard loop's scheduling calls (uvloop's are C, invisible to cProfile) and the
    # library's calls.
    print("  per frame and link (both ends), the links' counters:")
    for key, value in counted.items():
        print(f"    {key:24} {value:.2f}")
    print("  per frame and link, calls the profiler counted:")
    for label, names in _PROFILED_CALLS.items():
        print(f"    {label:24} {per_link(*names):.2f}")
    stats.sort_stats("tottime").print_stats(top)
    server_a.close()
    server_b.close()
    tmp.cleanup()


_PROFILED_CALLS: dict[str, tuple[str, ...]] = {
    "loop turns (with harness)": ("base_events.py:_run_once",),
    "call_soon": ("base_events.py:call_soon",),
    "timers made (call_later)": ("base_events.py:call_later",),
    "timers cancelled": ("events.py:cancel",),
    "socket sends": (
        "~:<method 'send' of '_socket.socket' objects>",
        "~:<method 'sendto' of '_socket.socket' objects>",
    ),
    "socket receives": (
        "~:<method 'recvfrom' of '_socket.socket' objects>",
        "~:<method 'recv' of '_socket.socket' objects>",
    ),
    "qh3 core: receive": (
        "~:<method 'receive_datagram' of 'qh3._hazmat.QuicConnectionCore' objects>",
        "~:<method 'receive_many_datagrams' of 'qh3._hazmat.QuicConnectionCore' objects>",
    ),
    "qh3 core: poll_transmit": (
        "~:<method 'poll_transmit' of 'qh3._hazmat.QuicConnectionCore' objects>",
    ),
    "qh3 core: get_timer": ("~:<method 'get_timer' of 'qh3._hazmat.QuicConnectionCore' objects>",),
    "qh3 core: next_event": (
        "~:<method 'next_event' of 'qh3._hazmat.QuicConnectionCore' objects>",
    ),
    "qh3 events (to Python)": ("connection.py:next_event",),
    "bytes joined": ("~:<method 'join' of 'bytes' objects>",),
}


def _linkside(filename: str) -> bool:
    """Whether a caller is a link's code (net/, the QUIC library) or its C methods."""
    path = Path(filename)
    return path.parent.name in ("net", "quic") or filename == "~"


def _counts(link: object) -> dict[str, int]:
    counts = getattr(link, "counts", None)
    return {} if counts is None else dict(counts.snapshot())


def _cpu_s(process: psutil.Process) -> float:
    t = process.cpu_times()
    return float(t.user + t.system)


def _pairs(args: argparse.Namespace, load: float) -> None:
    """QUIC as shipped, with path MTU probing off, with the ACK hold off, and plain TCP,
    alternated so all see the same machine load."""
    import json

    variants = (
        ("quic", "quic", PROBE_CEILING, ACK_HOLD),
        ("quic@1200", "quic", 1200, ACK_HOLD),
        ("quic_nohold", "quic", PROBE_CEILING, 0.0),
        ("tcp", "tcp", PROBE_CEILING, ACK_HOLD),
    )
    got: dict[str, list[dict[str, float]]] = {v[0]: [] for v in variants}
    for _ in range(args.pairs):
        for label, transport, mtu, hold in variants:
            got[label].append(
                event_loop.run(
                    measure(transport, args.hops, WireDtype.F32, args.width, args.n, mtu, hold)
                )
            )
    out: dict[str, Any] = {"load_average": load, "pairs": args.pairs}
    for label, runs in got.items():
        for key in ("hop_ms", "cpu_ms_per_hop"):
            out[f"{label}_{key}"] = statistics.median(r[key] for r in runs)
    out["cpu_ratio"] = out["quic_cpu_ms_per_hop"] / out["quic@1200_cpu_ms_per_hop"]
    out["hold_cpu_ratio"] = out["quic_cpu_ms_per_hop"] / out["quic_nohold_cpu_ms_per_hop"]
    out["quic_vs_tcp_cpu"] = out["quic_cpu_ms_per_hop"] / out["tcp_cpu_ms_per_hop"]
    out["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(out) if args.json else "\n".join(f"{k:26} {v}" for k, v in out.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("forward")
    f.add_argument("--transport", choices=TRANSPORTS, required=True)
    f.add_argument("--listen", type=int, required=True)
    f.add_argument("--next", type=int, required=True)
    f.add_argument("--id", default="")
    f.add_argument("--next-id", default="")
    f.add_argument("--creds", default="")
    f.add_argument("--mtu", type=int, default=PROBE_CEILING)
    f.add_argument("--ack-hold", type=float, default=ACK_HOLD)
    m = sub.add_parser("measure")
    m.add_argument("--hops", type=int, default=3)
    m.add_argument("--n", type=int, default=200)
    m.add_argument("--width", type=int, default=640)
    m.add_argument("--json", action="store_true")
    m.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="a pause before each frame (e.g. 25: a decode's cadence, every hop woken from "
        "sleep as in a swarm between tokens); 0: back to back",
    )
    m.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="instead: N alternations of quic, quic@1200 (no MTU probing), quic_nohold (no "
        "ACK hold) and tcp, f32, and medians",
    )
    pr = sub.add_parser("profile", help="two links in one process under cProfile")
    pr.add_argument("--library", choices=QUIC_LIBRARIES, default=DEFAULT_LIBRARY)
    pr.add_argument("--n", type=int, default=2000)
    pr.add_argument("--top", type=int, default=25)
    pr.add_argument("--mtu", type=int, default=PROBE_CEILING, help="1200: no MTU probing")
    args = ap.parse_args()
    if args.cmd == "forward":
        event_loop.run(forward(args))
        return
    if args.cmd == "profile":
        event_loop.run(profile(args.library, args.n, args.top, args.mtu))
        return
    load = os.getloadavg()[0]
    if not args.json:
        print(f"loop {event_loop.loop_name()}, load {load:.2f}")
    if args.pairs:
        _pairs(args, load)
        return
    # quic@1200: the default library with probing off (every datagram 1200 bytes).
    runs = [(t, PROBE_CEILING, t) for t in TRANSPORTS] + [("quic", 1200, "quic@1200")]
    results: dict[str, Any] = {
        "load_average": load,
        "loop": event_loop.loop_name(),
        "gap_ms": args.gap_ms,
    }
    for transport, mtu, label in runs:
        for dtype in (WireDtype.F32, WireDtype.BF16):
            r = event_loop.run(
                measure(
                    transport,
                    args.hops,
                    dtype,
                    args.width,
                    args.n,
                    mtu,
                    gap_s=args.gap_ms / 1e3,
                )
            )
            results[f"{label}_{dtype.name.lower()}"] = r
            if not args.json:
                print(f"{label:9} {dtype.name:5} {r}")
    results["load_average_end"] = os.getloadavg()[0]
    if args.json:
        import json

        print(json.dumps(results))


if __name__ == "__main__":
    main()
