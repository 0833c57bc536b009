"""Guessing benchmark, side by side in one run (prints the seeds' table; --json one object):

For each chain, prompts code / explanation / factual x guesses none / 2 / 4 / 6 /
adaptive (n-gram guesses from the client, verified in one trip): tokens per trip,
guesses accepted of proposed, decode tokens/s, speed-up over none, and whether the
output equals plain greedy. Chains:

- wan20: 20 stages of a tiny random-weight model, each link 1-56 ms one way through
  app.lab.wan.proxy (as bench/swarm.py builds it): compute is small, delays dominate.
  Prompts are the Gemma token ids folded into the tiny vocabulary; the tiny model's
  greedy text is not language, so its acceptance says how the machinery pays, not how
  often n-grams guess real text.
- wan18_gemma: Gemma 3 270M, one layer per stage (18), on the same kind of links:
  real text, so n-gram guesses meet real repetition; delays still dominate.
- gemma3: Gemma 3 270M in three stages on loopback (real text, compute matters).

Also: the undo cost per trip on every stage (keep_until -> seq_rm, timed inside
core.stage on the same stage files), guessing with 16 sessions at once (gemma3), and
time to first token of a 460-token prompt, chunked (64) vs one piece, on the WAN chains.

    .venv/bin/python bench/guesses.py [--json] [--quick] [--tokens 48] [--repeat 3]
                                     [--chains wan20,wan18_gemma,gemma3] [--batch-variant]

Each setting runs --repeat times (interleaved with the others); tokens/s is the median.
`--json` prints {chain: {prompt: {setting: {tokens_per_trip, accepted, proposed,
tokens_per_s, speed_up, identical}}}} plus the keys "undo" (ms per trip per stage),
"many_sessions", "chunked_prompt", "trip_details", "load_average". `--quick`: 16
tokens, 4 sessions, one run each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.client.swarm_client import SwarmClient, TokenEvent
from app.lab.local_swarm import LocalSwarm
from core.guessing import GuessPolicy
from core.models import GEMMA3, resolve_model, stage_files
from core.stage import Stage, StepRequest
from core.tokenizer import Tokenizer
from core.types import LayerRange, SamplingParams, StageSpec

PROMPTS = {
    "code": (
        "Complete the Python module.\n\n"
        "def area_circle(r):\n    return 3.14159 * r * r\n\n"
        "def area_square(s):\n    return s * s\n\n"
        "def area_rectangle(w, h):\n    return w * h\n\n"
        "def perimeter_circle(r):\n"
    ),
    "explanation": "Explain in a few sentences why the sky is blue during the day.",
    "factual": "Question: What is the capital of France, and what river runs through it?\nAnswer:",
}
SETTINGS = ["none", "2", "4", "6", "adaptive"]
CHAINS = ("wan20", "wan18_gemma", "gemma3")
TINY_VOCAB = 512
N_CTX = 1024
N_CTX_SHARED = 4096
"""gemma3 holds many sessions at once; each reserves its prompt and answer there."""


async def _generate(
    client: SwarmClient, prompt: list[int], tokens: int, setting: str, chunk: int = 64
) -> list[TokenEvent]:
    policy = GuessPolicy.parse(setting)
    return [
        ev
        async for ev in client.generate(
            prompt, tokens, SamplingParams(), chunk=chunk, guesses=policy
        )
    ]


KEYS = ("tokens_per_trip", "accepted", "proposed", "tokens_per_s", "speed_up", "identical")
"""What --json holds per chain, prompt and setting (the issue's table)."""


def _summary(events: list[TokenEvent], plain: list[int] | None) -> dict[str, Any]:
    decode = events[1:]  # the first event answers the prompt (time to first token)
    n_tok = sum(len(e.tokens) for e in decode)
    ms = sum(e.trip_ms for e in decode)
    tokens = [t for e in events for t in e.tokens]
    return {
        "tokens_per_trip": n_tok / max(1, len(decode)),
        "accepted": sum(e.n_accepted for e in decode),
        "proposed": sum(e.n_guesses for e in decode),
        "tokens_per_s": n_tok / (ms / 1e3) if ms else 0.0,
        "trip_ms": statistics.median(e.trip_ms for e in decode) if decode else 0.0,
        "trips": len(decode),
        "identical": plain is None or tokens == plain,
        "tokens": tokens,
    }


def _median_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One setting's repeats: medians of the rates, counts of the median-speed run."""
    runs = sorted(runs, key=lambda r: r["tokens_per_s"])
    mid = runs[len(runs) // 2]
    return {
        **mid,
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "identical": all(r["identical"] for r in runs),
        "tokens_per_s_runs": [r["tokens_per_s"] for r in runs],
    }


async def _chain_table(
    swarm: LocalSwarm,
    prompts: dict[str, list[int]],
    tokens: int,
    settings: list[str],
    repeat: int = 1,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every setting `repeat` times, the settings interleaved in each round so a change in
    the machine's load falls on all of them; speed-ups from the medians."""
    assert swarm.route is not None and swarm.client_credentials is not None
    table: dict[str, dict[str, dict[str, Any]]] = {}
    async with SwarmClient(
        swarm.client_credentials, swarm.route, swarm.tuning, step_timeout=60
    ) as client:
        await _generate(client, prompts["factual"], 4, "none")  # warm links and caches
        for name, prompt in prompts.items():
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
            plain: list[int] | None = None
            for _ in range(repeat):
                for setting in settings:
                    r = _summary(await _generate(client, prompt, tokens, setting), plain)
                    if setting == "none" and plain is None:
                        plain = r["tokens"]
                    runs[setting].append(r)
            rows = {s: _median_runs(rs) for s, rs in runs.items()}
            base = rows["none"]["tokens_per_s"]
            for r in rows.values():
                r["speed_up"] = r["tokens_per_s"] / base if base else 0.0
            table[name] = rows
    return table


def _table_json(table: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    return {p: {s: {k: r[k] for k in KEYS} for s, r in rows.items()} for p, rows in table.items()}


def _trip_details(table: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    keep = ("trip_ms", "trips", "tokens_per_s_runs")
    return {p: {s: {k: r[k] for k in keep} for s, r in rows.items()} for p, rows in table.items()}


async def _sessions(
    swarm: LocalSwarm, prompts: dict[str, list[int]], tokens: int, n: int
) -> dict[str, Any]:
    """n sessions at once, each one of the prompts, without and with adaptive guesses."""
    assert swarm.route is not None and swarm.client_credentials is not None
    out: dict[str, Any] = {"sessions": n}
    async with SwarmClient(
        swarm.client_credentials, swarm.route, swarm.tuning, step_timeout=120
    ) as client:
        names = list(prompts)
        solo = {k: [t for e in await _generate(client, p, tokens, "none") for t in e.tokens]
                for k, p in prompts.items()}  # fmt: skip
        for setting in ("none", "4", "adaptive"):
            started = time.perf_counter()
            runs = await asyncio.gather(
                *(_generate(client, prompts[names[i % 3]], tokens, setting) for i in range(n))
            )
            wall = time.perf_counter() - started
            total = sum(len(e.tokens) for r in runs for e in r)
            same = sum(
                [t for e in r for t in e.tokens] == solo[names[i % 3]] for i, r in enumerate(runs)
            )
            out[setting] = {
                "total_tokens_per_s": total / wall,
                "tokens_per_trip": statistics.mean(
                    _summary(r, None)["tokens_per_trip"] for r in runs
                ),
                "same_as_solo": f"{same} of {n}",
            }
    return out


async def _ttft(swarm: LocalSwarm, prompt: list[int], repeat: int = 3) -> dict[str, Any]:
    """Time to first token, chunked (64) and in one piece, interleaved; medians."""
    assert swarm.route is not None and swarm.client_credentials is not None
    out: dict[str, Any] = {"prompt_tokens": len(prompt)}
    async with SwarmClient(
        swarm.client_credentials, swarm.route, swarm.tuning, step_timeout=60,
        first_token_timeout=120,
    ) as client:  # fmt: skip
        seen: dict[str, list[float]] = {"chunked_64": [], "unchunked": []}
        for _ in range(repeat):
            for label, chunk in (("chunked_64", 64), ("unchunked", len(prompt))):
                ev = await _generate(client, prompt, 1, "none", chunk)
                seen[label].append(ev[0].trip_ms)
        for label, times in seen.items():
            out[f"{label}_ttft_ms"] = statistics.median(times)
            out[f"{label}_runs_ms"] = times
    out["speed_up"] = out["unchunked_ttft_ms"] / out["chunked_64_ttft_ms"]
    return out


def _undo(
    model: Path, cuts: list[int], n_seq_max: int, n_ctx: int, k: int = 4, trips: int = 40
) -> dict[str, Any]:
    """Per stage: ms per keep_until cut of k rejected guesses, on the stage files the
    workers load, with the workers' context and slot count (timed inside core.stage)."""
    ranges = LayerRange.from_cuts(cuts)
    manifest, paths = stage_files(model, ranges)
    n_layer = manifest.facts.n_layer
    per_stage: list[float] = []
    for layers, path in zip(ranges, paths, strict=True):
        spec = StageSpec(
            layers, n_layer, n_ctx=n_ctx, n_batch=256, n_seq_max=n_seq_max, n_threads=1
        )
        stage = Stage.from_file(path, spec)
        width = stage.engine.n_embd

        def rows(
            start: int, n: int, keep: int | None = None, spec: StageSpec = spec, width: int = width
        ) -> StepRequest:
            if spec.is_first:
                ids = np.arange(start, start + n, dtype=np.int32) % 50 + 1
                return StepRequest("u", start, tokens=ids, keep_until=keep)
            hidden = np.full((n, width), 0.01, dtype=np.float32)
            return StepRequest("u", start, hidden=hidden, keep_until=keep)

        try:
            stage.open("u")
            stage.step([rows(0, 32)])
            pos = 32
            while pos + k + 2 < n_ctx and stage.stats.undos < trips:
                stage.step([rows(pos, k + 1)])  # the newest token and k guesses
                # every guess rejected: the next step cuts them first, then goes on
                stage.step([rows(pos + 1, 1, keep=pos + 1)])
                pos += 2
            per_stage.append(stage.stats.undo_ms / max(1, stage.stats.undos))
        finally:
            stage.shutdown()
    return {"per_stage_ms": per_stage, "max_ms": max(per_stage), "guesses_cut": k}


def _progress(out: dict[str, Any]) -> None:
    """Each finished part to stderr at once: a long run cut short keeps what it measured."""
    print(json.dumps(out), file=sys.stderr, flush=True)


def _fold(ids: list[int]) -> list[int]:
    return [1 + i % (TINY_VOCAB - 1) for i in ids]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.tiny_models import write_tiny_model

    gemma = resolve_model(GEMMA3)
    tok = Tokenizer.from_gguf(gemma)
    ids = {k: tok.encode(v) for k, v in PROMPTS.items()}
    long_text = " ".join([PROMPTS["explanation"], PROMPTS["code"]] * 12)
    long_ids = tok.encode(long_text)[:460]
    tok.close()
    out: dict[str, Any] = {"decode_tokens": args.tokens, "settings": SETTINGS}
    chains = args.chains.split(",")
    rng = random.Random(7)
    delays = [float(rng.randint(1, 56)) for _ in range(21)]
    if "wan20" in chains:
        with tempfile.TemporaryDirectory(prefix="sangama-guesses-wan20-") as tmp:
            model = write_tiny_model(
                Path(tmp) / "tiny20.gguf", n_layer=20, n_embd=256, n_head=4, n_ff=512
            )
            cuts = list(range(21))
            async with LocalSwarm(
                model=str(model), cuts=cuts, threads=1, link_delays_ms=delays, n_ctx=N_CTX
            ) as swarm:
                prompts = {k: _fold(v) for k, v in ids.items()}
                out["wan20"] = await _chain_table(
                    swarm, prompts, args.tokens, SETTINGS, args.repeat
                )
                _progress(out)
                if args.ttft:
                    out.setdefault("chunked_prompt", {})["wan20"] = await _ttft(
                        swarm, _fold(long_ids), args.repeat
                    )
            out["wan20_links_ms"] = {"delays": delays, "sum": sum(delays)}
            out.setdefault("undo", {})["wan20"] = _undo(model, cuts, 8, N_CTX)
    if "wan18_gemma" in chains:
        # Gemma 3 270M, one layer per stage, the same kind of links: real text, so the
        # n-gram guesses meet real repetition.
        cuts = list(range(19))
        links = delays[:18] + delays[-1:]
        swarm = LocalSwarm(
            model=str(gemma), cuts=cuts, threads=1, link_delays_ms=links, n_ctx=N_CTX
        )
        try:
            await swarm.start(ready_timeout=900)  # 18 workers calibrating on a busy machine
            out["wan18_gemma"] = await _chain_table(swarm, ids, args.tokens, SETTINGS, args.repeat)
            _progress(out)
            if args.ttft:
                out.setdefault("chunked_prompt", {})["wan18_gemma"] = await _ttft(
                    swarm, long_ids, args.repeat
                )
        finally:
            await swarm.stop()
            swarm.cleanup()
        out["wan18_gemma_links_ms"] = {"delays": links, "sum": sum(links)}
        out.setdefault("undo", {})["wan18_gemma"] = _undo(gemma, cuts, 8, N_CTX)
    if "gemma3" in chains:
        cuts = [0, 6, 12, 18]
        if args.batch_variant:  # the workers inherit it (see --batch-variant)
            os.environ["SANGAMA_BATCH_VARIANT"] = "1"
        out["gemma3_batch_variant"] = os.environ.get("SANGAMA_BATCH_VARIANT") == "1"
        async with LocalSwarm(
            model=str(gemma),
            cuts=cuts,
            threads=1,
            n_ctx=N_CTX_SHARED,
            max_sessions=args.sessions + 2,
        ) as swarm:
            out["gemma3"] = await _chain_table(swarm, ids, args.tokens, SETTINGS, args.repeat)
            out["many_sessions"] = await _sessions(swarm, ids, args.tokens, args.sessions)
        out.setdefault("undo", {})["gemma3"] = _undo(gemma, cuts, args.sessions + 2, N_CTX_SHARED)
    with open("/proc/loadavg", encoding="ascii") as f:
        out["load_average"] = f.read().split()[:3]
    return out


def _print(out: dict[str, Any]) -> None:
    for chain in CHAINS:
        if chain not in out:
            continue
        print(f"{chain}: {out['decode_tokens']} tokens per run, n-gram guesses from the client")
        print("  prompt       guesses   tok/trip  accepted      tok/s  speed-up  identical")
        for prompt, rows in out[chain].items():
            for setting, r in rows.items():
                acc = "-" if setting == "none" else f"{r['accepted']} of {r['proposed']}"
                print(
                    f"  {prompt:12} {setting:8} {r['tokens_per_trip']:8.2f}  {acc:>10}  "
                    f"{r['tokens_per_s']:8.2f}  {r['speed_up']:7.2f}x  {r['identical']}"
                )
    for chain, u in out.get("undo", {}).items():
        print(
            f"undo ({chain}): cutting {u['guesses_cut']} guesses, max {u['max_ms']:.4f} ms "
            f"per trip per stage (per stage: {', '.join(f'{x:.4f}' for x in u['per_stage_ms'])})"
        )
    if "many_sessions" in out:
        s = out["many_sessions"]
        print(f"gemma3, {s['sessions']} sessions at once:")
        for k in ("none", "4", "adaptive"):
            r = s[k]
            print(
                f"  guesses {k:8} total {r['total_tokens_per_s']:7.1f} tok/s, "
                f"{r['tokens_per_trip']:.2f} tok/trip, same as solo {r['same_as_solo']}"
            )
    for chain, c in out.get("chunked_prompt", {}).items():
        print(
            f"{chain}, {c['prompt_tokens']}-token prompt, first token: chunked (64) "
            f"{c['chunked_64_ttft_ms']:.0f} ms, one piece {c['unchunked_ttft_ms']:.0f} ms "
            f"({c['speed_up']:.2f}x)"
        )
    print(f"load average {' '.join(out['load_average'])}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer tokens and sessions")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="runs per setting (medians)")
    ap.add_argument("--chains", default="wan20,wan18_gemma,gemma3")
    ap.add_argument(
        "--no-ttft", dest="ttft", action="store_false", help="skip the chunked-prompt timing"
    )
    ap.add_argument(
        "--batch-variant",
        action="store_true",
        help="gemma3 workers with repacked weights and tiled matmul (SANGAMA_BATCH_VARIANT):"
        " a k+1-row verification is then no longer bit-identical to one-row decodes",
    )
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.sessions, args.repeat = 16, 4, 1
    out = asyncio.run(run(args))
    if args.json:
        for chain in CHAINS:
            if chain in out:
                out.setdefault("trip_details", {})[chain] = _trip_details(out[chain])
                out[chain] = _table_json(out[chain])
        print(json.dumps(out, indent=1))
    else:
        _print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
