"""A logging filter that lets the same warning through at most once per interval.

A worker whose coordinator is down would otherwise say "heartbeat failed" every beat;
the person needs to read it once, then now and then, with how often it happened. The
key is the logger's name and the message's format string (not its arguments), so
"heartbeat failed: %s" is one key whatever the exception says. Records below WARNING
pass untouched: `-v` shows every debug line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_INTERVAL_S = 60.0
MAX_KEYS = 1024
"""Keys remembered at most: a stream of distinct messages cannot grow the filter."""


@dataclass
class _Seen:
    last_shown: float
    suppressed: int = 0


class RepeatFilter(logging.Filter):
    """Each (logger, format string) at WARNING or above: shown, then suppressed for
    `interval_s`; the next one shown after that says how many were suppressed."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._seen: dict[tuple[str, str], _Seen] = {}
        self._lock = threading.Lock()  # handlers run on whichever thread logs

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg))
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen.last_shown < self.interval_s:
                seen.suppressed += 1
                return False
            suppressed = seen.suppressed if seen is not None else 0
            if len(self._seen) >= MAX_KEYS and key not in self._seen:
                self._seen.clear()
            self._seen[key] = _Seen(now)
        if suppressed:
            # Said once, with the count: the record's own message is kept intact.
            record.msg = f"{record.msg} ({suppressed} more like it since it was last shown)"
        return True


def limit_repeats(handler: logging.Handler, interval_s: float = DEFAULT_INTERVAL_S) -> RepeatFilter:
    """Put a RepeatFilter on `handler` (once) and return it."""
    for f in handler.filters:
        if isinstance(f, RepeatFilter):
            return f
    f = RepeatFilter(interval_s)
    handler.addFilter(f)
    return f
