"""The fleet prediction's inputs, gathered from what the coordinator holds: the main
chain, each stage's latest step-time report, its admission figures and the links'
measured round trips. Pure: the service hands the facts in (coordinator/server/service.py)
and shows what comes out (swarm_view.py, the operator page, `sangama status`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

from coordinator.server.placement import DEFAULT_RTT_MS, ModelSpec, Plan
from coordinator.server.prediction import (
    DEFAULT_HOP_MS,
    DEFAULT_ROW_HOP_MS,
    FleetFacts,
    Prediction,
    PredictionError,
    StageFacts,
    predict,
)

__all__ = ["FleetForecast", "StageCapacity", "StageReport", "forecast"]


@dataclass(frozen=True)
class StageReport:
    """What a node's latest heartbeat said about its stage's speed."""

    step_ms: tuple[tuple[int, float], ...] = ()
    row_budget: int = 0
    compute_ms: float = 0.0
    """Its last step's time, whatever the rows: the fallback with no profile."""


@dataclass(frozen=True)
class StageCapacity:
    max_sessions: int = 0
    kv_budget_bytes: int = 0


@dataclass(frozen=True)
class FleetForecast:
    prediction: Prediction | None
    note: str
    """Why there is no prediction, or what it assumed; "" when nothing needs saying."""
    assumed_links: int = 0
    """Links of the ring no one measured yet (counted at placement's DEFAULT_RTT_MS)."""
    slowest_node: str = ""
    """The node of the stage with the longest one-row step."""


def _points(report: StageReport | None) -> tuple[tuple[int, float], ...]:
    if report is None:
        return ()
    if report.step_ms:
        return report.step_ms
    # An older worker reports only its last step: taken as a fixed cost at one row.
    return ((1, report.compute_ms),) if report.compute_ms > 0 else ()


def _round_trip(rtt: Mapping[tuple[str, str], float], a: str, b: str) -> float | None:
    """Measured round trip between two nodes (the mean where both measured), or None."""
    if a == b:
        return 0.0
    seen = [v for v in (rtt.get((a, b)), rtt.get((b, a))) if v is not None]
    return sum(seen) / len(seen) if seen else None


def forecast(
    plan: Plan | None,
    model: ModelSpec,
    reports: Mapping[str, StageReport],
    loads: Mapping[str, StageCapacity],
    rtt_ms: Mapping[tuple[str, str], float],
    context_tokens: int,
    hop_ms: float = DEFAULT_HOP_MS,
    row_hop_ms: float = DEFAULT_ROW_HOP_MS,
) -> FleetForecast:
    """The prediction for `plan`'s chain, or a note saying what it waits for."""
    if plan is None:
        return FleetForecast(None, "no plan")
    stages: list[StageFacts] = []
    kv_limits: list[int] = []
    for s in plan.stages:
        points = _points(reports.get(s.node_id))
        if not points:
            return FleetForecast(None, f"waiting for {s.node_id}'s step times")
        load = loads.get(s.node_id, StageCapacity())
        report = reports[s.node_id]
        stages.append(StageFacts(s.node_id, points, report.row_budget, load.max_sessions))
        per_token = sum(model.kv_bytes_per_token_per_layer[s.layers.start : s.layers.stop])
        per_session = per_token * context_tokens
        if per_session > 0 and load.kv_budget_bytes > 0:
            kv_limits.append(max(1, load.kv_budget_bytes // per_session))
    ids = plan.node_ids
    links: list[float] = []
    assumed = 0
    for a, b in pairwise((*ids, ids[0])):  # i -> i+1, then the last -> the first
        measured = _round_trip(rtt_ms, a, b)
        if measured is None:
            assumed += 1
        links.append((DEFAULT_RTT_MS if measured is None else measured) / 2)
    try:
        facts = FleetFacts(
            tuple(stages),
            tuple(links),
            hop_ms=hop_ms,
            row_hop_ms=row_hop_ms,
            admission_limit=min(kv_limits, default=0),
        )
        prediction = predict(facts)
    except PredictionError as exc:
        return FleetForecast(None, str(exc), assumed)
    note = f"{assumed} of {len(links)} links not measured yet: {DEFAULT_RTT_MS:.0f} ms assumed"
    slowest = plan.stages[prediction.slowest_stage].node_id
    return FleetForecast(prediction, note if assumed else "", assumed, slowest)
