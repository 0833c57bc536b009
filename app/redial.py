"""Dialling a peer again until a deadline: the one retry policy for every lost link."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from net.errors import NetError
from net.quic import PeerUnreachable

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_DELAYS_S = (0.25, 0.5, 1.0, 2.0)
"""Pauses between attempts; the last one repeats."""


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
            return await attempt(max(deadline - loop.time(), 0.5))
        except (NetError, OSError, TimeoutError) as exc:
            pause = RETRY_DELAYS_S[min(n, len(RETRY_DELAYS_S) - 1)]
            if (stop_when_unreachable and isinstance(exc, PeerUnreachable)) or (
                loop.time() + pause >= deadline
            ):
                raise
            log.info("%s: %s; dialling again", what, exc)
        n += 1
        await asyncio.sleep(pause)
