"""What placement is given: the workers it may use now, their capacities held to the
evidence, the nodes the operator trusts and the operator's placement rules. Pure: the
Coordinator gathers the nodes' rows and what it remembers of them, and passes them in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace

from coordinator.server.models import Rules
from coordinator.server.node_claims import hardware_bytes, is_lan_address, peer_bound_capacities
from coordinator.server.node_memory import PlacementFacts
from coordinator.server.placement import NodeInfo
from coordinator.server.service_settings import CoordinatorSettings
from coordinator.server.store import Node

TRUSTED_NODES = "trusted_nodes"
"""Setting: the JSON list of node ids the operator marked trusted (for trusted ends)."""
MAX_TRUSTED_CHARS = 4000
"""The settings column's width."""


def placement_capacity(node: Node) -> int:
    """What placement may put on a node: its offer, never more than the volunteer's VRAM
    cap (a worker that reports a larger offer than its cap is held to the cap)."""
    capacity = max(0, int(node.capacity_bytes))
    cap = int(node.vram_cap_bytes or 0)
    return min(capacity, cap) if cap > 0 else capacity


def placeable(
    nodes: Iterable[Node],
    health: Callable[[Node], str],
    facts: PlacementFacts,
    verified: Mapping[str, str],
    faulty: Collection[str],
) -> list[Node]:
    """The workers placement may use: healthy (or stale, unless a client found them
    dead), unpaused, not caught by a spot check, at an address that answered."""
    return [
        n
        for n in nodes
        if n.role == "worker"
        and n.address
        # It answered at this address, or it sits behind a home router (ICE reaches it).
        and (verified.get(n.node_id) == n.address or is_lan_address(n.address))
        and n.node_id not in facts.paused
        and n.node_id not in facts.gone
        and n.node_id not in faulty
        and (health(n) == "healthy" or (health(n) == "stale" and n.node_id not in facts.suspects))
    ]


def node_infos(
    workers: Iterable[Node], proven: Mapping[str, int]
) -> tuple[tuple[NodeInfo, ...], tuple[NodeInfo, ...]]:
    """The workers as placement sees them: capacities bounded by what their peers offer
    unless they served more themselves, and their claims held only to their hardware
    report (node_claims.bounded_capacity)."""
    workers = list(workers)
    clamped = {n.node_id: min(placement_capacity(n), hardware_bytes(n.hardware)) for n in workers}
    bounded = peer_bound_capacities(clamped, proven)
    infos = tuple(
        NodeInfo(n.node_id, bounded[n.node_id], healthy=True, address=n.address) for n in workers
    )
    claims = tuple(replace(i, capacity_bytes=clamped[i.node_id]) for i in infos)
    return infos, claims


def rules_of(settings: CoordinatorSettings) -> Rules:
    s = settings
    return Rules(
        max_chains=s.max_chains,
        spares=s.spares,
        min_stages=s.min_stages,
        sessions_per_stage=s.sessions_per_stage,
        context_tokens=s.context_tokens,
        trusted_ends=s.trusted_ends,
    )


def trusted_from(stored: str | None) -> frozenset[str]:
    """The trusted node ids kept in the TRUSTED_NODES setting (none if unreadable)."""
    try:
        ids = json.loads(stored) if stored else []
    except ValueError:
        ids = []
    return frozenset(str(i) for i in ids if isinstance(i, str))


def trusted_text(ids: Collection[str]) -> str:
    """The TRUSTED_NODES setting for these ids; ValueError when it would not fit."""
    text = json.dumps(sorted(ids))
    if len(text) > MAX_TRUSTED_CHARS:
        raise ValueError("too many trusted nodes to store; unmark some first")
    return text
