"""Which spare stands by for which stage (coordinator/server/spare_policy.py)."""

from __future__ import annotations

from coordinator.server.spare_policy import (
    NodeFacts,
    StageNeed,
    choose_standby,
    risk,
)

STAGES = [
    StageNeed("a", (0, 3), 100),
    StageNeed("b", (3, 6), 100),
    StageNeed("c", (6, 8), 300),
]
HOUR = 3600.0


def test_a_declared_departure_outranks_any_measured_uptime() -> None:
    assert risk(NodeFacts(uptime_s=0.0, leaves_in_s=None)) == 1.0
    assert risk(NodeFacts(uptime_s=10 * HOUR, leaves_in_s=30 * 60)) > 1.0
    soon, later = NodeFacts(HOUR, leaves_in_s=60), NodeFacts(HOUR, leaves_in_s=1800)
    assert risk(soon) > risk(later)
    # Past the horizon a declaration counts like none.
    assert risk(NodeFacts(HOUR, leaves_in_s=5 * HOUR)) == risk(NodeFacts(HOUR))


def test_the_spare_stands_by_for_the_stage_leaving_soonest() -> None:
    facts = {
        "a": NodeFacts(uptime_s=60.0),  # just joined
        "b": NodeFacts(uptime_s=5 * HOUR, leaves_in_s=600.0),  # says it leaves in 10 min
        "c": NodeFacts(uptime_s=5 * HOUR),
    }
    chosen = choose_standby(STAGES, {"s": 1000}, facts)
    assert dict(chosen.by_spare) == {"s": (3, 6)}
    assert chosen.uncovered == ((0, 3), (6, 8))


def test_without_declarations_the_shortest_uptime_is_most_at_risk() -> None:
    facts = {n: NodeFacts(uptime_s=u) for n, u in (("a", 5 * HOUR), ("b", 9 * HOUR), ("c", 60))}
    chosen = choose_standby(STAGES, {"s": 1000}, facts)
    assert dict(chosen.by_spare) == {"s": (6, 8)}


def test_a_spare_only_stands_by_for_a_stage_it_can_hold() -> None:
    facts = {"c": NodeFacts(uptime_s=0.0, leaves_in_s=10.0)}
    # "small" cannot hold c's 300 bytes: it takes the next riskiest it fits, "big" takes c.
    chosen = choose_standby(STAGES, {"small": 150, "big": 400}, facts)
    assert chosen.by_spare["big"] == (6, 8)
    assert chosen.by_spare["small"] in {(0, 3), (3, 6)}
    assert len(chosen.uncovered) == 1
    nothing_fits = choose_standby(STAGES, {"tiny": 10}, facts)
    assert not nothing_fits.by_spare and len(nothing_fits.uncovered) == 3


def test_the_coordinator_side_maps_a_plan_to_the_warm_spare_per_stage() -> None:
    from coordinator.server.placement import Plan, StageAssignment
    from coordinator.server.standby import standby_assignment, standby_of, warm_layers
    from core.types import LayerRange

    stages = tuple(
        StageAssignment(n, LayerRange(a, b), 100, 1000)
        for n, (a, b) in zip("abc", [(0, 3), (3, 6), (6, 8)], strict=True)
    )
    plan = Plan(stages=stages, spares=("s",), estimated_trip_ms=1.0, moves=0)
    now = 10 * HOUR
    up = {"a": 0.0, "b": 0.0, "c": 0.0, "s": 0.0}
    chosen = standby_of(plan, up, {"b": now + 60}, {"s": 1000}, now=now)  # b leaves soon
    assert chosen.by_spare == {"s": (3, 6)} and chosen.uncovered == ((0, 3), (6, 8))
    assert warm_layers(chosen) == {(3, 6): "s"}
    assert standby_of(None, up, {}, {"s": 1000}, now=now).by_spare == {}
    ready = standby_assignment("m", (3, 6), 4, 512)
    assert ready.layers == (3, 6) and ready.next_hop is None and ready.max_sessions == 4
