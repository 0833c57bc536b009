"""Trusted ends: the first and last stage on nodes the operator trusts. Pure.

The first stage reads every prompt (it embeds the tokens); the last stage chooses every
answer (it samples). Middle stages see only hidden states. An operator who runs some
nodes of their own can keep both ends there: after placement, an untrusted node at an
end trades places with a trusted one (a spare, or a middle stage whose layers each can
hold), and with `require` no chain is formed without trusted ends.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from coordinator.errors import PlacementError
from coordinator.server.placement.model import Plan, StageAssignment

MODES = ("off", "prefer", "require")


def with_trusted_ends(
    plan: Plan, trusted: Collection[str], capacity: Mapping[str, int], mode: str
) -> Plan:
    """`plan` with trusted nodes at its first and last stage where they fit; the
    PlacementError of `require` when an end stays untrusted. `capacity`: what placement
    may put on each node (the same figures the plan was made with)."""
    if mode not in MODES:
        raise ValueError(f"trusted ends: one of {MODES}, not {mode!r}")
    if mode == "off":
        return plan
    for end in dict.fromkeys((len(plan.stages) - 1, 0)):  # the last first: it picks answers
        plan = _trusted_at(plan, end, trusted, capacity)
    ends = {plan.stages[0].node_id, plan.stages[-1].node_id}
    if mode == "require" and not ends <= set(trusted):
        untrusted = ", ".join(sorted(ends - set(trusted)))
        raise PlacementError(f"no trusted node can take the first and last stage ({untrusted})")
    return plan


def _trusted_at(
    plan: Plan, end: int, trusted: Collection[str], capacity: Mapping[str, int]
) -> Plan:
    stages = list(plan.stages)
    here = stages[end]
    if here.node_id in trusted:
        return plan
    need = here.bytes_needed
    # A trusted spare first: nothing else moves.
    for spare in plan.spares:
        if spare in trusted and capacity.get(spare, 0) >= need:
            stages[end] = _on(here, spare, capacity)
            spares = tuple(here.node_id if s == spare else s for s in plan.spares)
            return replace(plan, stages=tuple(stages), spares=spares, moves=plan.moves + 2)
    # Else a trusted middle stage, if each node can hold the other's layers.
    ends = {0, len(stages) - 1}
    for i, other in enumerate(stages):
        if i in ends or other.node_id not in trusted:
            continue
        if capacity.get(other.node_id, 0) >= need and capacity.get(here.node_id, 0) >= (
            other.bytes_needed
        ):
            stages[end], stages[i] = (
                _on(here, other.node_id, capacity),
                _on(other, here.node_id, capacity),
            )
            return replace(plan, stages=tuple(stages), moves=plan.moves + 2)
    return plan


def _on(stage: StageAssignment, node_id: str, capacity: Mapping[str, int]) -> StageAssignment:
    return replace(stage, node_id=node_id, capacity_bytes=capacity.get(node_id, 0))
