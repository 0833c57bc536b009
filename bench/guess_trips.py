"""Where a guessed trip's time goes, against a plain trip, on one chain (table; --json).

One generation alternates plain steps and steps carrying k guesses (the guesses are the
newest token repeated, so most are rejected and every stage also cuts its cache on the
next step: the worst case a wrong guess costs). For each kind of trip, medians of:

- per stage: compute (the engine step, k+1 rows against 1), queue (arrival to compute)
  and arrival-to-send (what the stage held the step), from the TOKENS' stage timings;
- the network: the trip less every stage's arrival-to-send (links, QUIC, the delay
  proxies in this process), and the bytes and datagrams the delay proxies forwarded;
- the client: time to propose the guesses (n-gram lookup over the whole history).

The undo (keep_until -> seq_rm) is timed inside every worker's stage (`Stage.stats`);
bench/guesses.py prints it per stage.

    .venv/bin/python bench/guess_trips.py [--chain wan20|wan18_gemma|gemma3] [--guesses 4]
                                          [--trips 24] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import app.session.guess_tracker as ngram_module
from app.client.swarm_client import SwarmClient, TokenEvent
from app.lab.local_swarm import LocalSwarm
from core.guessing import GuessPolicy, ngram_guesses
from core.models import GEMMA3, resolve_model
from core.tokenizer import Tokenizer
from core.types import SamplingParams
from net import wire
from net.wire.tensors import WireDtype, encode_rows

PROMPT = (
    "def area_circle(r):\n    return 3.14159 * r * r\n\n"
    "def area_square(s):\n    return s * s\n\ndef perimeter_circle(r):\n"
)


def wan_delays(n_links: int, seed: int = 7) -> list[float]:
    """The WAN chains' one-way link delays, 1-56 ms (as bench/guesses.py draws them)."""
    import random

    rng = random.Random(seed)
    return [float(rng.randint(1, 56)) for _ in range(n_links)]


def _every_other(k: int) -> Any:
    """A proposer guessing on every second step: plain and guessed trips interleave, so
    both kinds see the same load."""
    calls = [0]

    def propose(history: Sequence[int], want: int) -> tuple[int, ...]:
        calls[0] += 1
        return (history[-1],) * k if calls[0] % 2 == 0 and want else ()

    return propose


