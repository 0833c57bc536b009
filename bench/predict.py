"""Predicted against measured tokens/s, at 1 and 16 requests at once (prints a table;
--json prints one object), on the two chains of bench/swarm.py and bench/load.py:

(a) loopback: Gemma 3 270M as three stages on loopback (compute-bound);
(b) wan20: the tiny model as 20 stages, each link 1-56 ms one way through the delay
    proxies (latency-bound).

Each chain runs once (bench/load.py builds it and measures a level: every request a
session of its own, all at once over one client connection). The prediction is
coordinator/server/prediction.py's, fed what the coordinator would hold:

- each stage's step time by rows per step, as its worker's profile records it: the
  steps, read here from the TOKENS timings (the requests that shared an engine step
  carry the same compute_ms, so their count is that step's rows), go through
  core/step_profile.py as the worker's own steps do;
- each link's one-way latency: its configured delay (0 on loopback); the hop's own cost
  is the prediction's DEFAULT_HOP_MS + DEFAULT_ROW_HOP_MS a row.

Two predictions per level: from the step times measured at every level run so far
("live": what the coordinator has while the fleet serves), and from the one-request
run's one-row steps alone ("1-row": what it has before any load). The error is
predicted / measured - 1, against the total decode tokens/s (each request's decode
speed once it runs, summed: bench/load.py's "total").

    .venv/bin/python bench/predict.py [--json] [--quick] [--tokens 16] [--levels 1,16]
        [--settings loopback,wan20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.client.swarm_client import SwarmClient, TokenEvent
from app.lab.local_swarm import LocalSwarm
from bench.load import GEMMA, PROMPTS, _level, loopback, wan20
from coordinator.server.prediction import FleetFacts, Prediction, StageFacts, predict
from core.models import resolve_model
from core.step_profile import StepProfile
from core.tokenizer import Tokenizer

GOAL = 0.10
"""Within 10 % of the measured total."""


def steps_of(events: list[TokenEvent], stage: int) -> list[tuple[int, float]]:
    """One stage's engine steps, (rows, ms), in the order first seen: the decode rows
    that shared a step carry the same compute_ms (the worker stamps every row of a batch
    with it)."""
    shared: dict[float, int] = defaultdict(int)
    for e in events:
        shared[e.timings[stage].compute_ms] += 1
    return [(rows, ms) for ms, rows in shared.items()]


def profile(steps: list[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """What the stage's worker reports of these steps (core/step_profile.py)."""
    recorder = StepProfile()
    for rows, ms in steps:
        recorder.observe(rows, ms)
    return recorder.points()


def links_of(swarm: LocalSwarm) -> tuple[float, ...]:
    """One-way latency of each ring link: stage i -> i+1 through the proxy in front of
    i+1, and the last stage -> the first through the client's proxy (LocalSwarm), which
    is where the ring's link dials."""
    delays = swarm.link_delays_ms
    n = len(swarm.cuts) - 1
    if delays is None:
        return (0.0,) * n
    return (*delays[1:n], delays[0])


def facts(swarm: LocalSwarm, observed: list[list[tuple[int, float]]]) -> FleetFacts:
    stages = tuple(
        StageFacts(f"stage{i}", profile(obs), max_sessions=swarm.max_sessions)
        for i, obs in enumerate(observed)
    )
    return FleetFacts(stages, links_of(swarm))


def _prediction_row(p: Prediction, k: int) -> dict[str, Any]:
    (lv,) = [lv for lv in p.levels if lv.requests == k]
    return {
        "tokens_per_s": lv.tokens_per_s,
        "round_ms": lv.round_ms,
        "rows_per_step": lv.rows_per_step,
        "bound": lv.bound,
    }


