"""The prediction's inputs as the coordinator gathers them: reports, loads, round trips."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.server.fleet_view import FleetForecast, StageCapacity, StageReport, forecast
from coordinator.server.placement import DEFAULT_RTT_MS, ModelSpec, Plan, StageAssignment
from coordinator.server.prediction import Prediction
from core.types import LayerRange

MODEL = ModelSpec(
    n_layer=6,
    bytes_per_layer=(1,) * 6,
    kv_bytes_per_token_per_layer=(10,) * 6,
    embedding_bytes=1,
    head_bytes=1,
)
PLAN = Plan(
    stages=(
        StageAssignment("a", LayerRange(0, 2), 0, 1),
        StageAssignment("b", LayerRange(2, 6), 0, 1),
    ),
    spares=(),
    estimated_trip_ms=0.0,
    moves=0,
)
REPORTS = {"a": StageReport(((1, 10.0),), row_budget=8), "b": StageReport(compute_ms=20.0)}


def run(**kw: Any) -> FleetForecast:
    args: dict[str, Any] = {
        "plan": PLAN,
        "model": MODEL,
        "reports": REPORTS,
        "loads": {},
        "rtt_ms": {("a", "b"): 4.0, ("b", "a"): 6.0},
        "context_tokens": 100,
        "hop_ms": 0.0,
        "row_hop_ms": 0.0,
    }
    args.update(kw)
    return forecast(**args)


def predicted(**kw: Any) -> Prediction:
    p = run(**kw).prediction
    assert p is not None
    return p


def test_the_ring_crosses_each_measured_link_at_half_its_round_trip() -> None:
    fc = run()
    assert fc.prediction is not None
    # steps 10 + 20 (b's last step, with no profile), links a->b and b->a at 5 / 2 each
    assert fc.prediction.trip_ms == pytest.approx(35.0)
    assert (fc.note, fc.assumed_links, fc.slowest_node) == ("", 0, "b")


def test_an_unmeasured_link_counts_placements_default_and_says_so() -> None:
    p = predicted(rtt_ms={("a", "b"): 4.0})
    # a -> b measured one way only (4 ms), b -> a is the same pair: both links 2 ms
    assert p.trip_ms == pytest.approx(34.0)
    fc = run(rtt_ms={})
    assert fc.assumed_links == 2 and fc.prediction is not None
    assert fc.prediction.links_ms == pytest.approx(DEFAULT_RTT_MS)
    assert "2 of 2 links not measured" in fc.note


def test_the_kv_budget_and_the_sequence_slots_cap_the_levels() -> None:
    # stage a: 2 layers x 10 B x 100 positions = 2000 B a session; 10 000 B hold 5
    loads = {"a": StageCapacity(256, 10_000), "b": StageCapacity(3, 0)}
    p = predicted(loads=loads)
    assert p.admission_limit == 3
    p = predicted(loads={"a": StageCapacity(256, 10_000)})
    assert p.admission_limit == 5 and p.levels[-1].requests == 5


def test_no_prediction_until_every_stage_reported() -> None:
    fc = run(reports={"a": REPORTS["a"], "b": StageReport()})
    assert fc.prediction is None and fc.note == "waiting for b's step times"
    assert run(plan=None).note == "no plan"
