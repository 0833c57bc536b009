"""Direct (punched) vs relayed links, side by side in one run (needs root: namespaces).

Four homes behind cone NAT, the coordinator and coturn on the "public" side (the system
tests' topology). For each policy, the whole swarm (3 workers + client, Gemma 3 270M)
answers one prompt; the client's report gives tokens/s, the trip and the network share,
from which the per-hop cost follows (4 links: client, 2 stage hops, back to the client).

    .venv/bin/python bench/links.py [--tokens 32] [--json]

No delay is added between namespaces (this kernel has no netem, and the userspace delay
proxy cannot sit inside an ICE path); bench/swarm.py measures distance separately.

A third run cuts the punched paths between workers mid-answer and measures the stall
until the links are re-established through the relay (idle timeout + redial) and the
answer goes on.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.models import GEMMA3, bundled_model_path
from tests.system.test_nat import (
    child_env,
    cut_worker_paths,
    punched_links,
    relayed_links,
    run_swarm,
    swarm_up,
)
from tests.system.topology import home_routers, missing_requirements

LINKS = 4  # client -> stage0 -> stage1 -> stage2 -> client


def _parse(report: str) -> dict[str, float]:
    tps = re.search(r"then ([0-9.]+) tok/s", report)
    trip = re.search(r"total trip\s+([0-9.]+)", report)
    rest = re.search(r"network and handling \(rest\)\s+([0-9.]+)", report)
    if not (tps and trip and rest):
        raise RuntimeError(f"unexpected chat report:\n{report}")
    return {
        "tokens_per_s": float(tps.group(1)),
        "trip_ms": float(trip.group(1)),
        "network_and_handling_ms": float(rest.group(1)),
        "per_hop_ms": float(rest.group(1)) / LINKS,
    }


def _empty_dir(parent: Path, name: str) -> Path:
    """A fresh slices folder for swarm_up (one swarm here: it only fills it)."""
    (parent / name).mkdir()
    return parent / name


def measure(relay_only: bool, tokens: int) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="sangama-links-") as tmp,
        home_routers(["cone"] * 4) as topo,
    ):
        gemma, slices = bundled_model_path(GEMMA3), _empty_dir(Path(tmp), "slices")
        reported = relayed_links if relay_only else punched_links
        _, paths, report = run_swarm(topo, Path(tmp), gemma, relay_only, slices, reported, tokens)
    return {"paths": sorted(paths.values()), **_parse(report)}


def measure_path_death(tokens: int) -> dict[str, Any]:
    """Longest pause in the streamed answer when the worker paths die after a few tokens."""
    with (
        tempfile.TemporaryDirectory(prefix="sangama-links-") as tmp,
        home_routers(["cone"] * 4) as topo,
        swarm_up(
            topo, Path(tmp), bundled_model_path(GEMMA3), False, _empty_dir(Path(tmp), "slices")
        ) as swarm,
    ):
        uncut, _ = swarm.chat(tokens)
        chat = subprocess.Popen(
            swarm.chat_command(tokens), stdout=subprocess.PIPE, env=child_env(), bufsize=0
        )
        assert chat.stdout is not None
        out, gaps, last = b"", [], time.monotonic()
        while byte := chat.stdout.read(1):
            now = time.monotonic()
            gaps.append(now - last)
            last, out = now, out + byte
            if len(out) == 12:
                cut_worker_paths(topo)
                cut_at = now
        chat.wait(60)
        paths = swarm.paths_once(relayed_links)
    return {
        "stall_s": max(gaps[12:]),
        "answer_unchanged": out.decode(errors="replace").split("\n\n")[0] == uncut,
        "paths_after": sorted(paths.values()),
        "finished_s_after_cut": last - cut_at,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    why = missing_requirements()
    if why:
        print(f"bench/links.py: {why}", file=sys.stderr)
        return 2
    rows = {"punched": measure(False, args.tokens), "relayed": measure(True, args.tokens)}
    death = measure_path_death(max(args.tokens, 48))
    out = {
        "path_death": death,
        "tokens": args.tokens,
        "rows": rows,
        "relayed_vs_punched_tokens_per_s": rows["relayed"]["tokens_per_s"]
        / rows["punched"]["tokens_per_s"],
        "relay_extra_ms_per_hop": rows["relayed"]["per_hop_ms"] - rows["punched"]["per_hop_ms"],
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"links benchmark: 3 workers + client behind cone NAT, {args.tokens} tokens, Gemma 3 270M"
    )
    print(f"{'policy':10} {'tok/s':>7} {'trip ms':>8} {'net+handling':>13} {'per hop':>8}  paths")
    for name, r in rows.items():
        print(
            f"{name:10} {r['tokens_per_s']:7.1f} {r['trip_ms']:8.2f} "
            f"{r['network_and_handling_ms']:13.2f} {r['per_hop_ms']:8.2f}  {', '.join(r['paths'])}"
        )
    print(f"relay costs {out['relay_extra_ms_per_hop']:.2f} ms per hop more than a punched link")
    print(
        f"punched paths cut mid-answer: stalled {death['stall_s']:.1f} s, then went on over "
        f"{', '.join(death['paths_after'])}; answer unchanged: {death['answer_unchanged']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
