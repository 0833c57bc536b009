"""Dialling a peer again until a deadline: the one retry policy for every lost link."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from net.errors import NetError
from net.quic.links import PeerUnreachable

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_DELAYS_S = (0.25, 0.5, 1.0, 2.0)
"""Pauses between attempts; the last one repeats."""
MIN_ATTEMPT_S = 0.5
"""Even close to the deadline an attempt gets this long: a dial needs a round trip or two."""


def retry_pause(
    attempt: int, error: Exception, now: float, deadline: float, *, stop_when_unreachable: bool
) -> float | None:
    """The pause before dialling again after attempt number `attempt` (from 0) failed with
    `error` at `now`, or None to give up and raise it. Pure: the clock is passed in."""
    pause = RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)]
    if stop_when_unreachable and isinstance(error, PeerUnreachable):
        return None  # the host answered that nothing listens: the peer stopped
    if now + pause >= deadline:
        return None  # the next attempt could not start before the deadline
    return pause


def attempt_budget(now: float, deadline: float) -> float:
    """Seconds one attempt may take: what is left, but never too little to dial at all."""
    return max(deadline - now, MIN_ATTEMPT_S)


async def dial_until(
    attempt: Callable[[float], Awaitable[T]],
    within_s: float,
    what: str,
    *,
    stop_when_unreachable: bool = True,
) -> T:
    """Call `attempt(time_left_s)` until it returns or `within_s` has passed; raise the
    last error then. A peer whose host says nothing listens there (`PeerUnreachable`)
    has stopped, not lost its path: with `stop_when_unreachable` that ends it at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    n = 0
    while True:
        try:
            return await attempt(attempt_budget(loop.time(), deadline))
        except (NetError, OSError, TimeoutError) as exc:
            pause = retry_pause(
                n, exc, loop.time(), deadline, stop_when_unreachable=stop_when_unreachable
            )
            if pause is None:
                raise
            log.info("%s: %s; dialling again", what, exc)
        n += 1
        await asyncio.sleep(pause)
