"""Warm spares on the coordinator's side: which spare stands by for which stage (from
the plan, the nodes' measured uptime and declared availability; the choice itself is
spare_policy's pure function), and the standby assignment a spare's heartbeat gets."""

from __future__ import annotations

import time
from collections.abc import Mapping

from coordinator import contract
from coordinator.contract import Assignment
from coordinator.server.placement import Plan
from coordinator.server.spare_policy import NodeFacts, StageNeed, Standby, choose_standby


def standby_of(
    plan: Plan | None,
    up_since: Mapping[str, float],
    until: Mapping[str, float],
    capacities: Mapping[str, int],
    now: float | None = None,
) -> Standby:
    """Which spare keeps which stage ready, and the stages none does."""
    if plan is None:
        return Standby({}, ())
    at = time.time() if now is None else now
    facts = {
        node: NodeFacts(
            uptime_s=at - since,
            leaves_in_s=(until[node] - at) if node in until else None,
        )
        for node, since in up_since.items()
    }
    needs = [
        StageNeed(s.node_id, (s.layers.start, s.layers.stop), s.bytes_needed) for s in plan.stages
    ]
    spares = {s: capacities.get(s, 0) for s in plan.spares}
    return choose_standby(needs, spares, facts)


def warm_layers(standby: Standby) -> dict[tuple[int, int], str]:
    """Layers -> the spare standing by for them: what a repair should hand the stage to."""
    return {layers: node for node, layers in sorted(standby.by_spare.items())}


def standby_assignment(
    model: str, layers: tuple[int, int], sessions_per_stage: int, context_tokens: int
) -> Assignment:
    """The assignment a spare gets ready for: the stage's, with no next hop yet."""
    return Assignment(
        model,
        layers,
        None,
        contract.manifest_path(model),
        contract.pieces_path(model),
        max_sessions=sessions_per_stage,
        context_tokens=context_tokens,
    )
