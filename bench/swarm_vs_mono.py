"""Part (a) of bench/swarm.py alone, repeated and side by side: the whole model against a
3-process swarm on loopback (Gemma 3 270M, cuts 0/6/12/18), decode tokens/s, with the
workers' OpenMP spin count as a variable (prints a table; --json prints one object).

`swarm_vs_mono` = a swarm's tok/s / the whole model's at 2 threads (one process, OpenMP
defaults) of the same round, seconds apart (bench/swarm.py's `paired_rounds`: every
swarm started, each round one generation of the whole model, then one of each swarm in
a rotating order), so a shared machine's drift hits all of them; medians over the
rounds. Each worker reads
GOMP_SPINCOUNT from its environment (app/serving/serve.py sets the shipped default where
it is unset); the whole model runs in this process, whose OpenMP runtime was set up
before any swarm.

    .venv/bin/python bench/swarm_vs_mono.py [--json] [--tokens 32] [--rounds 5]
        [--swarm 2 --swarm 2:10000 --swarm 1]  # THREADS[:GOMP_SPINCOUNT|default]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.swarm import PROMPT, paired_rounds
from core.models import resolve_model
from core.tokenizer import Tokenizer
from net import event_loop
from net.quic.links import DEFAULT_LIBRARY

Swarm = tuple[int, str]


def parse_swarm(text: str) -> Swarm:
    threads, _, spin = text.partition(":")
    spin = spin or "default"
    if not threads.isdigit() or int(threads) < 1 or not (spin == "default" or spin.isdigit()):
        raise argparse.ArgumentTypeError(f"a swarm is THREADS[:SPINCOUNT|default], not {text!r}")
    return int(threads), spin


def name_of(swarm: Swarm) -> str:
    threads, spin = swarm
    return f"{threads}:{spin}"


def options_of(swarm: Swarm) -> dict[str, Any]:
    """`paired_rounds` arguments of one swarm: its threads, and the workers' environment
    (spin: libgomp reads GOMP_SPINCOUNT when ggml loads it; unset: the worker's own
    default, app/serving/serve.py)."""
    threads, spin = swarm
    env = {"GOMP_SPINCOUNT": None if spin == "default" else spin}
    return {"threads": threads, "library": DEFAULT_LIBRARY, "env": env}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--swarm", type=parse_swarm, action="append")
    args = ap.parse_args()
    swarms: list[Swarm] = args.swarm or [(2, "default"), (1, "default")]
    if len({name_of(s) for s in swarms}) < len(swarms):
        # Each swarm's rounds are keyed by its name: a repeat would merge into the first.
        ap.error("each --swarm may be given once")

    model = resolve_model("gemma-3-270m")
    tok = Tokenizer.from_gguf(model)
    prompt = tok.encode(PROMPT)
    tok.close()
    load = [os.getloadavg()[0]]
    configs = {name_of(s): options_of(s) for s in swarms}
    paired = event_loop.run(paired_rounds(model, prompt, args.tokens, configs, args.rounds))
    load.append(os.getloadavg()[0])
    out: dict[str, Any] = {
        "model": model.name,
        "decode_tokens": args.tokens,
        "load_average": load,
        "rounds": paired["rounds"],
        "swarm_vs_mono_median": {n: paired["swarm"][n]["swarm_vs_mono_2_threads"] for n in configs},
        "swarm": paired["swarm"],
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"{model.name}, {args.tokens} tokens, swarms as threads:GOMP_SPINCOUNT; each round "
        "one generation of the whole model (2 threads), then one of the swarm"
    )
    for n, runs in paired["rounds"].items():
        print(f"swarm {n}")
        for r in runs:
            stages = " / ".join(f"{x:.2f}" for x in r["per_stage_compute_ms"])
            print(
                f"  whole {r['whole_2_threads']:6.1f} tok/s, swarm {r['tokens_per_s']:6.1f}"
                f"  vs mono {r['swarm_vs_mono_2_threads']:.3f}  trip {r['trip_ms']:.1f} ms ="
                f" compute {stages} + links/handling {r['network_and_handling_ms']:.1f}"
                f"  (load {r['load_average']:.2f})"
            )
    med = ", ".join(f"{n} {v:.3f}" for n, v in out["swarm_vs_mono_median"].items())
    print(f"swarm_vs_mono, median of rounds: {med}; load {load[0]:.2f} -> {load[1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
