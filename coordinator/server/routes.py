"""More than one chain, and which one a new route goes to: pure functions, no IO.

When the healthy nodes left outside the main chain can hold the whole model again, they
form another complete chain (`plan_chains`: placement's own `plan`, repeated on the
nodes no chain uses yet). A client asking for a route is then sent along the chain with
the most room by measured load (`pick_chain`): each stage's heartbeat says how many
sessions it runs and how much of its KV budget they reserved (core.admission on the
worker), and a chain has the room of its fullest stage. Heartbeats come every few
seconds, so routes handed out since a chain's last beat count as sessions already.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from coordinator.errors import PlacementError
from coordinator.server.placement import ModelSpec, NodeInfo, Plan, plan

__all__ = ["StageLoad", "chain_room", "pick_chain", "plan_chains"]


@dataclass(frozen=True)
class StageLoad:
    """One stage's load, from its node's latest heartbeat."""

    sessions: int = 0
    max_sessions: int = 0
    """0: not reported yet (the stage is loading): counted as empty."""
    kv_budget_bytes: int = 0
    kv_reserved_bytes: int = 0


def chain_room(stages: Sequence[StageLoad], handed: int = 0) -> float:
    """The free share of the chain's fullest stage (0..1): sessions and KV both count,
    with `handed` routes given out since the beats as sessions more."""
    room = 1.0
    for s in stages:
        if s.max_sessions <= 0:
            continue
        per_session = s.kv_reserved_bytes / s.sessions if s.sessions else 0.0
        free_slots = 1.0 - (s.sessions + handed) / s.max_sessions
        if s.kv_budget_bytes > 0:
            kv = (s.kv_reserved_bytes + handed * per_session) / s.kv_budget_bytes
            free_slots = min(free_slots, 1.0 - kv)
        room = min(room, free_slots)
    return max(0.0, room)


def pick_chain(chains: Sequence[Sequence[StageLoad]], handed: Sequence[int]) -> int:
    """The index of the chain with the most room; ties go to the earlier chain (the main
    one, placed first and shortest)."""
    if not chains or len(handed) != len(chains):
        raise ValueError("one handed count per chain, and at least one chain")
    return max(range(len(chains)), key=lambda i: (chain_room(chains[i], handed[i]), -i))


def plan_chains(
    model: ModelSpec,
    nodes: Sequence[NodeInfo],
    *,
    max_chains: int,
    rtt_ms: Mapping[tuple[str, str], float],
    previous: Sequence[Plan] = (),
    sessions_per_stage: int,
    context_tokens: int,
    spares: int,
    min_stages: int,
    warm: Mapping[tuple[int, int], str] = MappingProxyType({}),
) -> list[Plan]:
    """The main chain (raises like `plan`), then up to `max_chains - 1` more from nodes
    outside every chain so far, while they can hold the model; spares are kept out of
    the main chain only, so extra chains are made of what is left after them."""
    main = plan(
        model,
        nodes,
        rtt_ms=rtt_ms,
        previous=previous[0] if previous else None,
        sessions_per_stage=sessions_per_stage,
        context_tokens=context_tokens,
        spares=spares,
        min_stages=min_stages,
        warm=warm,
    )
    chains = [main]
    used = set(main.node_ids)
    kept = set(main.spares[:spares])  # the spares the main chain keeps for itself
    while len(chains) < max_chains:
        rest = [n for n in nodes if n.node_id not in used and n.node_id not in kept]
        if not rest:
            break
        before = previous[len(chains)] if len(previous) > len(chains) else None
        try:
            extra = plan(
                model,
                rest,
                rtt_ms=rtt_ms,
                previous=before,
                sessions_per_stage=sessions_per_stage,
                context_tokens=context_tokens,
                spares=0,
                min_stages=min_stages,
            )
        except PlacementError:  # what is left cannot hold the model again
            break
        chains.append(extra)
        used |= set(extra.node_ids)
    return chains
