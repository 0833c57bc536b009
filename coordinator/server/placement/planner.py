"""`plan()`: the pure function the coordinator calls, and the policy around the search:
how many stages, keeping or repairing the previous chain, spares, and the shortfall
report when the fleet cannot hold the model. Reads no clock, network or database."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import pairwise
from types import MappingProxyType

from coordinator.errors import MemoryShortfall, NotEnoughMemory, PlacementError
from coordinator.server.placement.costs import Costs, RttLookup
from coordinator.server.placement.cuts import split
from coordinator.server.placement.model import (
    PROCESS_OVERHEAD_BYTES,
    ModelSpec,
    NodeInfo,
    Plan,
    StageAssignment,
)
from coordinator.server.placement.search import best_sequence, feasible_order, path_ms
from core.types import LayerRange

_NO_RTT: Mapping[tuple[str, str], float] = MappingProxyType({})
_NO_WARM: Mapping[tuple[int, int], str] = MappingProxyType({})


def _least_total(costs: Costs, stages: int) -> int:
    """What any chain of `stages` stages needs in total: all blocks, KV and state, the
    embedding, head, MTP layer and MTP cache once, the embedding again on the last stage,
    one overhead per stage."""
    m = costs.model
    total = costs.prefix[m.n_layer] + m.embedding_bytes + m.head_bytes + m.mtp_bytes
    total += costs.mtp_kv
    return total + (m.embedding_bytes if stages > 1 else 0) + stages * PROCESS_OVERHEAD_BYTES


def _shortfall(costs: Costs, healthy: Sequence[NodeInfo], min_stages: int) -> MemoryShortfall:
    n = costs.n_layer
    largest_node = max((h.capacity_bytes for h in healthy), default=0)
    stages = max(min_stages, 1, 2 if costs.need(0, n) > largest_node else 1)
    # need(a, b) between neighbouring allowed cuts is the least any stage holding those
    # layers can need: larger stages only add.
    piece, layer = max((costs.need(a, b), a) for a, b in pairwise(costs.cuts))
    return MemoryShortfall(
        needed_bytes=_least_total(costs, stages),
        available_bytes=sum(h.capacity_bytes for h in healthy),
        largest_piece_bytes=piece,
        largest_piece_layer=layer,
        largest_node_bytes=largest_node,
        healthy_nodes=len(healthy),
    )


def _assemble(
    costs: Costs,
    chain: Sequence[tuple[NodeInfo, LayerRange]],
    healthy: Sequence[NodeInfo],
    rtt: RttLookup,
    previous: Plan | None,
) -> Plan:
    stages = tuple(
        StageAssignment(n.node_id, r, costs.need(r.start, r.stop), n.capacity_bytes)
        for n, r in chain
    )
    in_chain = {s.node_id for s in stages}
    ms_per_layer = costs.model.compute_ms_per_layer
    compute = sum(len(r) * ms_per_layer / n.compute_speed for n, r in chain)
    trip = compute + path_ms([s.node_id for s in stages], rtt, None, None)
    old = {} if previous is None else {s.node_id: s.layers for s in previous.stages}
    new = {s.node_id: s.layers for s in stages}
    moves = sum(1 for h in healthy if old.get(h.node_id) != new.get(h.node_id))
    return Plan(
        stages=stages,
        spares=tuple(sorted(h.node_id for h in healthy if h.node_id not in in_chain)),
        estimated_trip_ms=trip,
        moves=moves,
    )


def _keep_or_repair(
    costs: Costs,
    previous: Plan,
    healthy: Sequence[NodeInfo],
    rtt: RttLookup,
    min_stages: int,
    warm: Mapping[tuple[int, int], str] = _NO_WARM,
) -> Plan | None:
    """The previous chain where it still works, gaps refilled with as few nodes as possible
    from outside the kept chain; None when that is not possible. A gap of one stage whose
    layers a spare in `warm` holds ready (loaded or downloaded) goes to that spare: it
    serves at once, where the cheapest newcomer would first load."""
    if not previous.covers(costs.n_layer):
        return None
    if any(not costs.allows(s.layers.stop) for s in previous.stages):
        return None  # cut where this model is not exact: plan afresh
    by_id = {h.node_id: h for h in healthy}
    broken = [
        i
        for i, s in enumerate(previous.stages)
        if (node := by_id.get(s.node_id)) is None
        or costs.need(s.layers.start, s.layers.stop) > node.capacity_bytes
    ]
    kept = {s.node_id for i, s in enumerate(previous.stages) if i not in broken}
    pool = [h for h in healthy if h.node_id not in kept]
    chain: list[tuple[NodeInfo, LayerRange]] = []
    i, stages = 0, previous.stages
    while i < len(stages):
        if i not in broken:
            chain.append((by_id[stages[i].node_id], stages[i].layers))
            i += 1
            continue
        j = i
        while j + 1 < len(stages) and j + 1 in broken:
            j += 1
        lo, hi = stages[i].layers.start, stages[j].layers.stop
        before = stages[i - 1].node_id if i > 0 else None
        after = stages[j + 1].node_id if j + 1 < len(stages) else None
        seq: tuple[NodeInfo, ...] | None = None
        ready = by_id.get(warm.get((lo, hi), ""))
        if (
            i == j
            and ready in pool
            and ready is not None
            and costs.need(lo, hi) <= ready.capacity_bytes
        ):
            seq = (ready,)
        for m in range(1, min(len(pool), hi - lo) + 1):  # fewest newcomers = fewest moves
            if seq is not None:
                break
            if (seq := best_sequence(costs, pool, m, lo, hi, rtt, before, after)) is not None:
                break
        if seq is None:
            return None
        cuts = split(costs, seq, lo, hi)
        chain.extend((n, LayerRange(a, b)) for n, (a, b) in zip(seq, pairwise(cuts), strict=True))
        used = {n.node_id for n in seq}
        pool = [p for p in pool if p.node_id not in used]
        i = j + 1
    if len(chain) < min_stages:
        return None
    return _assemble(costs, chain, healthy, rtt, previous)


def _fresh(
    costs: Costs,
    healthy: Sequence[NodeInfo],
    rtt: RttLookup,
    previous: Plan | None,
    spares: int,
    min_stages: int,
) -> Plan:
    n = costs.n_layer
    largest_first = sorted(healthy, key=lambda h: (-h.capacity_bytes, h.node_id))
    most = min(len(healthy), costs.units)

    def fits(k: int) -> bool:
        top = largest_first[:k]
        enough = sum(h.capacity_bytes for h in top) >= _least_total(costs, k)  # cheap test first
        return enough and feasible_order(costs, top, 0, n) is not None

    k = next((k for k in range(min_stages, most + 1) if fits(k)), None)
    if k is None:
        raise NotEnoughMemory(_shortfall(costs, healthy, min_stages))
    if len(healthy) - k < spares:
        # Too few nodes to keep the spares anyway: spread over all that fit instead.
        k = next((j for j in range(most, k, -1) if fits(j)), k)
    seq = best_sequence(costs, healthy, k, 0, n, rtt)
    if seq is None:  # the k largest fit, and they are among the candidates
        raise PlacementError("internal: no sequence found for a chain length that fits")
    cuts = split(costs, seq, 0, n)
    chain = [(node, LayerRange(a, b)) for node, (a, b) in zip(seq, pairwise(cuts), strict=True)]
    return _assemble(costs, chain, healthy, rtt, previous)


def plan(
    model: ModelSpec,
    nodes: Sequence[NodeInfo],
    *,
    rtt_ms: Mapping[tuple[str, str], float] = _NO_RTT,
    previous: Plan | None = None,
    sessions_per_stage: int = 8,
    context_tokens: int = 4096,
    spares: int = 1,
    min_stages: int = 1,
    warm: Mapping[tuple[int, int], str] = _NO_WARM,
) -> Plan:
    """A chain of stages for `model` on the healthy `nodes` (see the module docstring).

    `rtt_ms` holds measured round trips, either direction of a pair; unmeasured pairs
    count DEFAULT_RTT_MS. With `previous`, the old chain is kept as is when all its nodes
    are healthy and still fit (moves=0), else its gaps are refilled from outside the
    chain, else a fresh plan is made. `spares` nodes stay out of the chain when the
    fleet allows; when it does not, every node that can take a stage joins the chain.
    `warm` maps a stage's layers to the spare standing by for them, preferred in a repair.

    Raises NotEnoughMemory when the healthy nodes cannot hold the model (with numbers),
    PlacementError when `min_stages` asks for more stages than layers or healthy nodes.
    """
    if sessions_per_stage < 0 or context_tokens < 0 or spares < 0 or min_stages < 1:
        raise ValueError("sessions, context and spares must be >= 0, min_stages >= 1")
    if any(not (math.isfinite(v) and v >= 0) for v in rtt_ms.values()):
        raise ValueError("RTTs must be finite and >= 0")
    ids = [n.node_id for n in nodes]
    if len(set(ids)) != len(ids):
        raise PlacementError("two nodes share a node_id")
    if min_stages > len(model.cut_points) - 1:
        raise PlacementError(
            f"min_stages={min_stages} exceeds the {len(model.cut_points) - 1} stages "
            f"the model's {model.n_layer} layers can be cut into"
        )
    healthy = sorted((n for n in nodes if n.healthy), key=lambda n: n.node_id)
    costs = Costs.of(model, sessions_per_stage, context_tokens)
    report = _shortfall(costs, healthy, min_stages)
    if report.total_short or report.piece_too_big or not healthy:
        raise NotEnoughMemory(report)
    if min_stages > len(healthy):
        raise PlacementError(f"min_stages={min_stages} but only {len(healthy)} healthy nodes")
    rtt = RttLookup(rtt_ms)
    if previous is not None:
        kept = _keep_or_repair(costs, previous, healthy, rtt, min_stages, warm)
        if kept is not None:
            return kept
    return _fresh(costs, healthy, rtt, previous, spares, min_stages)


def describe(p: Plan) -> str:
    """A small table of the chain, for the CLI and closing notes."""
    rows = [f"{'stage':>5}  {'node':<16} {'layers':<13} {'n':>3} {'needs':>9} {'of':>9} {'use':>5}"]
    for i, s in enumerate(p.stages):
        use = s.bytes_needed / s.capacity_bytes if s.capacity_bytes else math.inf
        rows.append(
            f"{i:>5}  {s.node_id:<16} {s.layers!s:<13} {len(s.layers):>3} "
            f"{s.bytes_needed / 1e9:>6.1f} GB {s.capacity_bytes / 1e9:>6.1f} GB {use:>5.0%}"
        )
    rows.append(f"spares: {', '.join(p.spares) or 'none'}")
    rows.append(
        f"estimated trip: {p.estimated_trip_ms:.1f} ms per token "
        f"({len(p.stages)} stages, {len(p.stages) - 1} hops) · moves: {p.moves}"
    )
    return "\n".join(rows)
