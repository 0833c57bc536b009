"""Signals go only along the plan's links, bounded (coordinator/server/signalling.py)."""

from __future__ import annotations

import pytest

from coordinator.contract import Signal
from coordinator.server.placement import Plan, StageAssignment
from coordinator.server.signalling import (
    MAX_FROM_ONE,
    SignalBoxes,
    SignalRefused,
    planned_peers,
)
from core.types import LayerRange

pytestmark = pytest.mark.unit


def _chain(*ids: str, spares: tuple[str, ...] = ()) -> Plan:
    stages = tuple(StageAssignment(n, LayerRange(i, i + 1), 1, 1) for i, n in enumerate(ids))
    return Plan(stages, spares, 0.0, 0)


def test_planned_peers_are_neighbours_the_ring_and_a_clients_stages() -> None:
    chain = _chain("s0", "s1", "s2", "s3", spares=("spare",))
    assert planned_peers([chain], "s1", "worker") == {"s0", "s2"}
    assert planned_peers([chain], "s0", "worker") == {"s1", "s3"}  # the ring closes
    assert planned_peers([chain], "s3", "worker") == {"s2", "s0"}
    assert planned_peers([chain], "spare", "worker") == set()
    assert planned_peers([chain], "c", "client") == {"s0", "s1", "s2", "s3"}
    assert planned_peers([], "c", "client") == set()


def _offer(src: str, link: str = "abc.1", kind: str = "offer") -> Signal:
    return Signal(src, kind, link, {"ufrag": "x"})


def test_offers_only_along_links_and_answers_only_to_offers() -> None:
    boxes = SignalBoxes()
    with pytest.raises(SignalRefused) as refused:
        boxes.post(_offer("c"), "idle", allowed={"s0"}, now=0.0)
    assert refused.value.status == 403
    with pytest.raises(SignalRefused):  # an answer nobody asked for
        boxes.post(_offer("s0", kind="answer"), "c", allowed=set(), now=0.0)
    boxes.post(_offer("c"), "s0", allowed={"s0"}, now=0.0)
    assert boxes.take("s0", now=1.0) == [_offer("c")]
    boxes.post(_offer("s0", kind="answer"), "c", allowed=set(), now=1.0)
    assert [s.kind for s in boxes.take("c", now=1.0)] == ["answer"]
    with pytest.raises(SignalRefused):  # another link's answer
        boxes.post(_offer("s0", link="zzz.1", kind="answer"), "c", allowed=set(), now=1.0)


def test_unread_signals_expire_and_each_sender_is_bounded() -> None:
    boxes = SignalBoxes(ttl_s=30.0)
    for i in range(MAX_FROM_ONE):
        boxes.post(_offer("c", link=f"l{i}.1"), "s0", allowed={"s0"}, now=float(i))
    with pytest.raises(SignalRefused) as refused:
        boxes.post(_offer("c", link="more.1"), "s0", allowed={"s0"}, now=8.0)
    assert refused.value.status == 429
    assert boxes.unread == MAX_FROM_ONE
    assert boxes.take("s0", now=100.0) == []  # nobody waits for them any more
    assert boxes.unread == 0


def test_a_sender_has_a_rate() -> None:
    boxes = SignalBoxes()
    sent = 0
    with pytest.raises(SignalRefused) as refused:
        for i in range(100):
            boxes.post(
                _offer("c", link=f"l{i}.1"), f"s{i % 4}", allowed={"s0", "s1", "s2", "s3"}, now=0.0
            )
            sent += 1
    assert refused.value.status == 429 and refused.value.retry_after_s > 0
    assert 0 < sent < 16
