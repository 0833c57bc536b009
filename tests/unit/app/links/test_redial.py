"""app.links.redial: when a lost link is dialled again, and when it is given up; clock passed in."""

from __future__ import annotations

import asyncio

import pytest

from app.links.redial import (
    MIN_ATTEMPT_S,
    RETRY_DELAYS_S,
    attempt_budget,
    dial_until,
    retry_pause,
)
from net.errors import NetError
from net.quic.links import PeerUnreachable

pytestmark = pytest.mark.unit


def test_pauses_grow_then_repeat_the_last() -> None:
    pauses = [
        retry_pause(n, NetError("lost"), 0.0, 1e9, stop_when_unreachable=True) for n in range(6)
    ]
    assert pauses == [*RETRY_DELAYS_S, RETRY_DELAYS_S[-1], RETRY_DELAYS_S[-1]]


def test_no_attempt_is_started_that_could_not_begin_before_the_deadline() -> None:
    first = RETRY_DELAYS_S[0]
    assert retry_pause(0, TimeoutError(), 10.0, 10.0 + first + 0.01, stop_when_unreachable=True)
    assert retry_pause(0, TimeoutError(), 10.0, 10.0 + first, stop_when_unreachable=True) is None


def test_a_stopped_peer_ends_the_retries_unless_told_otherwise() -> None:
    gone = PeerUnreachable("nothing listens there")
    assert retry_pause(0, gone, 0.0, 100.0, stop_when_unreachable=True) is None
    assert retry_pause(0, gone, 0.0, 100.0, stop_when_unreachable=False) == RETRY_DELAYS_S[0]


def test_an_attempt_gets_what_is_left_but_never_too_little() -> None:
    assert attempt_budget(2.0, 10.0) == 8.0
    assert attempt_budget(9.9, 10.0) == MIN_ATTEMPT_S
    assert attempt_budget(12.0, 10.0) == MIN_ATTEMPT_S


def test_dial_until_retries_then_returns() -> None:
    calls: list[float] = []

    async def attempt(time_left: float) -> str:
        calls.append(time_left)
        if len(calls) < 3:
            raise NetError("not yet")
        return "linked"

    assert asyncio.run(dial_until(attempt, 30.0, "peer")) == "linked"
    assert len(calls) == 3 and all(0 < t <= 30.0 for t in calls)


def test_dial_until_raises_at_once_for_a_stopped_peer() -> None:
    calls = 0

    async def attempt(_time_left: float) -> str:
        nonlocal calls
        calls += 1
        raise PeerUnreachable("nothing listens there")

    with pytest.raises(PeerUnreachable):
        asyncio.run(dial_until(attempt, 30.0, "peer"))
    assert calls == 1