def _frame_bytes(rows: int, width: int, stages: int) -> int:
    """One hop's STEP frame for `rows` f32 rows (timings of the stages before it aside)."""
    step = wire.Step(
        "0" * 32, 1, 100, tuple(range(rows)),
        encode_rows(__import__("numpy").zeros((rows, width), "float32"), WireDtype.F32),
        rows, width, WireDtype.F32, guesses=tuple(range(rows - 1)), keep_until=99,
        timings=tuple(wire.StageTiming(i, 1.0, 1.0, 1.0) for i in range(stages // 2)),
    )  # fmt: skip
    return len(wire.encode(step))


def _stage_medians(events: list[TokenEvent]) -> list[dict[str, float]]:
    n = min(len(e.timings) for e in events)
    out = []
    for i in range(n):
        out.append(
            {
                "compute_ms": statistics.median(e.timings[i].compute_ms for e in events),
                "queue_ms": statistics.median(e.timings[i].queue_ms for e in events),
                "held_ms": statistics.median(e.timings[i].recv_to_send_ms for e in events),
            }
        )
    return out


def summarize(events: list[TokenEvent]) -> dict[str, Any]:
    """Medians over trips of one kind: the trip, the stages' share and the network's."""
    stages = _stage_medians(events)
    held = [sum(t.recv_to_send_ms for t in e.timings) for e in events]
    return {
        "trips": len(events),
        "trip_ms": statistics.median(e.trip_ms for e in events),
        "stages_held_ms": statistics.median(held),
        "network_ms": statistics.median(e.trip_ms - h for e, h in zip(events, held, strict=True)),
        "compute_ms_sum": sum(s["compute_ms"] for s in stages),
        "queue_ms_sum": sum(s["queue_ms"] for s in stages),
        "per_stage": stages,
    }


async def profile(swarm: LocalSwarm, prompt: list[int], k: int, trips: int) -> dict[str, Any]:
    assert swarm.route is not None and swarm.client_credentials is not None
    before = [p.stats for p in swarm.proxies]
    original = ngram_module.__dict__["ngram_guesses"]
    ngram_module.__dict__["ngram_guesses"] = _every_other(k)  # the tracker's proposer
    try:
        async with SwarmClient(
            swarm.client_credentials, swarm.route, swarm.tuning, step_timeout=120
        ) as client:
            events = [
                ev
                async for ev in client.generate(
                    prompt, trips + 1, SamplingParams(), guesses=GuessPolicy.fixed(k)
                )
            ]
    finally:
        ngram_module.__dict__["ngram_guesses"] = original
    after = [p.stats for p in swarm.proxies]
    decode = events[1:]
    plain = [e for e in decode if e.n_guesses == 0]
    guessed = [e for e in decode if e.n_guesses > 0]
    history = prompt + [t for e in events for t in e.tokens]
    started = time.perf_counter()
    for _ in range(200):
        ngram_guesses(history, k)
    propose_ms = (time.perf_counter() - started) * 1e3 / 200
    moved = sum(a.up_bytes + a.down_bytes - b.up_bytes - b.down_bytes
                for a, b in zip(after, before, strict=True))  # fmt: skip
    packets = sum(a.up_packets + a.down_packets - b.up_packets - b.down_packets
                  for a, b in zip(after, before, strict=True))  # fmt: skip
    late = [max(p.late_up.mean_ms, p.late_down.mean_ms) for p in swarm.proxies]
    return {
        "guesses": k,
        "plain": summarize(plain),
        "guessed": summarize(guessed),
        "propose_ms": propose_ms,
        "proxy_bytes_per_trip": moved / max(1, len(decode)),
        "proxy_packets_per_trip": packets / max(1, len(decode)),
        "proxy_late_ms_max": max(late) if late else 0.0,
    }


def _print(out: dict[str, Any]) -> None:
    p, g = out["plain"], out["guessed"]
    print(f"{out['chain']}: plain trips vs trips with {out['guesses']} guesses (medians)")
    print(f"  trip             {p['trip_ms']:8.1f} ms  {g['trip_ms']:8.1f} ms")
    print(f"  stages held      {p['stages_held_ms']:8.1f} ms  {g['stages_held_ms']:8.1f} ms")
    print(f"  of it compute    {p['compute_ms_sum']:8.1f} ms  {g['compute_ms_sum']:8.1f} ms")
    print(f"  of it queue      {p['queue_ms_sum']:8.1f} ms  {g['queue_ms_sum']:8.1f} ms")
    print(f"  network          {p['network_ms']:8.1f} ms  {g['network_ms']:8.1f} ms")
    print(f"  frame per hop    {out['frame_bytes_plain']:8d} B   {out['frame_bytes_guessed']:8d} B")
    print("  per stage: compute plain/guessed, held plain/guessed (ms)")
    for i, (a, b) in enumerate(zip(p["per_stage"], g["per_stage"], strict=True)):
        print(
            f"    stage {i:2}  {a['compute_ms']:7.2f} / {b['compute_ms']:7.2f}   "
            f"{a['held_ms']:7.2f} / {b['held_ms']:7.2f}"
        )
    print(
        f"  client proposal {out['propose_ms']:.3f} ms; proxies moved "
        f"{out['proxy_bytes_per_trip']:.0f} B and {out['proxy_packets_per_trip']:.0f} datagrams "
        f"per trip, at most {out['proxy_late_ms_max']:.2f} ms late on average"
    )
    print(f"load average {' '.join(out['load_average'])}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.tiny_models import write_tiny_model

    gemma = resolve_model(GEMMA3)
    tok = Tokenizer.from_gguf(gemma)
    ids = tok.encode(PROMPT)
    tok.close()
    with tempfile.TemporaryDirectory(prefix="sangama-guess-trips-") as tmp:
        if args.chain == "wan20":
            model = str(write_tiny_model(Path(tmp) / "t.gguf", n_layer=20, n_embd=256,
                                         n_head=4, n_ff=512))  # fmt: skip
            cuts, delays, width = list(range(21)), wan_delays(21), 256
            ids = [1 + i % 511 for i in ids]
        elif args.chain == "wan18_gemma":
            d = wan_delays(21)
            model, cuts, delays, width = str(gemma), list(range(19)), d[:18] + d[-1:], 640
        else:
            model, cuts, delays, width = str(gemma), [0, 6, 12, 18], None, 640
        swarm = LocalSwarm(model=model, cuts=cuts, threads=1, link_delays_ms=delays, n_ctx=1024)
        try:
            await swarm.start(ready_timeout=900)
            out = await profile(swarm, ids, args.guesses, args.trips)
        finally:
            await swarm.stop()
            swarm.cleanup()
    out["chain"] = args.chain
    out["frame_bytes_plain"] = _frame_bytes(1, width, len(cuts) - 1)
    out["frame_bytes_guessed"] = _frame_bytes(args.guesses + 1, width, len(cuts) - 1)
    with open("/proc/loadavg", encoding="ascii") as f:
        out["load_average"] = f.read().split()[:3]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--chain", default="wan20", choices=("wan20", "wan18_gemma", "gemma3"))
    ap.add_argument("--guesses", type=int, default=4)
    ap.add_argument("--trips", type=int, default=24)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    print(json.dumps(out, indent=1)) if args.json else _print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
