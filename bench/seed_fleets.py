"""Qwen3.5-397B-A17B (Q4_K_M) placed on the seeds' two fleets at true sizes, as a markdown
table for README.md: `python -m bench.seed_fleets [--sessions 96 --positions 2048]`.

The model is read from a header-only GGUF (tests/support/qwen35_397b.py: the true
metadata, tensor shapes and quant types, no data) through the same code that reads a
full file (core.gguf_header), and placed by coordinator.server.placement with the KV
cache, every session's recurrent state and the MTP block's cache counted. Every
layer boundary is taken as exact (the hybrid qwen architectures' cut rule)."""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path

from coordinator.errors import PlacementError
from coordinator.server.placement import PROCESS_OVERHEAD_BYTES, ModelSpec, NodeInfo, Plan, plan
from core.gguf_header import facts_from_header, read_header
from core.model_sizes import RECURRENT_SNAPSHOTS
from core.types import ModelFacts
from tests.support.qwen35_397b import write_header_only_gguf

GB = 10**9

FLEETS: dict[str, list[NodeInfo]] = {
    "20 workers of 16 GB, one of 30 GB": [
        NodeInfo(f"w{i:02d}", 30 * GB if i == 5 else 16 * GB) for i in range(1, 21)
    ],
    "3 workers of 96 GB": [NodeInfo(f"g{i}", 96 * GB) for i in (1, 2, 3)],
}


def qwen35_397b_facts() -> ModelFacts:
    with tempfile.TemporaryDirectory() as d:
        path = write_header_only_gguf(Path(d) / "qwen3.5-397b-a17b-q4_k_m.gguf")
        facts = facts_from_header(read_header(path), "Qwen3.5-397B-A17B Q4_K_M")
    return dataclasses.replace(facts, allowed_cuts=None)


def place(spec: ModelSpec, nodes: Sequence[NodeInfo], sessions: int, positions: int) -> Plan:
    return plan(spec, nodes, sessions_per_stage=sessions, context_tokens=positions, spares=0)


def most_sessions(spec: ModelSpec, nodes: Sequence[NodeInfo], positions: int) -> int:
    """The most sessions per stage (up to llama.cpp's 256) the fleet can be planned for."""
    lo, hi = 0, 256
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            place(spec, nodes, mid, positions)
            lo = mid
        except PlacementError:
            hi = mid - 1
    return lo


def _gb(lo: int, hi: int, digits: int = 1) -> str:
    a, b = f"{lo / GB:.{digits}f}", f"{hi / GB:.{digits}f}"
    return f"{a} GB" if a == b else f"{a}-{b} GB"


def table(facts: ModelFacts, p: Plan, spec: ModelSpec) -> list[str]:
    """One row per run of alike stages (same layer count and weights to 0.1 GB)."""
    rows = [
        "| stages | nodes | layers | weights | KV + state | total | cap |",
        "|---|---|---|---|---|---|---|",
    ]
    runs: list[list[int]] = []
    for i, s in enumerate(p.stages):
        w = round(spec.stage_weight_bytes(s.layers) / GB, 1)
        if runs:
            prev = p.stages[runs[-1][-1]]
            alike = len(prev.layers) == len(s.layers)
            alike &= round(spec.stage_weight_bytes(prev.layers) / GB, 1) == w
            if alike and s.layers.stop != facts.n_layer:
                runs[-1].append(i)
                continue
        runs.append([i])
    for run in runs:
        stages = [p.stages[i] for i in run]
        first, last = stages[0], stages[-1]
        weights = [spec.stage_weight_bytes(s.layers) for s in stages]
        sessions = [
            s.bytes_needed - w - PROCESS_OVERHEAD_BYTES
            for s, w in zip(stages, weights, strict=True)
        ]
        needed = [s.bytes_needed for s in stages]
        ids = first.node_id if len(stages) == 1 else f"{first.node_id} ... {last.node_id}"
        each = f" ({len(first.layers)} each)" if len(stages) > 1 else ""
        extras = " + head + MTP" if last.layers.stop == facts.n_layer else ""
        label = str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
        rows.append(
            f"| {label} | {ids} | {first.layers.start}-{last.layers.stop - 1}{each}{extras} "
            f"| {_gb(min(weights), max(weights))} | {_gb(min(sessions), max(sessions), 2)} "
            f"| {_gb(min(needed), max(needed))} | {first.capacity_bytes / GB:.0f} GB |"
        )
    return rows


def report(sessions: int, positions: int, snapshots: int) -> str:
    facts = qwen35_397b_facts()
    spec = ModelSpec.from_facts(facts, recurrent_snapshots=snapshots)
    engine = ModelSpec.from_facts(facts, recurrent_snapshots=RECURRENT_SNAPSHOTS)
    total = sum(facts.bytes_per_layer) + facts.embedding_bytes + facts.head_bytes
    out = [
        f"{facts.name}: {facts.n_layer} layers of {min(facts.bytes_per_layer) / GB:.2f}-"
        f"{max(facts.bytes_per_layer) / GB:.2f} GB, {total / GB:.1f} GB with the embedding, "
        f"head and MTP block ({(facts.head_bytes + facts.embedding_bytes) / GB:.1f} GB on the "
        f"last stage besides its layers); {sessions} sessions x {positions} positions, "
        f"{snapshots} recurrent-state snapshots per session, "
        f"{PROCESS_OVERHEAD_BYTES / 2**20:.0f} MiB per process in each total.",
        "",
    ]
    for title, nodes in FLEETS.items():
        out.append(f"**{title}**")
        out.append("")
        try:
            out += table(facts, place(spec, nodes, sessions, positions), spec)
        except PlacementError as exc:
            out.append(f"does not fit: {exc}")
        fit = most_sessions(engine, nodes, positions)
        out += [
            "",
            f"With the engine's {RECURRENT_SNAPSHOTS} snapshots per session (9 recurrent "
            f"states each), this fleet fits at most {fit} sessions of {positions} positions.",
            "",
        ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sessions", type=int, default=96)
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument(
        "--snapshots",
        type=int,
        default=0,
        help="recurrent-state snapshots per session (the seeds ran 0; workers keep 8)",
    )
    args = ap.parse_args(argv)
    print(report(args.sessions, args.positions, args.snapshots))


if __name__ == "__main__":
    main()
