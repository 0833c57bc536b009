"""The stored plan (coordinator/server/plan_store.py): a round trip, and junk ignored."""

from __future__ import annotations

from coordinator.server.placement import Plan
from coordinator.server.placement.model import StageAssignment
from coordinator.server.plan_store import plan_from_json, plan_to_json
from core.types import LayerRange


def test_round_trip_keeps_stages_and_spares() -> None:
    plan = Plan(
        (
            StageAssignment("a", LayerRange(0, 3), 10, 20),
            StageAssignment("b", LayerRange(3, 8), 11, 21),
        ),
        ("s",),
        4.5,
        2,
    )
    back = plan_from_json(plan_to_json(plan))
    assert back is not None
    assert back.stages == plan.stages and back.spares == plan.spares and back.moves == 0


def test_nothing_or_junk_gives_no_plan() -> None:
    assert plan_from_json(None) is None
    assert plan_from_json("{not json") is None
    assert (
        plan_from_json('{"stages": [["a", 1, 2, 0, 0]], "spares": [], "estimated_trip_ms": 0}')
        is None
    )
