"""The floor under `swarm_vs_mono` on this machine: what three stage processes reach
against the whole model with no network and no Sangama code between them.

`bench/swarm.py` measures it in the same run as its swarms (part (d)): the stage files of
the swarm's cuts, one process per stage, hidden states passed over pipes
(`bench/stage_compute.py --layout procs`), greedy, at the swarm's threads a stage. Every
figure above this floor is Sangama's (links, frames, the worker's Python); the floor
itself is what processes sharing the machine's cores cost each other (their OpenMP teams
woken for every step, caches emptied by each other's weights). Where the floor is below
a goal, no transport and no worker code can reach that goal on this machine; with a
machine's cores for every stage (the product: one PC a stage) the floor is ~1.0.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

SWARM_GOAL = 0.90
"""The `swarm_vs_mono` goal: a swarm on one machine within 10 % of the whole model."""


def floor_figures(
    chain_vs_whole: float, swarm_vs_mono: float, goal: float = SWARM_GOAL
) -> dict[str, Any]:
    """The floor as a `swarm_vs_mono` (the whole model's compute over the pipes chain's),
    the swarm's share of it (`swarm_vs_floor`: 1.0 means Sangama's links and workers cost
    nothing beyond the processes themselves), and whether `goal` is within the floor."""
    if chain_vs_whole <= 0 or swarm_vs_mono <= 0:
        raise ValueError("ratios must be positive")
    floor = 1.0 / chain_vs_whole
    return {
        "chain_floor_vs_mono": floor,
        "swarm_vs_floor": swarm_vs_mono / floor,
        "goal": goal,
        "goal_within_floor": floor >= goal,
    }


def measure_floor(threads: int, tokens: int, repeats: int) -> dict[str, Any]:
    """Whole model vs the 3-stage pipes chain (cuts 0,6,12,18 of Gemma 3 270M, as the
    swarm), greedy: compute ms a token of both, per stage, and their ratio."""
    from bench.stage_compute import measure

    args = argparse.Namespace(
        model="gemma-3-270m", cuts="0,6,12,18", tokens=tokens, repeats=repeats, threads=threads
    )
    greedy = measure("procs", args, {"greedy": {}})["samplings"]["greedy"]
    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "threads": threads,
        "cpus": len(affinity(0)) if affinity is not None else os.cpu_count(),
        "whole_ms": greedy["whole"]["compute_ms"],
        "chain_ms": greedy["chain"]["compute_ms"],
        "chain_step_ms": greedy["chain"]["step_ms"],
        "chain_vs_whole": greedy["chain_vs_whole"],
        "same_tokens": greedy["same_tokens"],
    }
