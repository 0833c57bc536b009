"""The first and last stage on trusted nodes (coordinator/server/placement/trusted_ends.py)."""

from __future__ import annotations

import pytest

from coordinator.errors import PlacementError
from coordinator.server.placement import Plan, StageAssignment
from coordinator.server.placement.trusted_ends import with_trusted_ends
from core.types import LayerRange

pytestmark = pytest.mark.unit


def _plan(*ids: str, spares: tuple[str, ...] = (), need: int = 10) -> Plan:
    stages = tuple(StageAssignment(n, LayerRange(i, i + 1), need, 100) for i, n in enumerate(ids))
    return Plan(stages, spares, 0.0, 0)


def test_a_trusted_spare_takes_an_untrusted_end() -> None:
    plan = _plan("a", "b", "c", spares=("mine",))
    got = with_trusted_ends(plan, {"mine"}, {n: 100 for n in "abc"} | {"mine": 100}, "prefer")
    assert got.node_ids == ("a", "b", "mine") and got.spares == ("c",)


def test_trusted_middle_stages_swap_to_the_ends() -> None:
    plan = _plan("a", "t1", "t2", "b")
    got = with_trusted_ends(
        plan, {"t1", "t2"}, dict.fromkeys(("a", "t1", "t2", "b"), 100), "require"
    )
    assert got.node_ids[0] in {"t1", "t2"} and got.node_ids[-1] in {"t1", "t2"}
    assert [s.layers for s in got.stages] == [s.layers for s in plan.stages]


def test_require_refuses_a_chain_whose_ends_stay_untrusted() -> None:
    plan = _plan("a", "b", spares=("small",))
    capacity = {"a": 100, "b": 100, "small": 5}  # too small for either end
    assert with_trusted_ends(plan, {"small"}, capacity, "prefer") == plan
    with pytest.raises(PlacementError, match="trusted"):
        with_trusted_ends(plan, {"small"}, capacity, "require")
    assert with_trusted_ends(plan, set(), capacity, "off") == plan
