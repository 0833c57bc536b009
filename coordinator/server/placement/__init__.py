"""Placement: which node serves which layers, as one pure function
(docs/architecture.md, "Placement").

`plan(model, nodes, ...)` returns a chain of stages that covers every layer exactly once,
each stage fitting its node's memory (weights, KV cache and recurrent state for the
planned sessions, the last stage's MTP cache, a fixed per-process overhead), with as
few hops as possible, ordered to keep the token's trip short, some healthy nodes kept
out as spares, and a re-plan that moves as few nodes as it can. Like Petals'
block_selection it reads no clock, network or database: the caller measures and passes
the facts in, so every decision can be replayed in a test.

How, in order:
1. The chain length k is the smallest that fits (fewer hops = faster token), and at least
   `min_stages`. The k largest nodes fit iff any k nodes fit (swap a node for a larger
   one and every stage still fits), so only they are tested.
2. Which k nodes and in what order: the feasible sequence with the shortest sum of RTTs
   between consecutive stages, by exhaustive search for small chains, else nearest-
   neighbour starts improved by 2-opt, relocation and swaps with nodes outside the chain.
3. Where to cut: any layer boundary the model allows (`ModelSpec.allowed_cuts`: some
   architectures are exact only at some boundaries). First make the slowest stage as
   fast as possible (layers / compute_speed: the busiest stage bounds throughput), then,
   among those splits, make the fullest node as empty as possible (headroom for more
   sessions).

Where each part lives: model.py (the inputs and the plan), costs.py (stage memory, RTTs,
the feasibility test), search.py (step 2), cuts.py (step 3), planner.py (step 1, keeping
or repairing the previous chain, spares, the shortfall report, and `plan` itself).
"""

from coordinator.server.placement.model import (
    DEFAULT_COMPUTE_MS_PER_LAYER,
    DEFAULT_RTT_MS,
    MIB,
    PROCESS_OVERHEAD_BYTES,
    ModelSpec,
    NodeInfo,
    Plan,
    StageAssignment,
)
from coordinator.server.placement.planner import describe, plan

__all__ = [
    "DEFAULT_COMPUTE_MS_PER_LAYER",
    "DEFAULT_RTT_MS",
    "MIB",
    "PROCESS_OVERHEAD_BYTES",
    "ModelSpec",
    "NodeInfo",
    "Plan",
    "StageAssignment",
    "describe",
    "plan",
]
