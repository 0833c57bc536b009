"""A keepalive that finds the QUIC library's connection already closed (qh3 raises when
the peer's close is still unprocessed) ends the link quietly instead of raising out of
an event-loop callback, where nothing catches it and the loop logs a traceback."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from net.quic.links import QuicLink, QuicTuning

pytestmark = pytest.mark.unit


class _ClosedQuic:
    def send_ping(self, _uid: int) -> None:
        raise RuntimeError("connection is closed")

    def get_timer(self) -> None:
        return None


class _Path:
    closed = False

    def close(self) -> None:
        self.closed = True


def test_a_keepalive_on_a_connection_closed_underneath_ends_the_link() -> None:
    async def scenario() -> tuple[str, list[str], list[Any]]:
        errors: list[Any] = []
        asyncio.get_running_loop().set_exception_handler(lambda _l, ctx: errors.append(ctx))
        link = QuicLink(_ClosedQuic(), _Path(), ("127.0.0.1", 9), QuicTuning(keepalive=0.01))  # type: ignore[arg-type]
        seen: list[str] = []
        link.on_close = seen.append
        link._last_activity = 0.0  # long idle: the tick pings
        link._keepalive_tick()
        return await asyncio.wait_for(link.closed, 1), seen, errors

    reason, seen, errors = asyncio.run(scenario())
    assert "connection closed" in reason and seen == [reason]
    assert errors == []
