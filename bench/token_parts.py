"""One decoded token taken apart, Sangama vs llama.cpp RPC, side by side in one run.

The setting of bench/rpc_compare.py at one delay (0 ms by default): Gemma 3 270M split
6/6/6, one thread a stage or server, repacking off on both, every link through the same
delay lanes. Per token (the median of the best of two generations):

- `whole model`: this process, `llama_decode` of all 18 blocks and the head plus the
  argmax, the same kernels and threads: the compute either system cannot avoid;
- CPU time per token of every process (and, for the whole model, of this one): on a
  shared machine wall time grows with the load, CPU time much less, so these are the
  figures to compare across runs;
- Sangama: each stage's compute as its worker times it (`compute_ms`: the hand-off to
  the engine thread, `Stage.step`, back), its queue, its hold (arrival to send, which
  adds the frame encode and, on the last stage, sampling), and the rest of the trip
  (links, proxies, the client's frame work and wake-ups);
- RPC: the client's time per token (`1 / tok/s`), less the whole model's compute.

    .venv/bin/python bench/token_parts.py [--json] [--delay 0] [--tokens 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.rpc_client import cpu_ms
from bench.rpc_compare import prompt_ids, rpc_run, sangama_swarm


def _children() -> list[int]:
    """This process's child processes (the swarm's workers), by /proc."""
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == me:
                out.append(int(entry))
    return out


def whole_model_ms(model: Path, tokens: int, threads: int) -> dict[str, float]:
    """The whole model in this process: per decoded token, llama_decode and the argmax."""
    import numpy as np

    from core.llama_engine import EngineConfig, LlamaStageEngine

    prompt = prompt_ids(model)
    engine = LlamaStageEngine(model, EngineConfig(n_ctx=512, n_batch=64, n_threads=threads))
    try:
        best: dict[str, float] = {}
        for _ in range(2):
            engine.clear()
            n = len(prompt)
            outputs = np.zeros(n, dtype=np.bool_)
            outputs[-1] = True
            engine.decode(
                np.arange(n, dtype=np.int32), np.zeros(n, dtype=np.int32), outputs,
                tokens=np.asarray(prompt, dtype=np.int32),
            )  # fmt: skip
            nxt = engine.argmax_rows()[0]
            decode, total = [], []
            c0 = time.process_time()
            for pos in range(n, n + tokens):
                t0 = time.perf_counter()
                engine.decode(
                    np.array([pos], dtype=np.int32), np.zeros(1, dtype=np.int32),
                    np.ones(1, dtype=np.bool_), tokens=np.array([nxt], dtype=np.int32),
                )  # fmt: skip
                nxt = engine.argmax_rows()[0]
                total.append((time.perf_counter() - t0) * 1e3)
                decode.append(engine.last_decode_s * 1e3)
            run = {
                "decode_ms": statistics.median(decode),
                "token_ms": statistics.median(total),
                "cpu_ms": (time.process_time() - c0) * 1e3 / tokens,
            }
            if not best or run["token_ms"] < best["token_ms"]:
                best = run
        return best
    finally:
        engine.close()


async def sangama_parts(model: Path, delay_ms: float, tokens: int, threads: int) -> dict[str, Any]:
    prompt = prompt_ids(model)
    async with sangama_swarm(model, threads, delay_ms) as client:
        best: dict[str, Any] = {}
        workers = _children()
        for _ in range(2):  # the first run warms caches and congestion windows
            c0, w0 = time.process_time(), [cpu_ms(p) for p in workers]
            events = [ev async for ev in client.generate(prompt, tokens + 1)]
            n_ev = len(events)
            cpu = {
                "client_and_proxies": (time.process_time() - c0) * 1e3 / n_ev,
                "workers": sorted((cpu_ms(p) - w) / n_ev for p, w in zip(workers, w0, strict=True)),
            }
            decode = events[1:]
            n_stages = len(decode[0].timings)
            compute = [statistics.median(e.timings[s].compute_ms for e in decode)
                       for s in range(n_stages)]  # fmt: skip
            queue = [statistics.median(e.timings[s].queue_ms for e in decode)
                     for s in range(n_stages)]  # fmt: skip
            hold = [statistics.median(e.timings[s].recv_to_send_ms for e in decode)
                    for s in range(n_stages)]  # fmt: skip
            rest = statistics.median(
                e.trip_ms - sum(t.recv_to_send_ms for t in e.timings) for e in decode
            )
            run = {
                "tok_s": len(decode) / (sum(e.trip_ms for e in decode) / 1e3),
                "trip_ms": statistics.median(e.trip_ms for e in decode),
                "compute_ms": compute,
                "queue_ms": queue,
                "hold_ms": hold,
                "links_and_client_ms": rest,
                "cpu_ms_per_token": cpu,
                "tokens": [t for e in events for t in e.tokens],
            }
            if not best or run["tok_s"] > best["tok_s"]:
                best = run
        return best


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--delay", type=float, default=0.0, help="one-way ms per link")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from bench.rpc_build import build
    from core.models import GEMMA3, resolve_model

    binaries = build(os.cpu_count() or 2)
    model = resolve_model(GEMMA3)
    load = [os.getloadavg()[0]]
    whole = whole_model_ms(model, args.tokens, args.threads)
    ours = asyncio.run(sangama_parts(model, args.delay, args.tokens, args.threads))
    rpc = rpc_run(
        binaries["libggml-rpc.so"], binaries["ggml-rpc-server"], model, args.delay,
        args.tokens, args.threads, 0,
    )  # fmt: skip
    theirs, their_tokens = float(rpc["tokens_per_s"]), [int(t) for t in rpc["tokens"]]
    load.append(os.getloadavg()[0])
    rpc_ms = 1e3 / theirs
    out = {
        "model": model.name,
        "delay_ms": args.delay,
        "tokens": args.tokens,
        "threads": args.threads,
        "loadavg": load,
        "whole": whole,
        "sangama": {k: v for k, v in ours.items() if k != "tokens"},
        "sangama_ms_per_token": 1e3 / ours["tok_s"],
        "rpc_tok_s": theirs,
        "rpc_ms_per_token": rpc_ms,
        "rpc_beyond_whole_ms": rpc_ms - whole["token_ms"],
        "rpc_cpu_ms_per_token": rpc.get("cpu_ms_per_token", {}),
        "same_greedy_tokens": ours["tokens"][: len(their_tokens)]
        == their_tokens[: len(ours["tokens"])],
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    s = out["sangama"]
    print(
        f"One token at {args.delay:g} ms one way, {model.name}, {args.threads} thread(s), "
        f"repack 0, {args.tokens} tokens; load {load[0]:.1f} -> {load[1]:.1f}"
    )
    print(f"whole model here: llama_decode {whole['decode_ms']:.2f} ms, with argmax "
          f"{whole['token_ms']:.2f} ms, CPU {whole['cpu_ms']:.1f} ms a token")  # fmt: skip
    print(f"Sangama: {out['sangama_ms_per_token']:.2f} ms a token (trip median "
          f"{s['trip_ms']:.2f})")  # fmt: skip
    for i, (c, q, h) in enumerate(zip(s["compute_ms"], s["queue_ms"], s["hold_ms"], strict=True)):
        print(f"  stage {i}: compute {c:.2f}  queue {q:.2f}  hold {h:.2f} ms")
    print(f"  compute summed {sum(s['compute_ms']):.2f}, holds summed {sum(s['hold_ms']):.2f}, "
          f"links + client {s['links_and_client_ms']:.2f} ms")  # fmt: skip
    cpu = s["cpu_ms_per_token"]
    print(f"  CPU ms a token: workers {' / '.join(f'{c:.1f}' for c in cpu['workers'])} "
          f"(sorted), client and proxies {cpu['client_and_proxies']:.1f}")  # fmt: skip
    rcpu = out["rpc_cpu_ms_per_token"]
    if rcpu:
        print(f"  RPC CPU ms a token: servers {' / '.join(f'{c:.1f}' for c in rcpu['servers'])},"
              f" client {rcpu['client']:.1f}")  # fmt: skip
    print(f"RPC: {rpc_ms:.2f} ms a token ({theirs:.2f} tok/s), "
          f"{out['rpc_beyond_whole_ms']:.2f} ms beyond the whole model's compute")  # fmt: skip
    print(f"same greedy tokens: {out['same_greedy_tokens']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
