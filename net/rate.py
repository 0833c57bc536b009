"""Bandwidth caps: a token bucket with the clock passed in, and a thread-safe shell.

The volunteer's upload and download caps (bytes per second) are enforced by debiting
each transfer from a bucket that refills at the cap and holds at most `burst` bytes. A
transfer larger than what the bucket holds is never refused: it is debited in full (the
bucket goes negative) and the caller waits until the debt is paid back, so a cap holds
on average over any window longer than burst / rate, whatever the chunk sizes.

`TokenBucket` is sans-IO (no clock, no sleeping, no locks) so its arithmetic is tested
exactly; `Throttle` adds a lock and the real clock for download threads, and
`AsyncThrottle` the event loop's clock for the QUIC send path.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["AsyncThrottle", "RateError", "Throttle", "TokenBucket", "bucket_for", "upload_throttle"]


class RateError(ValueError):
    """A rate or burst that cannot be a bandwidth cap."""


@dataclass
class TokenBucket:
    """Bytes allowed now = tokens; refills at `rate` bytes/s up to `burst`.

    `rate` 0 means no cap: every request passes at once and nothing is tracked."""

    rate: float
    burst: float
    tokens: float = math.nan
    """Starts full (nan = not set yet)."""
    updated: float = math.nan
    """The `now` of the last call."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.rate) or self.rate < 0:
            raise RateError(f"a rate is a finite number of bytes per second >= 0, not {self.rate}")
        if self.rate > 0 and (not math.isfinite(self.burst) or self.burst <= 0):
            raise RateError(f"a capped bucket needs a burst > 0 bytes, not {self.burst}")
        if math.isnan(self.tokens):
            self.tokens = self.burst

    @property
    def unlimited(self) -> bool:
        return self.rate == 0

    def _refill(self, now: float) -> None:
        if not math.isnan(self.updated) and now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        if math.isnan(self.updated) or now > self.updated:
            self.updated = now  # a clock that steps back refills nothing, and takes nothing

    def reserve(self, n_bytes: int, now: float) -> float:
        """Debit `n_bytes` and return how many seconds to wait before sending them."""
        if n_bytes < 0:
            raise RateError(f"cannot send {n_bytes} bytes")
        if self.unlimited:
            return 0.0
        self._refill(now)
        self.tokens -= n_bytes
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def delay(self, now: float) -> float:
        """Seconds until the bucket is out of debt (0 when sending is allowed now)."""
        if self.unlimited:
            return 0.0
        self._refill(now)
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def bucket_for(rate: float, burst_s: float = 0.25, min_burst: int = 64 * 1024) -> TokenBucket:
    """A bucket for a cap of `rate` bytes/s holding `burst_s` seconds of it (at least
    `min_burst`, so one large read or a burst of datagrams is not split needlessly)."""
    return TokenBucket(rate, max(rate * burst_s, float(min_burst)) if rate > 0 else 0.0)


class Throttle:
    """One cap shared by several threads (the parallel piece downloads)."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self._bucket = bucket_for(rate)
        self._lock = threading.Lock()
        self._clock = clock
        self._sleep = sleep
        self.waited_s = 0.0
        """Total time callers were held back (for reports and tests)."""

    @property
    def rate(self) -> float:
        return self._bucket.rate

    def take(self, n_bytes: int) -> None:
        """Account for `n_bytes` just received (or about to be sent) and wait if over."""
        if self._bucket.unlimited:
            return
        with self._lock:
            wait = self._bucket.reserve(n_bytes, self._clock())
            self.waited_s += wait
        if wait > 0:
            self._sleep(wait)


class AsyncThrottle:
    """One cap for a QUIC endpoint's sends, on the event loop's clock."""

    def __init__(self, rate: float, clock: Callable[[], float] | None = None) -> None:
        self._bucket = bucket_for(rate)
        self._clock = clock
        self.deferred = 0
        """Transmissions held back by the cap."""
        self.sent_bytes = 0
        """Bytes charged to the cap (every datagram sent under it)."""

    @property
    def unlimited(self) -> bool:
        return self._bucket.unlimited

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def delay(self) -> float:
        """Seconds to hold the next transmission back (0: send now)."""
        wait = self._bucket.delay(self._now())
        if wait > 0:
            self.deferred += 1
        return wait

    def sent(self, n_bytes: int) -> None:
        self.sent_bytes += n_bytes
        self._bucket.reserve(n_bytes, self._now())


_SHARED: dict[float, AsyncThrottle] = {}


def upload_throttle(rate: float) -> AsyncThrottle | None:
    """The process's one upload cap of `rate` bytes/s (None: no cap). Every link of the
    node, accepted or dialled, direct or relayed, draws from the same bucket: the cap is
    the volunteer's, for the whole PC."""
    if rate <= 0:
        return None
    if rate not in _SHARED:
        _SHARED[rate] = AsyncThrottle(rate)
    return _SHARED[rate]
