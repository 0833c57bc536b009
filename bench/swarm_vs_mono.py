"""Part (a) of bench/swarm.py alone, repeated and side by side: the whole model against a
3-process swarm on loopback (Gemma 3 270M, cuts 0/6/12/18), decode tokens/s, with the
workers' OpenMP spin count as a variable (prints a table; --json prints one object).

`swarm_vs_mono` = a swarm's tok/s / the whole model's at 2 threads (one process, OpenMP
defaults), measured in the same round; rounds alternate whole model and swarms so a
shared machine's drift hits both. Each worker reads GOMP_SPINCOUNT from its environment
(app/serving/serve.py sets the shipped default where it is unset); the whole model runs
in this process, whose OpenMP runtime was set up before any swarm.

    .venv/bin/python bench/swarm_vs_mono.py [--json] [--tokens 32] [--rounds 2]
        [--swarm 2 --swarm 2:10000 --swarm 2:default:park --swarm 1]
        # THREADS[:GOMP_SPINCOUNT|default[:park|nopark]]; park: SANGAMA_OMP_PARK=1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.serving.thread_calibration import PARK_ENV
from bench.swarm import PROMPT, swarm_tps, whole_model_tps, worker_environment
from core.models import resolve_model
from core.tokenizer import Tokenizer
from net import event_loop
from net.quic import DEFAULT_LIBRARY

Swarm = tuple[int, str, bool]


def parse_swarm(text: str) -> Swarm:
    threads, _, rest = text.partition(":")
    spin, _, park = rest.partition(":")
    spin = spin or "default"
    if (
        not threads.isdigit()
        or int(threads) < 1
        or not (spin == "default" or spin.isdigit())
        or park not in ("", "park", "nopark")
    ):
        raise argparse.ArgumentTypeError(
            f"a swarm is THREADS[:SPINCOUNT|default[:park|nopark]], not {text!r}"
        )
    return int(threads), spin, park == "park"


def name_of(swarm: Swarm) -> str:
    threads, spin, park = swarm
    return f"{threads}:{spin}" + (":park" if park else "")


def run_swarm(model: Path, prompt: list[int], tokens: int, swarm: Swarm) -> Any:
    threads, spin, park = swarm
    # The workers inherit this environment (spin: libgomp reads it when ggml loads it).
    env = {"GOMP_SPINCOUNT": None if spin == "default" else spin, PARK_ENV: "1" if park else None}
    with worker_environment(env):
        return event_loop.run(swarm_tps(model, prompt, tokens, threads, DEFAULT_LIBRARY))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--swarm", type=parse_swarm, action="append")
    args = ap.parse_args()
    swarms: list[Swarm] = args.swarm or [(2, "default", False), (1, "default", False)]

    model = resolve_model("gemma-3-270m")
    tok = Tokenizer.from_gguf(model)
    prompt = tok.encode(PROMPT)
    tok.close()
    load = [os.getloadavg()[0]]
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        whole = whole_model_tps(model, prompt, args.tokens, threads=2)
        row: dict[str, Any] = {"whole_model_tokens_per_s": whole, "swarms": {}}
        for swarm in swarms:
            r = run_swarm(model, prompt, args.tokens, swarm)
            r["swarm_vs_mono"] = r["tokens_per_s"] / whole
            row["swarms"][name_of(swarm)] = r
        row["load_average"] = os.getloadavg()[0]
        rounds.append(row)
    load.append(os.getloadavg()[0])
    names = [name_of(s) for s in swarms]
    out: dict[str, Any] = {
        "model": model.name,
        "decode_tokens": args.tokens,
        "load_average": load,
        "rounds": rounds,
        "swarm_vs_mono_median": {
            n: statistics.median(r["swarms"][n]["swarm_vs_mono"] for r in rounds) for n in names
        },
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{model.name}, {args.tokens} tokens, swarms as threads:GOMP_SPINCOUNT")
    for i, r in enumerate(rounds):
        print(f"round {i + 1}: whole model, 2 threads {r['whole_model_tokens_per_s']:.1f} tok/s")
        for n in names:
            s = r["swarms"][n]
            stages = " / ".join(f"{x:.2f}" for x in s["per_stage_compute_ms"])
            print(
                f"  swarm {n:12} {s['tokens_per_s']:6.1f} tok/s  vs mono {s['swarm_vs_mono']:.3f}"
                f"  trip {s['trip_ms']:.1f} ms = compute {stages} + links/handling "
                f"{s['network_and_handling_ms']:.1f}"
            )
        print(f"  load average {r['load_average']:.2f}")
    med = ", ".join(f"{n} {v:.3f}" for n, v in out["swarm_vs_mono_median"].items())
    print(f"swarm_vs_mono, median of rounds: {med}; load {load[0]:.2f} -> {load[1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
