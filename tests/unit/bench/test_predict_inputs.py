"""bench/predict.py's inputs: rows per step from shared step times, the ring's links."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.client.swarm_client import TokenEvent
from bench.load import wan20
from bench.predict import links_of, profile, steps_of
from net import wire

pytestmark = pytest.mark.unit


def _event(*compute_ms: float) -> TokenEvent:
    timings = tuple(wire.StageTiming(i, ms, 0.0, ms) for i, ms in enumerate(compute_ms))
    return TokenEvent((1,), 0, timings, 10.0)


def test_rows_that_shared_a_step_share_its_time() -> None:
    # stage 0: one step of three rows (5.0 ms) and one of one row (2.0 ms)
    events = [_event(5.0, 1.0), _event(5.0, 1.5), _event(5.0, 1.25), _event(2.0, 1.75)]
    assert steps_of(events, 0) == [(3, 5.0), (1, 2.0)]
    assert profile(steps_of(events, 0)) == ((1, 2.0), (3, 5.0))  # as the worker reports
    assert steps_of(events, 1) == [(1, 1.0), (1, 1.5), (1, 1.25), (1, 1.75)]


def test_the_ring_crosses_the_links_between_stages_and_the_clients_proxy() -> None:
    chain = wan20([1, 16], 16, Path("tiny20.gguf"))  # not opened: only the plan
    d = chain.link_delays_ms or []
    links = links_of(chain)
    assert len(links) == 20 and links[-1] == d[0] and list(links[:-1]) == d[1:20]
    assert sum(links) == sum(d[:-1])  # the last stage's link to the client is off the ring
