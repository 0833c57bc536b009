"""Swarm benchmark, side by side in one run (prints tables; --json prints one object):

(a) whole model vs a 3-process swarm on loopback, decode tokens/s, Gemma 3 270M, plain
    decoding round the ring (the last stage sends each next step to the first stage;
    app.serving.links.ring), each stage's compute threads pinned to CPUs of their own
    (LocalSwarm's default) and every step on its engine thread, as volunteers' workers
    run; beside it the same swarm unpinned (`unpinned`, a volunteer's default without
    `--cpus`) and the client sending every step (`no_ring`);
(b) per-hop software cost, QUIC vs plain TCP carrying the same STEP frames, f32 and bf16
    (bench/hop_ring.py: forwarder processes, zero compute), back to back and paced as
    the swarm's decode (each hop woken from sleep), and what (a)'s swarm would reach if
    every hop cost what plain TCP's does at that pace (`swarm_vs_mono_tcp_bound`) or
    nothing (`swarm_vs_mono_free_links`: its stages' compute alone);
(c) a 20-stage chain of the tiny model, each link given 1-56 ms one way by the delay
    proxy (the seeds' 20-PC fleet), against the bound sum(compute) + sum(delays) of
    the links a token crosses (round the ring: 20, the last stage's link to the first
    going through the client's proxy, so with its delay);
(d) the floor under (a) on this machine: the same three stages as processes over pipes,
    no network and no Sangama code, against the whole model (bench/chain_floor.py:
    `chain_floor_vs_mono`, and `swarm_vs_floor`, the swarm's share of that floor).

Part (a) keeps the whole model loaded beside every swarm at once (idle ones sleep) and
runs one generation of each per round, the swarms in a rotating order, so each ratio,
and each comparison of two swarms, is taken seconds apart; the medians over the rounds
are reported.

    .venv/bin/python bench/swarm.py [--json] [--tokens 48] [--rounds 7] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.client.swarm_client import SwarmClient
from app.lab.local_run import build_pipeline
from app.lab.local_swarm import LocalSwarm
from bench.chain_floor import floor_figures, measure_floor
from bench.hop_ring import measure as measure_hops
from core.models import resolve_model
from core.tokenizer import Tokenizer
from core.types import LayerRange
from net import event_loop
from net.quic.links import DEFAULT_LIBRARY
from net.quic.path_mtu import PROBE_CEILING
from net.wire.tensors import WireDtype

PROMPT = "Write a short story about a lighthouse keeper who befriends a whale."


async def one_generation(client: SwarmClient, prompt: list[int], tokens: int) -> dict[str, Any]:
    """One swarm generation's decode figures (the first event, the prompt, left out)."""
    decode = [ev async for ev in client.generate(prompt, tokens)][1:]
    # Going round the ring (app.serving.links.ring), a token crosses one link per stage; the
    # client's path has one more (client -> first stage, last stage -> client).
    ring = all(e.looped for e in decode[:-1])
    links = len(decode[0].timings) + (0 if ring else 1)
    trip = statistics.median(e.trip_ms for e in decode)
    compute = statistics.median(sum(t.compute_ms for t in e.timings) for e in decode)
    queue = statistics.median(sum(t.queue_ms for t in e.timings) for e in decode)
    return {
        "tokens_per_s": len(decode) / (sum(e.trip_ms for e in decode) / 1e3),
        "trip_ms": trip,
        "compute_ms": compute,
        "queue_ms": queue,
        "per_stage_compute_ms": [
            statistics.median(e.timings[i].compute_ms for e in decode)
            for i in range(len(decode[0].timings))
        ],
        "network_and_handling_ms": trip - compute - queue,
        "per_hop_ms": (trip - compute - queue) / links,
        "ring": float(ring),
        "links": links,
    }


def bound_at_hop_cost(whole_ms: float, swarm: dict[str, Any], hop_ms: float) -> float:
    """The `swarm_vs_mono` a swarm would reach with its measured compute and waiting but
    every hop costing `hop_ms` (plain TCP's at the same pace: what any transport between
    processes costs on this machine; 0: free links), against a whole model at
    `whole_ms` a token."""
    hops = int(swarm["links"])
    stages_ms = float(swarm["compute_ms"]) + float(swarm["queue_ms"])
    return whole_ms / (stages_ms + hops * hop_ms)


def _set_environment(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def _worker_environment(env: dict[str, str | None]) -> Iterator[None]:
    """`env` set (None: unset) while the block runs, as it was afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        _set_environment(env)
        yield
    finally:
        _set_environment(saved)


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, the median over runs (lists element by element)."""
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, list):
            out[key] = [statistics.median(r[key][i] for r in runs) for i in range(len(first))]
        else:
            out[key] = statistics.median(r[key] for r in runs)
    return out


