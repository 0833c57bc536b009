"""Many requests at once: the seeds' load table, two settings side by side in one run.

(a) compute-bound: Gemma 3 270M as three stages on loopback;
(b) latency-bound: a 20-stage chain of the tiny model, each link 1-56 ms one way
    through app.lab.wan.proxy (the seeds' 20-PC fleet, as bench/swarm.py builds it).

For each level (requests started at once, every one a session of its own on every
stage, all over one client connection): total tokens/s (the sum of each request's decode
speed once it runs, and all tokens over the wall time), each request's tokens/s, time
to first token, how many requests gave exactly the tokens they give alone, per-stage
compute / waiting from the TOKENS timings and the network and handling rest, CPU busy
share of every worker and of the client, and peak memory per worker. Where the total
stops rising, the busiest resource is named. `--modes` adds (a) at `--mode-levels`
(1, 16, 64 requests) in each way a stage can batch: `batch-variant` (one KV cache shared
by all sessions, repacked weights and tiled matmul: SANGAMA_BATCH_VARIANT=1, numbers that
depend on the batch), `default` (a KV stream per session, batch-invariant kernels, rows
of all sessions in shared decodes) and `reproducible` (a decode per session).

    .venv/bin/python bench/load.py [--json] [--quick] [--levels 1,4,16] [--tokens 16]
        [--settings loopback,wan20,wan20r,wan5] [--proxy-processes 1] [--modes]
        [--mode-levels 1,16,64] [--kv-cost]

wan20r is the latency-bound chain with its workers in reproducible mode; wan5 the same
model and the same 407 ms of link delay over 5 stages (6 links) instead of 20. The WAN
chains' delay proxies run in a process of their own (`--proxy-processes`, 0: in this one).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.client.swarm_client import SwarmClient, TokenEvent
from app.errors import ClientError
from app.lab.local_swarm import LocalSwarm
from core.models import resolve_model
from core.tokenizer import Tokenizer

LEVELS = (1, 4, 16, 32, 64, 128, 256)
GEMMA = "gemma-3-270m"
"""The compute-bound setting's model (its cuts 0, 6, 12, 18 are Gemma 3 270M's)."""
PROMPTS = (
    "Write a short story about a lighthouse keeper who befriends a whale.",
    "Explain how a refrigerator keeps food cold.",
    "List three uses of copper and why it suits each.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Describe the water cycle to a ten-year-old.",
    "Give a recipe for a simple tomato soup.",
    "Why do leaves change colour in autumn?",
    "Summarise the rules of chess in a paragraph.",
)
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _one(client: SwarmClient, prompt: list[int], tokens: int, t0: float) -> dict[str, Any]:
    events: list[TokenEvent] = []
    stamps: list[float] = []
    try:
        async for ev in client.generate(prompt, tokens):
            events.append(ev)
            stamps.append(time.perf_counter())
    except ClientError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    out = [t for ev in events for t in ev.tokens]
    decode_s = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return {
        "tokens": out,
        "ttft_ms": (stamps[0] - t0) * 1e3,
        "decode_tps": (len(out) - len(events[0].tokens)) / decode_s if decode_s > 0 else 0.0,
        "events": events[1:],
        "end": stamps[-1],
    }


def _stage_split(events: list[TokenEvent]) -> dict[str, Any]:
    """Per-stage medians over decode steps: compute, waiting, and the rest of the trip."""
    if not events:
        return {}
    n = len(events[0].timings)
    compute = [statistics.median(e.timings[i].compute_ms for e in events) for i in range(n)]
    queue = [statistics.median(e.timings[i].queue_ms for e in events) for i in range(n)]
    inside = statistics.median(sum(t.recv_to_send_ms for t in e.timings) for e in events)
    trip = statistics.median(e.trip_ms for e in events)
    return {
        "trip_ms": trip,
        "compute_ms": compute,
        "queue_ms": queue,
        "network_and_handling_ms": trip - inside,
    }


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU ticks of the whole machine so far (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _limit(level: dict[str, Any], n_cores: int, floor_ms: float) -> str:
    """The resource that bounds this level, in words: a saturated process first (a stage's
    engine is one thread, the client one event loop), then the machine's cores (ours or
    others' work), then where the trip's time goes (a stage's step, or the links: their
    configured delay against the handling on top)."""
    split = level["stages"]
    busy = level["cpu_busy"]
    trip = split.get("trip_ms", 0.0) or 1.0
    held = [c + q for c, q in zip(split["compute_ms"], split["queue_ms"], strict=True)]
    worst = max(range(len(held)), key=lambda i: held[i])
    hottest = max(range(len(busy["workers"])), key=lambda i: busy["workers"][i])
    if busy["workers"][hottest] >= 0.85:
        return (
            f"stage {hottest} compute saturated ({busy['workers'][hottest]:.0%} of a core;"
            f" {split['compute_ms'][hottest]:.1f} ms a step + {split['queue_ms'][hottest]:.1f}"
            f" ms waiting for its engine, of a {trip:.0f} ms trip)"
        )
    if busy["client"] >= 0.85:
        return f"the client process (one event loop, {busy['client']:.0%} of a core)"
    if busy.get("proxies", 0.0) >= 0.85 * max(1, level.get("proxy_processes", 1)):
        return f"the delay proxies' process ({busy['proxies']:.0%} of a core)"
    ours, machine = level["machine_cpu_share"], level["machine_busy"]
    stage = (
        f"stage {worst} holds a step longest ({split['compute_ms'][worst]:.0f} ms computing +"
        f" {split['queue_ms'][worst]:.0f} ms waiting for its engine, of a {trip:.0f} ms trip;"
        f" {busy['workers'][worst]:.0%} of a core)"
    )
    if machine >= 0.9:
        whose = "the chain's" if ours >= 0.5 * machine else "mostly other work's"
        where = f"; {stage}" if held[worst] >= 0.5 * trip else ""
        return (
            f"this machine's {n_cores} cores ({machine:.0%} busy, {whose}: the chain used"
            f" {ours:.0%}; every wake-up waits for a core){where}"
        )
    if held[worst] >= 0.5 * trip:
        return f"{stage}: its compute"
    net = split["network_and_handling_ms"]
    if floor_ms and net - floor_ms < floor_ms:
        return f"the links' delay ({floor_ms:.0f} ms of the {trip:.0f} ms trip is configured delay)"
    return (
        f"handling between stages ({net - floor_ms:.0f} ms of the {trip:.0f} ms trip on top of"
        f" {floor_ms:.0f} ms configured delay: frames, QUIC, the proxies' event loop)"
    )


async def _level(
    swarm: LocalSwarm,
    client: SwarmClient,
    prompts: list[list[int]],
    solo: list[list[int]],
    n: int,
    tokens: int,
    keep_events: bool = False,
) -> dict[str, Any]:
    """One level: `n` requests at once. `keep_events`: the decode steps' TokenEvents
    under "_events" too (bench/predict.py reads the steps' rows from them)."""
    pids = [w.process.pid for w in swarm.workers]
    cpu0 = [_cpu_s(p) for p in pids]
    proxy_pids = swarm.proxy_pids
    proxy0 = sum(_cpu_s(p) for p in proxy_pids)
    client0 = time.process_time()
    machine0 = _machine_busy()
    links0 = await swarm.proxy_reports()
    t0 = time.perf_counter()
    runs = await asyncio.gather(
        *(_one(client, prompts[k % len(prompts)], tokens, t0) for k in range(n))
    )
    wall = time.perf_counter() - t0
    ok = [r for r in runs if "error" not in r]
    errors = sorted({r["error"] for r in runs if "error" in r})
    cpu = [(_cpu_s(p) - c) / wall for p, c in zip(pids, cpu0, strict=True)]
    client_busy = (time.process_time() - client0) / wall
    proxies_busy = (sum(_cpu_s(p) for p in proxy_pids) - proxy0) / wall
    machine1 = _machine_busy()
    links1 = await swarm.proxy_reports()
    n_cores = os.cpu_count() or 1
    same = sum(
        r["tokens"] == solo[k % len(prompts)] for k, r in enumerate(runs) if "error" not in r
    )
    level: dict[str, Any] = {
        "requests": n,
        "completed": len(ok),
        "errors": errors,
        "total_tokens_per_s": sum(r["decode_tps"] for r in ok),
        "wall_tokens_per_s": sum(len(r["tokens"]) for r in ok) / wall,
        "per_request_tokens_per_s": statistics.median(r["decode_tps"] for r in ok) if ok else 0,
        "ttft_ms": statistics.median(r["ttft_ms"] for r in ok) if ok else 0,
        "same_as_alone": same,
        "stages": _stage_split([e for r in ok for e in r["events"]]),
        # The client's figure includes the delay proxies when they run in its process.
        "cpu_busy": {"workers": cpu, "client": client_busy, "proxies": proxies_busy},
        "machine_cpu_share": (sum(cpu) + client_busy + proxies_busy) / n_cores,
        "machine_busy": (machine1[0] - machine0[0]) / max(1, machine1[1] - machine0[1]),
        "peak_rss_mib": [_peak_rss_mib(p) for p in pids],
        "proxy_processes": swarm.proxy_processes,
        # Datagrams the emulated links carried (both ways, all links) per token: QUIC's
        # packets, ACKs and any retransmissions, counted by the delay proxies.
        "datagrams_per_token": (
            sum(b.stats.up_packets + b.stats.down_packets for b in links1)
            - sum(a.stats.up_packets + a.stats.down_packets for a in links0)
        )
        / max(1, sum(len(r["tokens"]) for r in ok)),
        # Tokens per CPU second the chain (workers, client, proxies) spent: on a machine
        # shared with other work, the figure that does not depend on the share it got.
        "tokens_per_chain_cpu_s": sum(len(r["tokens"]) for r in ok)
        / max(1e-9, (sum(cpu) + client_busy + proxies_busy) * wall),
        "load_average": Path("/proc/loadavg").read_text().split()[:3],
    }
    floor = sum(swarm.link_delays_ms or ())
    level["limit"] = _limit(level, n_cores, floor) if ok else "; ".join(errors)
    if keep_events:
        level["_events"] = [e for r in ok for e in r["events"]]
    return level


async def _setting(
    name: str,
    swarm: LocalSwarm,
    prompts: list[list[int]],
    levels: list[int],
    tokens: int,
) -> dict[str, Any]:
    try:
        await swarm.start(ready_timeout=900)  # a shared, loaded machine loads stages slowly
        assert swarm.route is not None and swarm.client_credentials is not None
        async with SwarmClient(
            swarm.client_credentials,
            swarm.route,
            swarm.tuning,
            first_token_timeout=300,
            step_timeout=120,
        ) as client:
            # Alone: each prompt by itself on the same chain (after a warm-up).
            [ev async for ev in client.generate(prompts[0], 4)]
            solo = []
            for p in prompts:
                solo.append([t async for ev in client.generate(p, tokens) for t in ev.tokens])
            rows = []
            for n in levels:
                rows.append(await _level(swarm, client, prompts, solo, n, tokens))
                _print_row(name, rows[-1], live=True)
    finally:
        await swarm.stop()
        swarm.cleanup()
    return {
        "setting": name,
        "stages": len(swarm.cuts) - 1,
        "tokens": tokens,
        "link_delay_ms": sum(swarm.link_delays_ms or ()),
        "levels": rows,
    }


def _print_row(name: str, r: dict[str, Any], live: bool = False) -> None:
    s = r["stages"]
    comp = "/".join(f"{c:.1f}" for c in s.get("compute_ms", [])[:4])
    more = "/..." if len(s.get("compute_ms", [])) > 4 else ""
    wait = max(s.get("queue_ms", [0.0]))
    print(
        f"{'  ' if not live else '> '}{name:9} {r['requests']:4d} "
        f"{r['total_tokens_per_s']:8.1f} {r['wall_tokens_per_s']:8.1f} "
        f"{r['per_request_tokens_per_s']:7.2f} {r['ttft_ms']:8.0f} "
        f"{r['same_as_alone']:4d}/{r['completed']:<4d} "
        f"trip {s.get('trip_ms', 0):7.1f} = compute {comp}{more} + max wait {wait:.1f} + net "
        f"{s.get('network_and_handling_ms', 0):.1f} ms | peak "
        f"{max(r['peak_rss_mib'], default=0):.0f} MiB | load {r['load_average'][0]}, machine"
        f" {r['machine_busy']:.0%} busy (chain {r['machine_cpu_share']:.0%}; client"
        f" {r['cpu_busy']['client']:.0%}, proxies {r['cpu_busy'].get('proxies', 0):.0%},"
        f" busiest stage {max(r['cpu_busy']['workers'], default=0):.0%};"
        f" {r.get('tokens_per_chain_cpu_s', 0):.0f} tokens a chain CPU s) | {r['limit']}",
        file=sys.stderr if live else sys.stdout,
        flush=True,
    )


def _stops_rising(levels: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first level whose wall total is under 1.1x the previous one (or falls): the
    wall figure, because the sum of decode speeds counts requests that overlap little
    (late first tokens) as if they ran side by side."""
    for prev, cur in itertools.pairwise(levels):
        if cur["wall_tokens_per_s"] < 1.1 * prev["wall_tokens_per_s"]:
            return cur
    return None


def loopback(levels: list[int], tokens: int, reproducible: bool = False) -> LocalSwarm:
    return LocalSwarm(
        model=str(resolve_model(GEMMA)),
        cuts=[0, 6, 12, 18],
        max_sessions=max(levels),
        n_ctx=64 + tokens + 16,  # positions per session
        reproducible=reproducible,
    )


def wan20(
    levels: list[int],
    tokens: int,
    model: Path,
    seed: int = 7,
    reproducible: bool = False,
    proxy_processes: int = 1,
    stages: int = 20,
) -> LocalSwarm:
    """The 20-layer tiny model over `stages` stages. With fewer than 20, the same 21 link
    delays are summed in consecutive groups, one group a link: the same 407 ms a token
    waits on links, over fewer hops (each hop costs CPU; on a 2-core machine that CPU,
    not the delays, is what runs out first)."""
    rng = random.Random(seed)
    delays = [float(rng.randint(1, 56)) for _ in range(21)]
    if stages != 20:
        groups = [len(g) for g in _split(list(range(21)), stages + 1)]
        at = list(itertools.accumulate([0, *groups]))
        delays = [sum(delays[a:b]) for a, b in itertools.pairwise(at)]
    return LocalSwarm(
        model=str(model),
        cuts=[round(k * 20 / stages) for k in range(stages + 1)],
        max_sessions=max(levels),
        n_ctx=8 + tokens + 16,  # positions per session
        link_delays_ms=delays,
        reproducible=reproducible,
        proxy_processes=proxy_processes,
    )


def _split(items: list[int], parts: int) -> list[list[int]]:
    """`items` in `parts` consecutive groups whose sizes differ by at most one."""
    q, r = divmod(len(items), parts)
    sizes = [q + (1 if k < r else 0) for k in range(parts)]
    at = list(itertools.accumulate([0, *sizes]))
    return [items[a:b] for a, b in itertools.pairwise(at)]


def kv_cost(filled: tuple[int, ...] = (8, 64, 256), context: int = 32) -> dict[str, Any]:
    """What the unified KV cache costs as it fills: one Gemma stage (layers 0-6), in this
    process, one thread (as a worker runs; two threads on a shared 2-core machine spend
    their time at ggml's barriers); `filled` sessions each hold `context` positions, then
    8 of them decode one row each (timed: includes llama.cpp's cell search), and one rolls
    back 4 positions (seq_rm, timed), then all of them decode one row each (timed: the
    step of a full stage). The same with one KV stream per session (the default), and
    with a stream per session and each decode holding one session (reproducible mode).
    The shared cache is asked for with SANGAMA_BATCH_VARIANT, which also brings repacked
    weights back (the tiled matmul stays as the process's first stage set it)."""
    import numpy as np

    from core.models import stage_files
    from core.stage import Stage, StepRequest
    from core.types import LayerRange, StageSpec

    _, (path,) = stage_files(resolve_model(GEMMA), [LayerRange(0, 6)])
    rows: list[dict[str, Any]] = []
    kinds = (("shared", True, False), ("per session", False, False), ("alone", False, True))
    for kind, shared, alone in kinds:
        if shared:
            os.environ["SANGAMA_BATCH_VARIANT"] = "1"
        else:
            os.environ.pop("SANGAMA_BATCH_VARIANT", None)
        for n in filled:
            spec = StageSpec(
                LayerRange(0, 6),
                18,
                n_ctx=256 * (context + 16),
                n_batch=256,
                n_seq_max=256,
                n_threads=1,
                use_gpu=False,
                reproducible=alone,
            )
            stage = Stage.from_file(path, spec)
            fill_started = time.perf_counter()
            try:
                for first in range(0, n, 8):  # 8 sessions x 32 rows: one n_batch
                    group = range(first, min(first + 8, n))
                    for k in group:
                        stage.open(f"s{k}")
                    stage.step(
                        [
                            StepRequest(
                                f"s{k}", 0, tokens=np.arange(1, context + 1, dtype=np.int32) + k
                            )
                            for k in group
                        ]
                    )
                fill_s = time.perf_counter() - fill_started
                decode_ms: list[float] = []
                rm_ms: list[float] = []
                for rep in range(8):
                    reqs = [
                        StepRequest(f"s{k}", context + rep, tokens=np.array([7], dtype=np.int32))
                        for k in range(8)
                    ]
                    t = time.perf_counter()
                    stage.step(reqs)
                    decode_ms.append((time.perf_counter() - t) * 1e3)
                    t = time.perf_counter()
                    stage.rollback("s0", context + rep - 3)
                    rm_ms.append((time.perf_counter() - t) * 1e3)
                    stage.step(
                        [
                            StepRequest(
                                "s0",
                                context + rep - 3,
                                tokens=np.array([7, 7, 7, 7], dtype=np.int32),
                            )
                        ]
                    )
                # Then every session one row (the step of a full stage), three times.
                at = [context + 8 if k < 8 else context for k in range(n)]
                all_ms: list[float] = []
                for _ in range(3):
                    reqs = [
                        StepRequest(f"s{k}", at[k], tokens=np.array([7], dtype=np.int32))
                        for k in range(n)
                    ]
                    t = time.perf_counter()
                    stage.step(reqs)
                    all_ms.append((time.perf_counter() - t) * 1e3)
                    at = [a + 1 for a in at]
            finally:
                stage.shutdown()
            rows.append(
                {
                    "kv": kind,
                    "sessions_filled": n,
                    "decode_8_rows_ms": statistics.median(decode_ms[1:]),
                    "seq_rm_ms": statistics.median(rm_ms[1:]),
                    "decode_all_rows_ms": statistics.median(all_ms),
                    "fill_s": fill_s,
                    "load_average": Path("/proc/loadavg").read_text().split()[:3],
                }
            )
    return {"context_per_session": context, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="levels 1,4,16 and 8 tokens")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)))
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--settings", default="loopback,wan20")
    ap.add_argument(
        "--proxy-processes",
        type=int,
        default=1,
        help="processes the WAN chain's delay proxies run in (0: this one, with the client)",
    )
    ap.add_argument(
        "--modes",
        action="store_true",
        help="add the loopback setting in each way of batching (batch-variant, default,"
        " reproducible)",
    )
    ap.add_argument("--mode-levels", default="1,16,64")
    ap.add_argument(
        "--kv-cost", action="store_true", help="only: what the unified KV costs as it fills"
    )
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x]
    if args.quick:
        levels, args.tokens = [1, 4, 16], 8
    if args.proxy_processes < 0:
        ap.error("--proxy-processes must be >= 0")
    if any(not 1 <= n <= 256 for n in levels):
        ap.error("levels must lie in 1..256 (a stage holds 256 sessions)")
    if args.kv_cost:
        cost = kv_cost()
        if args.json:
            print(json.dumps(cost, indent=1))
        else:
            print(f"KV as it fills ({cost['context_per_session']} positions per session)")
            for r in cost["rows"]:
                print(
                    f"  {r['kv']:11} {r['sessions_filled']:4d} sessions: 8-row decode"
                    f" {r['decode_8_rows_ms']:7.2f} ms, seq_rm {r['seq_rm_ms']:.3f} ms, a row"
                    f" for each of them {r['decode_all_rows_ms']:.0f} ms"
                    f" (filling took {r['fill_s']:.1f} s; load average {r['load_average'][0]})"
                )
        return 0
    settings = [s for s in args.settings.split(",") if s]
    gemma = resolve_model(GEMMA)
    tok = Tokenizer.from_gguf(gemma)
    gemma_prompts = [tok.encode(p) for p in PROMPTS]
    tok.close()
    out: dict[str, Any] = {
        "levels": levels,
        "tokens": args.tokens,
        "cores": os.cpu_count(),
        "settings": [],
    }
    print(
        "  setting   reqs  total/s   wall/s  each/s  ttft ms same/done  per-stage timings",
        file=sys.stderr,
    )
    if "loopback" in settings:
        swarm = loopback(levels, args.tokens)
        out["settings"].append(
            asyncio.run(_setting("loopback", swarm, gemma_prompts, levels, args.tokens))
        )
    if any(s in settings for s in ("wan20", "wan20r", "wan5")):
        from tests.support.tiny_models import write_tiny_model

        with tempfile.TemporaryDirectory(prefix="sangama-load-") as tmp:
            model = write_tiny_model(
                Path(tmp) / "tiny20.gguf", n_layer=20, n_embd=256, n_head=4, n_ff=512
            )
            tiny_prompts = [[1 + (k * 31 + j * 7) % 500 for j in range(8)] for k in range(8)]
            # wan20r: the same chain in reproducible mode; wan5: 5 stages, same 407 ms.
            for name in ("wan20", "wan20r", "wan5"):
                if name in settings:
                    swarm = wan20(
                        levels,
                        args.tokens,
                        model,
                        reproducible=name == "wan20r",
                        proxy_processes=args.proxy_processes,
                        stages=5 if name == "wan5" else 20,
                    )
                    out["settings"].append(
                        asyncio.run(_setting(name, swarm, tiny_prompts, levels, args.tokens))
                    )
    if args.modes:
        at = [int(x) for x in args.mode_levels.split(",") if x]
        for mode in ("batch-variant", "default", "reproducible"):
            # The workers are processes of their own: they inherit the variable.
            if mode == "batch-variant":
                os.environ["SANGAMA_BATCH_VARIANT"] = "1"
            swarm = loopback(at, args.tokens, reproducible=mode == "reproducible")
            try:
                r = asyncio.run(_setting(f"mode:{mode}", swarm, gemma_prompts, at, args.tokens))
            finally:
                os.environ.pop("SANGAMA_BATCH_VARIANT", None)
            out["settings"].append(r)
    for s in out["settings"]:
        rows = s["levels"]
        top = _stops_rising(rows)
        s["stops_rising_at"] = None if top is None else top["requests"]
        s["limit_there"] = None if top is None else top["limit"]
        if len(rows) > 1 and rows[0]["total_tokens_per_s"] > 0:
            by_n = {r["requests"]: r["total_tokens_per_s"] for r in rows}
            s["total_vs_one"] = {n: v / rows[0]["total_tokens_per_s"] for n, v in by_n.items()}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print("  setting   reqs  total/s   wall/s  each/s  ttft ms same/done  per-stage timings")
    for s in out["settings"]:
        for r in s["levels"]:
            _print_row(s["setting"], r)
        where = s["stops_rising_at"]
        print(
            f"  {s['setting']}: total "
            + (f"stops rising at {where} requests: {s['limit_there']}" if where else "still rising")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
