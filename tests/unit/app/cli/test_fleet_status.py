"""What `sangama status --coordinator` prints from the coordinator's swarm view."""

from __future__ import annotations

from typing import Any

import pytest

from app.cli.fleet_status import FleetStatusError, describe


def _level(k: int, total: float, bound: str = "latency") -> dict[str, Any]:
    return {
        "requests": k,
        "tokens_per_s": total,
        "per_request_tokens_per_s": total / k,
        "round_ms": 1000 * k / total,
        "rows_per_step": k,
        "groups": 1,
        "bound": bound,
    }


SWARM: dict[str, Any] = {
    "model": "tiny",
    "nodes": [{"health": "healthy"}, {"health": "stale"}],
    "plan": [{"node_id": "a", "layers": [0, 3]}, {"node_id": "b", "layers": [3, 6]}],
    "plan_error": None,
    "prediction": {
        "one_request_tokens_per_s": 27.47,
        "trip_ms": 36.4,
        "compute_ms": 30.0,
        "links_ms": 5.0,
        "hops_ms": 1.4,
        "slowest_node": "b",
        "admission_limit": 4,
        "assumed_links": 0,
        "levels": [_level(1, 27.47), _level(4, 91.74, "stage 1")],
        "peak": _level(4, 91.74, "stage 1"),
    },
    "prediction_note": "",
}


def test_the_prediction_is_printed_with_its_levels() -> None:
    text = "\n".join(describe(SWARM))
    assert "model tiny, 2 stages, 2 nodes (1 healthy)" in text
    assert "a (layers 0-2) -> b (layers 3-5)" in text
    assert "one request 27.5 tokens/s (trip 36.4 ms = compute 30.0 + links 5.0 + hops 1.4" in text
    assert "at most 91.7 tokens/s in all, at 4 requests (admission limit 4)" in text
    assert any(
        line.split()[:2] == ["4", "91.7"] and "stage 1" in line for line in text.splitlines()
    )


def test_no_prediction_says_why() -> None:
    one = {**SWARM, "plan": SWARM["plan"][:1], "nodes": SWARM["nodes"][:1]}
    text = "\n".join(describe({**one, "prediction": None, "prediction_note": "waiting for b"}))
    assert "predicted   none yet: waiting for b" in text
    assert "1 stage, 1 node (1 healthy)" in text


def test_an_unreadable_view_is_a_typed_error() -> None:
    with pytest.raises(FleetStatusError):
        describe({"model": "tiny"})