async def paired_rounds(
    model: Path,
    prompt: list[int],
    tokens: int,
    swarms: dict[str, dict[str, Any]],
    rounds: int,
) -> dict[str, Any]:
    """Every swarm side by side, against the whole model loaded beside them: all swarms
    are started first; then each round runs one generation of the whole model (1 and 2
    threads) and one of every swarm, in an order that rotates by a swarm a round. This
    VM's speed moves 2x between minutes (bench/README.md, "Measuring on a noisy
    machine"), so a swarm is divided by the whole model of its own round, seconds apart,
    and the medians of those ratios are reported; and variants of one round are seconds
    apart too, so they can be told apart (run one after the other, minutes apart, they
    could not: docs/decisions/cpu-pinning.md). `swarms`: name -> threads, library, other
    LocalSwarm options and optionally `env`, variables its workers start with (None:
    unset). Only one generation runs at a time; idle workers sleep."""
    whole = {t: await WholeModel.load(model, t) for t in (1, 2)}
    table: dict[str, list[dict[str, Any]]] = {name: [] for name in swarms}
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(_shutdown_all, list(whole.values()))
        for pipe in whole.values():
            await pipe.generate(prompt, 8)  # warm-up
        clients = {
            name: await stack.enter_async_context(_swarm_client(model, kw))
            for name, kw in swarms.items()
        }
        for client in clients.values():
            await one_generation(client, prompt, tokens)  # warm-up
        names = list(swarms)
        for r in range(rounds):
            speeds = await _whole_speeds(whole, prompt, tokens)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                row = {"load_average": os.getloadavg()[0], **speeds}
                row.update(await one_generation(clients[name], prompt, tokens))
                row["swarm_vs_mono"] = (
                    row["tokens_per_s"] / row[f"whole_{swarms[name]['threads']}_threads"]
                )
                row["swarm_vs_mono_2_threads"] = row["tokens_per_s"] / row["whole_2_threads"]
                table[name].append(row)
    every = [r for runs in table.values() for r in runs]
    return {
        "rounds": table,
        "whole_model_tokens_per_s": statistics.median(r["whole_2_threads"] for r in every),
        "whole_model_1_thread_tokens_per_s": statistics.median(r["whole_1_threads"] for r in every),
        "swarm": {name: _medians(runs) for name, runs in table.items()},
    }


@contextlib.asynccontextmanager
async def _swarm_client(model: Path, kw: dict[str, Any]) -> AsyncIterator[SwarmClient]:
    """A started LocalSwarm of `model` as `kw` says (paired_rounds), and its client."""
    options = {k: v for k, v in kw.items() if k not in ("threads", "library", "env", "ring")}
    swarm = LocalSwarm(
        model=str(model),
        cuts=[0, 6, 12, 18],
        threads=kw["threads"],
        quic_library=kw["library"],
        **options,
    )
    with _worker_environment(kw.get("env", {})):  # the workers inherit it at start
        await swarm.start()
    try:
        assert swarm.route is not None and swarm.client_credentials is not None
        async with SwarmClient(
            swarm.client_credentials, swarm.route, swarm.tuning, ring=kw.get("ring", True)
        ) as client:
            yield client
    finally:
        await swarm.stop()
        swarm.cleanup()


async def _whole_speeds(
    whole: dict[int, WholeModel], prompt: list[int], tokens: int
) -> dict[str, float]:
    return {
        f"whole_{t}_threads": (await pipe.generate(prompt, tokens)).decode_tokens_per_s
        for t, pipe in whole.items()
    }


async def _shutdown_all(pipes: list[WholeModel]) -> None:
    for pipe in pipes:
        await pipe.shutdown()


class WholeModel:
    """The whole model in this process, loaded, warmed and run on one thread of its own,
    so the swarm client's links keep being served while it generates.

    One thread, because libgomp keeps a pool of OpenMP threads per thread that starts a
    parallel region, and once the threads it manages outnumber the CPUs every barrier
    spins only 100 turns before it sleeps. Warmed up on the main thread and run on
    another, the whole model had two pools: on a 2-core VM that cut it from 53 to 31
    tok/s at 2 threads, and flattered every `swarm_vs_mono` measured so
    (docs/decisions/one-engine-thread.md)."""

    def __init__(self, pipe: Any, thread: ThreadPoolExecutor) -> None:
        self._pipe = pipe
        self._thread = thread

    @classmethod
    async def load(cls, model: Path, threads: int) -> WholeModel:
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"whole-{threads}")
        pipe = await asyncio.get_running_loop().run_in_executor(
            thread, build_pipeline, [model], [LayerRange(0, 18)], 18, 1024, 64, threads, True
        )
        return cls(pipe, thread)

    async def generate(self, prompt: list[int], tokens: int) -> Any:
        run = self._pipe.generate
        return await asyncio.get_running_loop().run_in_executor(self._thread, run, prompt, tokens)

    async def shutdown(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._pipe.shutdown)
        self._thread.shutdown()


