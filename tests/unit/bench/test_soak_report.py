"""What the soak and the takeover bench compute from what they saw (pure parts of
bench/soak.py and bench/spare_takeover.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from bench.soak import Event, fault_stalls
from bench.soak_chaos import Fault, Target
from bench.spare_takeover import phases

pytestmark = pytest.mark.unit


def _event(at: float, kind: Target = Target.RELAY) -> Event:
    return Event(0.0, Fault(kind, kind.value, 1.0, 1.0), at=at)


def test_a_fault_is_charged_the_longest_gap_until_the_next_fault() -> None:
    events = [_event(10.0), _event(20.0, Target.CHAIN_WORKER)]
    tokens = [(9.0, 5.0), (11.0, 1.5), (14.0, 3.0), (21.0, 0.2), (30.0, 7.0)]
    # The gap that ended before the first kill is nobody's.
    assert fault_stalls(events, tokens) == [3.0, 7.0]
    assert fault_stalls([_event(40.0)], tokens) == [0.0]  # no token after it


def _line(t: float, text: str) -> str:
    stamp = dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S,%f")[:23]
    return f"{stamp} INFO app.serving.coordinated: {text}\n"


def test_takeover_phases_come_from_the_route_calls_and_the_timestamped_logs(
    tmp_path: Path,
) -> None:
    kill = 1_800_000_000.0
    (tmp_path / "spare.log").write_text(
        "downloading: 100%\n"
        + _line(kill - 5, "assigned layers [0, 3) (pre-loaded)")  # before the kill: not it
        + _line(kill + 1.25, "assigned layers [3, 6) (pre-loaded)")
        + _line(kill + 2.5, "serving layers [3, 6) as worker-x")
    )
    (tmp_path / "w0.log").write_text(_line(kill + 3.0, "next stage is now worker-x at h:1"))
    (tmp_path / "w2.log").write_text("")
    routes = [(kill - 1, True), (kill + 0.5, False), (kill + 1.0, False), (kill + 1.75, True)]
    got = phases(tmp_path, kill, routes)
    assert got == {
        "client_asked_route_s": 0.5,
        "coordinator_rerouted_s": 1.75,
        "route_requests": 3.0,
        "spare_assigned_s": 1.25,
        "spare_serving_s": 2.5,
        "upstream_retargeted_s": 3.0,
    }
