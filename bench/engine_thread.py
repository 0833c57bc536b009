"""A worker's CPU by thread, against the same stage files stepped alone, in one run.

Taken in separate runs at different loads, a worker's engine thread seemed to spend 2-3 ms
a token more than `Stage.step` of the same stage file costs alone. This takes both in one
run, one after the other, so they can be compared:

- `swarm`: Gemma 3 270M split 6/6/6 (bench/rpc_compare.py's cuts), one thread a stage,
  repacking off, no delay proxies; CPU per decoded token of every worker thread, from
  /proc/<pid>/task/<tid>/schedstat (time on a CPU, ns): the process's own thread runs
  the event loop, the busiest other one is the engine thread; and the sleeps a token of
  both (voluntary context switches, from .../status: each one a wake-up later);
- `alone`: the same stage files in this process, `Stage.step` of one row a stage and a
  token, the thread's CPU time around each step (`time.thread_time`).

    .venv/bin/python bench/engine_thread.py [--json] [--tokens 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.rpc_compare import CUTS, prompt_ids, sangama_swarm
from bench.token_parts import _children


def _per_thread(pid: int, read: Callable[[Path], float]) -> dict[str, float]:
    """`read(task_dir)` of each thread of `pid`, keyed `name-tid` (the main thread:
    `loop`, the worker's event loop); threads that end meanwhile are left out."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        task = Path(f"/proc/{pid}/task/{tid}")
        try:
            name = (task / "comm").read_text().strip()
            value = read(task)
        except OSError:
            continue  # the thread ended
        out["loop" if int(tid) == pid else f"{name}-{tid}"] = value
    return out


def thread_cpu_ms(pid: int) -> dict[str, float]:
    """CPU time so far of each thread of `pid`, ms (schedstat: time on a CPU, ns)."""
    return _per_thread(pid, lambda task: int((task / "schedstat").read_text().split()[0]) / 1e6)


def _voluntary_switches(task: Path) -> float:
    status = (task / "status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("voluntary_ctxt_switches"))
    return float(line.split()[1])


def thread_sleeps(pid: int) -> dict[str, float]:
    """Voluntary context switches so far of each thread of `pid` (each one a sleep: in
    epoll, a futex, the GIL): every sleep is a wake-up later, and on a machine shared by
    several stages a wake-up waits for a core."""
    return _per_thread(pid, _voluntary_switches)


def _stage_of(pid: int) -> int:
    """The stage index a worker serves, from its config file's name (stageN.toml)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    config = next(a for a in argv if a.endswith(b".toml"))
    return int(Path(config.decode()).stem.removeprefix("stage"))


async def swarm_threads(model: Path, tokens: int, rounds: int) -> dict[str, Any]:
    """Per stage: CPU ms a token of each worker thread (the best of `rounds` generations)."""
    prompt = prompt_ids(model)
    async with sangama_swarm(model, threads=1) as client:
        workers = sorted(_children(), key=_stage_of)
        _ = [ev async for ev in client.generate(prompt, 4)]  # engine threads started
        best: dict[str, Any] = {}
        for _ in range(rounds):
            before = [thread_cpu_ms(p) for p in workers]
            sleeps_before = [thread_sleeps(p) for p in workers]
            events = [ev async for ev in client.generate(prompt, tokens + 1)]
            after = [thread_cpu_ms(p) for p in workers]
            sleeps_after = [thread_sleeps(p) for p in workers]
            n = len(events)
            per_stage = [
                {k: (v - b.get(k, 0.0)) / n for k, v in a.items() if v - b.get(k, 0.0) > 0}
                for a, b in zip(after, before, strict=True)
            ]
            total = sum(sum(s.values()) for s in per_stage)
            if not best or total < best["total_ms"]:
                best = {
                    "threads": per_stage,
                    "sleeps": [
                        {k: (v - b.get(k, 0)) / n for k, v in a.items() if v > b.get(k, 0)}
                        for a, b in zip(sleeps_after, sleeps_before, strict=True)
                    ],
                    "total_ms": total,
                    "tokens": [t for e in events for t in e.tokens],
                }
        return best


def alone(model: Path, tokens: int, rounds: int) -> dict[str, Any]:
    """The same stage files stepped in this process: thread CPU ms of each `Stage.step`."""
    import numpy as np

    from app.config import WorkerConfig
    from core.models import stage_files
    from core.stage import Stage, StepFailure, StepRequest
    from core.types import LayerRange, StageSpec

    prompt = prompt_ids(model)
    ranges = LayerRange.from_cuts(CUTS)
    manifest, paths = stage_files(model, ranges)
    stages = [
        Stage.from_file(
            path,
            StageSpec(
                layers,
                manifest.facts.n_layer,
                n_ctx=WorkerConfig.n_ctx,
                n_seq_max=WorkerConfig.max_sessions,
                n_threads=1,
            ),
        )
        for path, layers in zip(paths, ranges, strict=True)
    ]

    def chain(start: int, toks: list[int]) -> tuple[int, list[float]]:
        x: Any = None
        cpu = []
        for i, stage in enumerate(stages):
            if i == 0:
                req = StepRequest("s", start, tokens=np.asarray(toks, dtype=np.int32))
            else:
                req = StepRequest("s", start, hidden=x)
            c0 = time.thread_time()
            (res,) = stage.step([req])
            if isinstance(res, StepFailure):
                raise RuntimeError(f"stage {i}: {res.error}")
            cpu.append((time.thread_time() - c0) * 1e3)
            x = res.hidden if res.hidden is not None else res.logits
        return int(np.argmax(x[-1])), cpu

    try:
        best: dict[str, Any] = {}
        for _ in range(rounds):
            for stage in stages:
                stage.open("s")
            nxt, _ = chain(0, prompt)
            out, per = [nxt], []
            for k in range(tokens):
                nxt, cpu = chain(len(prompt) + k, [nxt])
                per.append(cpu)
                out.append(nxt)
            mean = [statistics.mean(c[i] for c in per) for i in range(len(stages))]
            if not best or sum(mean) < sum(best["step_ms"]):
                best = {"step_ms": mean, "tokens": out}
            for stage in stages:
                stage.close("s")
        return best
    finally:
        for stage in stages:
            stage.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from core.models import GEMMA3, resolve_model

    model = resolve_model(GEMMA3)
    load = [os.getloadavg()[0]]
    swarm = asyncio.run(swarm_threads(model, args.tokens, args.rounds))
    load.append(os.getloadavg()[0])
    solo = alone(model, args.tokens, args.rounds)
    load.append(os.getloadavg()[0])
    stages = []
    for threads, sleeps, step in zip(
        swarm["threads"], swarm["sleeps"], solo["step_ms"], strict=True
    ):
        # The engine thread: the busiest thread besides the loop's (its /proc name is the
        # interpreter's, Python's thread names are not passed to the kernel).
        others = {k: v for k, v in threads.items() if k != "loop"}
        engine = max(others.values(), default=0.0)
        engine_name = max(others, key=lambda k: others[k], default="")
        stages.append(
            {
                "engine_ms": engine,
                "loop_ms": threads.get("loop", 0.0),
                "other_threads_ms": sum(others.values()) - engine,
                "alone_step_ms": step,
                "engine_beyond_step_ms": engine - step,
                "loop_sleeps": sleeps.get("loop", 0.0),
                "engine_sleeps": sleeps.get(engine_name, 0.0),
            }
        )
    n = min(len(swarm["tokens"]), len(solo["tokens"]))
    out = {
        "model": model.name,
        "tokens": args.tokens,
        "loadavg": load,
        "stages": stages,
        "threads": swarm["threads"],
        "same_greedy_tokens": swarm["tokens"][:n] == solo["tokens"][:n],
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"CPU ms a token by thread, {model.name} split {CUTS}, 1 thread, repack 0, "
        f"{args.tokens} tokens; load {' -> '.join(f'{x:.1f}' for x in load)}"
    )
    print(
        f"{'stage':5} {'engine':>7} {'loop':>6} {'other':>6} {'alone':>7} {'engine-alone':>13}"
        f" {'sleeps: loop':>13} {'engine':>7}"
    )
    for i, s in enumerate(stages):
        print(
            f"{i:5} {s['engine_ms']:7.2f} {s['loop_ms']:6.2f} {s['other_threads_ms']:6.2f} "
            f"{s['alone_step_ms']:7.2f} {s['engine_beyond_step_ms']:13.2f}"
            f" {s['loop_sleeps']:13.2f} {s['engine_sleeps']:7.2f}"
        )
    print(f"same greedy tokens: {out['same_greedy_tokens']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
