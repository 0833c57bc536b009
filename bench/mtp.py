"""MTP guessing on a qwen35 chain, side by side in one run (table; --json one object).

A tiny random-weight qwen35 (hybrid: gated delta-net recurrent layers + full attention,
one MTP block, written by tests.support.tiny_qwen35) cut into three stages on loopback,
each link delayed `--delay-ms` one way (app.lab.wan.proxy): guesses none / mtp:2 / mtp:4 /
mtp (adaptive) / mtp+ngram:4, each with tokens per trip, guesses accepted of proposed,
decode tokens/s, speed-up over none, and whether the output equals plain greedy. The
tiny head is random (tied to the trunk's state), so acceptance says how the machinery
pays, not how often a trained Qwen3.5 head guesses right.

Then the undo cost per trip per stage: a trip of the newest token plus k guesses, all
rejected, cut by the next step's keep_until (seq_rm on the attention KV, a snapshot
index on the recurrent state, n_rs_seq), timed inside core.stage on the same stage
files, on the tiny chain and on a wider qwen35 (n_embd 1024, 12 layers) with the
workers' context and slot count.

    .venv/bin/python bench/mtp.py [--json] [--quick] [--delay-ms 20] [--tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.client.swarm_client import SwarmClient
from app.lab.local_swarm import LocalSwarm
from bench.guesses import _generate, _summary, _undo
from tests.support.tiny_qwen35 import Qwen35Dims, write_qwen35_model

SETTINGS = ["none", "mtp:2", "mtp:4", "mtp", "mtp+ngram:4"]
PROMPT = [1, 5, 17, 42, 99, 7, 30, 2, 9, 11]
CUTS = [0, 2, 4, 6]
WIDE = Qwen35Dims(n_layer=12, n_embd=1024, n_head=8, n_head_kv=2, head_dim=128, n_ff=2816,
                  ssm_state=128, ssm_groups=4, ssm_rank=8)  # fmt: skip
WIDE_CUTS = [0, 4, 8, 12]


async def _table(model: Path, tokens: int, delay_ms: float) -> dict[str, Any]:
    delays = [delay_ms] * (len(CUTS))
    swarm = LocalSwarm(
        model=str(model), cuts=CUTS, n_ctx=1024, mtp_p_min=0.0, link_delays_ms=delays
    )
    out: dict[str, Any] = {}
    async with swarm:
        assert swarm.route is not None and swarm.client_credentials is not None
        async with SwarmClient(swarm.client_credentials, swarm.route, swarm.tuning) as client:
            await _generate(client, PROMPT, 4, "none")  # warm links and caches
            plain: list[int] | None = None
            for setting in SETTINGS:
                row = _summary(await _generate(client, PROMPT, tokens, setting), plain)
                if plain is None:
                    plain = row["tokens"]
                out[setting] = row
    base = out["none"]["tokens_per_s"]
    for row in out.values():
        row["speed_up"] = row["tokens_per_s"] / base if base else 0.0
        del row["tokens"]
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"decode_tokens": args.tokens, "delay_ms": args.delay_ms}
    with tempfile.TemporaryDirectory(prefix="sangama-bench-mtp-") as tmp:
        tiny = write_qwen35_model(Path(tmp) / "tiny-qwen35-mtp.gguf", echo=0.35)
        out["tiny_qwen35"] = await _table(tiny, args.tokens, args.delay_ms)
        trips = 10 if args.quick else 40
        undo = {"tiny_qwen35": _undo(tiny, CUTS, 8, 1024, trips=trips)}
        if not args.quick:
            wide = write_qwen35_model(Path(tmp) / "wide-qwen35-mtp.gguf", WIDE, echo=0.35)
            undo["wide_qwen35_8_slots"] = _undo(wide, WIDE_CUTS, 8, 4096, trips=trips)
            undo["wide_qwen35_32_slots"] = _undo(wide, WIDE_CUTS, 32, 16384, trips=trips)
        out["undo"] = undo
    with open("/proc/loadavg", encoding="ascii") as f:
        out["load_average"] = f.read().split()[:3]
    return out


def _print(out: dict[str, Any]) -> None:
    print(
        f"tiny qwen35+MTP, 3 stages, {out['delay_ms']} ms each link one way, "
        f"{out['decode_tokens']} tokens per run"
    )
    print("  guesses       tok/trip  accepted      tok/s  speed-up  identical")
    for setting, r in out["tiny_qwen35"].items():
        print(
            f"  {setting:<12} {r['tokens_per_trip']:>8.2f}  {r['accepted']:>3}/{r['proposed']:<4}"
            f" {r['tokens_per_s']:>9.1f}  {r['speed_up']:>7.2f}x  {r['identical']}"
        )
    for chain, u in out["undo"].items():
        stages = ", ".join(f"{ms:.4f}" for ms in u["per_stage_ms"])
        print(
            f"undo ({chain}): cutting {u['guesses_cut']} guesses, max {u['max_ms']:.4f} ms "
            f"per trip per stage ({stages})"
        )
    print(f"load average: {' '.join(out['load_average'])}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer tokens, tiny undo only")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    args = ap.parse_args()
    if args.quick:
        args.tokens = min(args.tokens, 16)
    out = asyncio.run(run(args))
    if args.json:
        print(json.dumps(out))
    else:
        _print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