async def run_setting(
    name: str, swarm: LocalSwarm, prompts: list[list[int]], levels: list[int], tokens: int
) -> dict[str, Any]:
    n = len(swarm.cuts) - 1
    observed: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    one_row: FleetFacts | None = None
    rows: list[dict[str, Any]] = []
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
            [ev async for ev in client.generate(prompts[0], 4)]  # warm-up
            no_solo: list[list[int]] = [[] for _ in prompts]
            for k in levels:
                level = await _level(swarm, client, prompts, no_solo, k, tokens, keep_events=True)
                events: list[TokenEvent] = level.pop("_events")
                steps = [steps_of(events, i) for i in range(n)]
                for i in range(n):
                    observed[i].extend(steps[i])
                if one_row is None:
                    one_row = facts(swarm, observed)
                live = predict(facts(swarm, observed), levels=(k,))
                base = predict(one_row, levels=(k,))
                measured = level["total_tokens_per_s"]
                p_live, p_base = _prediction_row(live, k), _prediction_row(base, k)
                rows.append(
                    {
                        "requests": k,
                        "measured_tokens_per_s": measured,
                        "measured_wall_tokens_per_s": level["wall_tokens_per_s"],
                        "measured_trip_ms": level["stages"].get("trip_ms", 0.0),
                        "measured_rows_per_step": [
                            statistics.median(r for r, _ in steps[i]) for i in range(n)
                        ],
                        "compute_ms": level["stages"].get("compute_ms", []),
                        "predicted": p_live,
                        "predicted_1_row": p_base,
                        "error": p_live["tokens_per_s"] / measured - 1 if measured else None,
                        "error_1_row": p_base["tokens_per_s"] / measured - 1 if measured else None,
                        "machine_busy": level["machine_busy"],
                        "chain_cpu_share": level["machine_cpu_share"],
                        "load_average": level["load_average"][0],
                    }
                )
                print(_row_text(name, rows[-1]), file=sys.stderr, flush=True)
    finally:
        await swarm.stop()
        swarm.cleanup()
    return {
        "setting": name,
        "stages": n,
        "tokens": tokens,
        "link_delay_ms": sum(links_of(swarm)),
        "profile": [list(profile(obs)) for obs in observed],
        "levels": rows,
    }


def _row_text(name: str, r: dict[str, Any]) -> str:
    p, b = r["predicted"], r["predicted_1_row"]
    err = "n/a" if r["error"] is None else f"{r['error']:+.1%}"
    err1 = "n/a" if r["error_1_row"] is None else f"{r['error_1_row']:+.1%}"
    rows = "/".join(f"{x:.0f}" for x in r["measured_rows_per_step"][:3])
    more = "/..." if len(r["measured_rows_per_step"]) > 3 else ""
    return (
        f"  {name:8} {r['requests']:4d}  measured {r['measured_tokens_per_s']:7.2f} "
        f"(trip {r['measured_trip_ms']:7.1f} ms, rows a step {rows}{more})  predicted "
        f"{p['tokens_per_s']:7.2f} (round {p['round_ms']:7.1f} ms, {p['bound']}) {err:>7}  "
        f"from 1-row steps {b['tokens_per_s']:7.2f} {err1:>7}  | machine "
        f"{r['machine_busy']:.0%} busy, chain {r['chain_cpu_share']:.0%}, load "
        f"{r['load_average']}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="8 tokens a request")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--levels", default="1,16")
    ap.add_argument("--settings", default="loopback,wan20")
    args = ap.parse_args()
    if args.quick:
        args.tokens = 8
    levels = [int(x) for x in args.levels.split(",") if x]
    if any(not 1 <= k <= 256 for k in levels):
        ap.error("levels must lie in 1..256 (a stage holds 256 sessions)")
    settings = [s for s in args.settings.split(",") if s]
    out: dict[str, Any] = {"levels": levels, "tokens": args.tokens, "cores": os.cpu_count()}
    out["settings"] = []
    print("  setting  reqs  measured total tok/s ... predicted ... error", file=sys.stderr)
    if "loopback" in settings:
        tok = Tokenizer.from_gguf(resolve_model(GEMMA))
        prompts = [tok.encode(p) for p in PROMPTS]
        tok.close()
        swarm = loopback(levels, args.tokens)
        out["settings"].append(
            asyncio.run(run_setting("loopback", swarm, prompts, levels, args.tokens))
        )
    if "wan20" in settings:
        from tests.support.tiny_models import write_tiny_model

        with tempfile.TemporaryDirectory(prefix="sangama-predict-") as tmp:
            model = write_tiny_model(
                Path(tmp) / "tiny20.gguf", n_layer=20, n_embd=256, n_head=4, n_ff=512
            )
            prompts = [[1 + (k * 31 + j * 7) % 500 for j in range(8)] for k in range(8)]
            swarm = wan20(levels, args.tokens, model)
            out["settings"].append(
                asyncio.run(run_setting("wan20", swarm, prompts, levels, args.tokens))
            )
    errors = [
        abs(r["error"]) for s in out["settings"] for r in s["levels"] if r["error"] is not None
    ]
    out["worst_error"] = max(errors, default=None)
    out["goal"] = GOAL
    out["goal_met"] = bool(errors) and max(errors) <= GOAL
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print("  setting  reqs  measured total tok/s ... predicted ... error")
    for s in out["settings"]:
        for r in s["levels"]:
            print(_row_text(s["setting"], r))
    worst = out["worst_error"]
    print(
        f"  worst error {'n/a' if worst is None else f'{worst:.1%}'} "
        f"(goal {GOAL:.0%}: {'met' if out['goal_met'] else 'not met'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
