"""A node renews its relay credentials itself (app.links.paths.IceConfigSource): they live
under half an hour, and a node serves for days."""

from __future__ import annotations

import pytest

from app.links.paths import IceConfigSource
from coordinator.contract import TurnAnswer
from coordinator.errors import CoordinatorError

pytestmark = pytest.mark.unit


class _Coordinator:
    def __init__(self) -> None:
        self.calls = 0
        self.down = False

    def turn(self) -> TurnAnswer:
        if self.down:
            raise CoordinatorError("unreachable")
        self.calls += 1
        return TurnAnswer("relay", 3478, f"{1000 + self.calls}:node-a", "pw", 1000, ())


def test_credentials_are_renewed_once_half_their_life_has_passed() -> None:
    now = [0.0]
    coord = _Coordinator()
    source = IceConfigSource(coord, relay_only=True, clock=lambda: now[0])  # type: ignore[arg-type]
    first = source.current()
    assert first.turn_username == "1001:node-a" and first.relay_only
    now[0] = 499.0
    assert source.current() is first and coord.calls == 1
    now[0] = 500.0
    renewed = source.current()
    assert renewed.turn_username == "1002:node-a" and renewed.relay_only


def test_an_unreachable_coordinator_keeps_the_old_credentials_for_now() -> None:
    now = [0.0]
    coord = _Coordinator()
    source = IceConfigSource(coord, clock=lambda: now[0])  # type: ignore[arg-type]
    first = source.current()
    coord.down, now[0] = True, 600.0
    assert source.current() is first
    coord.down, now[0] = False, 640.0  # retried 30 s later
    assert source.current().turn_username == "1002:node-a"
    fresh = IceConfigSource(_Coordinator(), clock=lambda: 0.0)  # type: ignore[arg-type]
    fresh.client.down = True  # type: ignore[attr-defined]
    with pytest.raises(CoordinatorError):
        fresh.current()