async def wan20(tokens: int, seed: int = 7) -> dict[str, Any]:
    from tests.support.tiny_models import write_tiny_model

    rng = random.Random(seed)
    delays = [float(rng.randint(1, 56)) for _ in range(21)]
    with tempfile.TemporaryDirectory(prefix="sangama-wan20-") as tmp:
        model = write_tiny_model(
            Path(tmp) / "tiny20.gguf", n_layer=20, n_embd=256, n_head=4, n_ff=512
        )
        swarm = LocalSwarm(
            model=str(model),
            cuts=list(range(21)),
            threads=1,
            link_delays_ms=delays,
            n_ctx=512,
            proxy_processes=1,  # the links' emulation is not the client's event loop
        )
        await swarm.start()
        try:
            assert swarm.route is not None and swarm.client_credentials is not None
            async with SwarmClient(
                swarm.client_credentials, swarm.route, step_timeout=30
            ) as client:
                events = [ev async for ev in client.generate([1, 2, 3, 4, 5, 6, 7, 8], tokens)][1:]
            ring = all(e.looped for e in events[:-1])
            # The proxies' own error along a token's path: each link's forward direction
            # (stage 0 -> ... -> last stage, and into stage 0: from the client, or round
            # the ring, whose link from the last stage goes through the client's proxy),
            # and without the ring the last stage's TOKENS back to the client.
            proxies = await swarm.proxy_reports()
            proxy_late = sum(p.late_up.mean_ms for p in proxies[:-1])
            if not ring:
                proxy_late += proxies[-1].late_down.mean_ms
            proxy_late_max = max(max(p.late_up.max_ms, p.late_down.max_ms) for p in proxies)
        finally:
            await swarm.stop()
            swarm.cleanup()
    trip = statistics.median(e.trip_ms for e in events)
    compute = statistics.median(sum(t.compute_ms for t in e.timings) for e in events)
    queue = statistics.median(sum(t.queue_ms for t in e.timings) for e in events)
    # The ring's link from the last stage to the first has the client's link's delay (it
    # goes through that proxy): a token crosses 20 delayed links, not 21.
    path = delays[:-1] if ring else delays
    bound = compute + sum(path)
    links = len(path)
    sangama = trip - bound - proxy_late
    return {
        "stages": 20,
        "ring": ring,
        "link_delays_ms": delays,
        "sum_delays_ms": sum(path),
        # The bound of the path without the ring (client -> first ... last -> client).
        "client_path_bound_ms": compute + sum(delays),
        "compute_ms": compute,
        "bound_ms": bound,
        "trip_ms": trip,
        "overhead_ms": trip - bound,
        # trip - bound = the delay proxies' lateness + Sangama (QUIC, frames, the engine
        # task's wake-up: queue_ms) on every link and stage.
        "proxy_late_ms": proxy_late,
        "proxy_late_max_ms": proxy_late_max,
        "queue_ms": queue,
        "sangama_ms": sangama,
        "sangama_ms_per_hop": sangama / links,
        "wan20_vs_bound": bound / trip,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--hop-frames", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7, help="paired rounds of part (a)")
    ap.add_argument("--quick", action="store_true", help="fewer tokens, frames and rounds")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.hop_frames, args.rounds = 16, 50, 5

    model = resolve_model("gemma-3-270m")
    tok = Tokenizer.from_gguf(model)
    prompt = tok.encode(PROMPT)
    tok.close()
    out: dict[str, Any] = {"model": model.name, "decode_tokens": args.tokens}

    out["loop"] = event_loop.loop_name()
    out["quic_library"] = DEFAULT_LIBRARY
    out["load_average_start"] = os.getloadavg()[0]
    # First, before this process's own generations load the machine.
    floor = measure_floor(threads=2, tokens=32, repeats=3)
    out["floor"] = floor
    other = "aioquic" if DEFAULT_LIBRARY == "qh3" else "qh3"
    configs: dict[str, dict[str, Any]] = {
        f"{DEFAULT_LIBRARY}_threads_1": {"threads": 1, "library": DEFAULT_LIBRARY},
        f"{DEFAULT_LIBRARY}_threads_2": {"threads": 2, "library": DEFAULT_LIBRARY},
        f"{other}_threads_2": {"threads": 2, "library": other},
        # A worker without `--cpus`: every OpenMP team free to wander over the cores.
        "unpinned": {"threads": 2, "library": DEFAULT_LIBRARY, "pin_cpus": False},
        # The client sending every step itself (the path before the ring), for comparison.
        "no_ring": {"threads": 2, "library": DEFAULT_LIBRARY, "ring": False},
    }
    paired = event_loop.run(paired_rounds(model, prompt, args.tokens, configs, args.rounds))
    swarm_runs = paired["swarm"]
    no_ring = swarm_runs.pop("no_ring")
    unpinned = swarm_runs.pop("unpinned")
    default = max(
        (k for k in swarm_runs if k.startswith(DEFAULT_LIBRARY)),
        key=lambda k: swarm_runs[k]["swarm_vs_mono_2_threads"],
    )
    whole = paired["whole_model_tokens_per_s"]
    out["whole_model_tokens_per_s"] = whole
    out["whole_model_1_thread_tokens_per_s"] = paired["whole_model_1_thread_tokens_per_s"]
    out["rounds"] = paired["rounds"]
    out["swarm"] = swarm_runs
    # Medians of per-round ratios: a swarm over the whole model of its own round.
    out["swarm_vs_mono"] = swarm_runs[default]["swarm_vs_mono_2_threads"]
    out["swarm_vs_mono_by_threads"] = {
        "1": swarm_runs[f"{DEFAULT_LIBRARY}_threads_1"]["swarm_vs_mono"],
        "2": swarm_runs[f"{DEFAULT_LIBRARY}_threads_2"]["swarm_vs_mono"],
    }
    out["swarm_unpinned"] = unpinned
    out["swarm_vs_mono_unpinned"] = unpinned["swarm_vs_mono_2_threads"]
    out["swarm_no_ring"] = no_ring
    out["swarm_vs_mono_no_ring"] = no_ring["swarm_vs_mono_2_threads"]
    out[f"swarm_vs_mono_{other}"] = swarm_runs[f"{other}_threads_2"]["swarm_vs_mono_2_threads"]

    hops: dict[str, dict[str, float]] = {}
    for transport in ("quic", other, "tcp"):  # quic = the default library
        for dtype in (WireDtype.F32, WireDtype.BF16):
            hops[f"{transport}_{dtype.name.lower()}"] = event_loop.run(
                measure_hops(transport, 3, dtype, 640, args.hop_frames, PROBE_CEILING)
            )
    out["hops"] = hops
    out["hop_ms_quic"] = hops["quic_f32"]["hop_ms"]
    out["hop_ms_tcp"] = hops["tcp_f32"]["hop_ms"]
    out[f"hop_ms_{other}"] = hops[f"{other}_f32"]["hop_ms"]
    out["hop_cpu_ms_quic"] = hops["quic_f32"]["cpu_ms_per_hop"]
    out["hop_cpu_ms_tcp"] = hops["tcp_f32"]["cpu_ms_per_hop"]
    # The same ring paced as the default swarm's decode (one frame a trip): every hop is
    # then woken from sleep, as a swarm's are between tokens.
    chosen = swarm_runs[default]
    gap_ms = chosen["trip_ms"]
    cadence = {
        transport: event_loop.run(
            measure_hops(
                transport,
                3,
                WireDtype.F32,
                640,
                args.hop_frames // 2,
                PROBE_CEILING,
                gap_s=gap_ms / 1e3,
            )
        )
        for transport in ("quic", "tcp")
    }
    out["cadence"] = {"gap_ms": gap_ms, **cadence}
    out["hop_ms_quic_cadence"] = cadence["quic"]["hop_ms"]
    out["hop_ms_tcp_cadence"] = cadence["tcp"]["hop_ms"]
    whole_ms = 1e3 / statistics.median(r["whole_2_threads"] for r in paired["rounds"][default])
    out["swarm_vs_mono_tcp_bound"] = bound_at_hop_cost(whole_ms, chosen, cadence["tcp"]["hop_ms"])
    out["swarm_vs_mono_free_links"] = bound_at_hop_cost(whole_ms, chosen, 0.0)

    w = event_loop.run(wan20(args.tokens))
    out["load_average_end"] = os.getloadavg()[0]
    out["wan20"] = w
    out["wan20_vs_bound"] = w["wan20_vs_bound"]
    out.update(floor_figures(floor["chain_vs_whole"], out["swarm_vs_mono"]))

    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"(a) decode, {model.name}, {args.tokens} tokens, medians of {args.rounds} rounds "
        "(each swarm against the whole model of its own round)"
    )
    print(f"  whole model (1 process, 2 threads)   {whole:7.1f} tok/s")
    print(
        "  whole model (1 process, 1 thread)    "
        f"{out['whole_model_1_thread_tokens_per_s']:7.1f} tok/s"
    )
    shown = {**swarm_runs, "unpinned": unpinned, "no_ring": no_ring}
    for name, r in shown.items():
        print(
            f"  swarm, 3 processes, {name:18} {r['tokens_per_s']:7.1f} tok/s   "
            f"trip {r['trip_ms']:.2f} ms = compute {r['compute_ms']:.2f} + "
            f"waiting {r['queue_ms']:.2f} + network/handling "
            f"{r['network_and_handling_ms']:.2f} ({r['per_hop_ms']:.2f} per hop)"
        )
    print(
        f"  swarm_vs_mono {out['swarm_vs_mono']:.2f} ({DEFAULT_LIBRARY}), "
        f"{out[f'swarm_vs_mono_{other}']:.2f} ({other}); "
        f"same threads: 1 {out['swarm_vs_mono_by_threads']['1']:.2f}, "
        f"2 {out['swarm_vs_mono_by_threads']['2']:.2f}; "
        f"unpinned {out['swarm_vs_mono_unpinned']:.2f}; "
        f"the client sending every step (no ring) {out['swarm_vs_mono_no_ring']:.2f}"
    )
    print(
        f"(b) per-hop software cost, one 640-wide row, 3 forwarders (4 links); "
        f"quic = {DEFAULT_LIBRARY}, loop {out['loop']}"
    )
    for k, r in hops.items():
        print(
            f"  {k:12} {r['hop_ms']:.3f} ms per hop, {r['cpu_ms_per_hop']:.3f} ms CPU "
            f"({r['frame_bytes']} B frames)"
        )
    c = out["cadence"]
    print(
        f"  paced as the swarm's decode (a frame every {c['gap_ms']:.1f} ms, each hop woken "
        f"from sleep): quic {c['quic']['hop_ms']:.3f} ms per hop "
        f"({c['quic']['cpu_ms_per_hop']:.3f} CPU), tcp {c['tcp']['hop_ms']:.3f} "
        f"({c['tcp']['cpu_ms_per_hop']:.3f} CPU); (a)'s swarm with every hop at tcp's cost: "
        f"swarm_vs_mono {out['swarm_vs_mono_tcp_bound']:.2f}, with free links "
        f"{out['swarm_vs_mono_free_links']:.2f}"
    )
    path = "round the ring, 20 links" if w["ring"] else "client's path, 21 links"
    print(f"(c) 20 stages, tiny model, 1-56 ms per link ({path})")
    print(
        f"  trip {w['trip_ms']:.1f} ms; bound {w['bound_ms']:.1f} ms "
        f"(compute {w['compute_ms']:.1f} + delays {w['sum_delays_ms']:.0f}); "
        f"wan20_vs_bound {w['wan20_vs_bound']:.3f}; the client's path's bound "
        f"{w['client_path_bound_ms']:.1f} ms"
    )
    print(
        f"  over the bound {w['overhead_ms']:.1f} ms = delay proxies late "
        f"{w['proxy_late_ms']:.1f} + Sangama {w['sangama_ms']:.1f} "
        f"({w['sangama_ms_per_hop']:.2f} per hop; engine wake-ups {w['queue_ms']:.1f})"
    )
    f = out["floor"]
    print(
        f"(d) the floor: the same 3 stages as processes over pipes, no network, "
        f"{f['threads']} threads, {f['cpus']} CPUs"
    )
    print(
        f"  whole model {f['whole_ms']:.2f} ms a token, chain {f['chain_ms']:.2f} "
        f"({' / '.join(f'{x:.2f}' for x in f['chain_step_ms'])}), same tokens "
        f"{f['same_tokens']}: chain_floor_vs_mono {out['chain_floor_vs_mono']:.3f}; "
        f"swarm_vs_floor {out['swarm_vs_floor']:.3f}; the {out['goal']:.2f} goal "
        f"{'is' if out['goal_within_floor'] else 'is not'} within this machine's floor"
    )
    print(f"  load average {out['load_average_start']:.2f} -> {out['load_average_end']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
