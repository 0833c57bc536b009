"""Failed attempts per caller, for the operator login and invite redemption: pure, the
clock passed in.

A caller (its address) that fails `max_failures` times within `window_s` is refused
until the oldest of those failures leaves the window; a success clears its record.
An attempt is counted as a failure when it is admitted (`admit`), before it is
answered, and cleared only if it succeeds: checking first and counting after the
answer let 35 concurrent wrong passwords through a limit of 5, since none of them had
failed yet when the others were checked. An
invite secret has 128 bits and the operator's password is scrypt-hashed, so guessing is
hopeless anyway; the limit keeps a guesser from also costing the coordinator a scrypt
per try, and makes the attempt visible (HTTP 429) instead of silent.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MAX_CALLERS = 10_000
"""Callers remembered at most: a flood from many addresses cannot grow memory without end
(the oldest records are dropped first)."""


@dataclass
class AttemptLimiter:
    max_failures: int = 5
    window_s: float = 60.0
    _failures: dict[str, deque[float]] = field(default_factory=dict)

    def retry_after(self, caller: str, now: float) -> float:
        """0 when `caller` may try now, else the seconds until it may."""
        times = self._failures.get(caller)
        if times is None:
            return 0.0
        while times and now - times[0] >= self.window_s:
            times.popleft()
        if not times:
            del self._failures[caller]
            return 0.0
        if len(times) < self.max_failures:
            return 0.0
        return self.window_s - (now - times[0])

    def admit(self, caller: str, now: float) -> float:
        """0 when `caller` may try now, the attempt already counted as failed (a
        success clears it: `succeeded`); else the seconds until it may, nothing counted.
        Check and count are one step: call it under the lock that guards the limiter."""
        wait = self.retry_after(caller, now)
        if wait <= 0:
            self.failed(caller, now)
        return wait

    def failed(self, caller: str, now: float) -> None:
        if caller not in self._failures and len(self._failures) >= MAX_CALLERS:
            del self._failures[next(iter(self._failures))]
        self._failures.setdefault(caller, deque(maxlen=self.max_failures)).append(now)

    def succeeded(self, caller: str) -> None:
        self._failures.pop(caller, None)
