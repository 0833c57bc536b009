"""A one-line progress bar on stderr for long commands (`sangama slice`): bytes done,
speed and time left. `format_progress` is pure; `ProgressBar` redraws it in place, at
most a few times a second."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def _size(n: float, unit: tuple[float, str]) -> str:
    return f"{n / unit[0]:.2f}"


def _unit(n: float) -> tuple[float, str]:
    return next((u for u in _UNITS if n >= u[0]), (1.0, "B"))


def _duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_progress(done: int, total: int, elapsed_s: float, width: int = 24) -> str:
    """e.g. `[##########--------------]  42%  2.52/6.00 GB  210 MB/s  0:17 left`."""
    total = max(total, 0)
    done = min(max(done, 0), total) if total else max(done, 0)
    frac = done / total if total else 1.0
    filled = int(frac * width)
    unit = _unit(float(total or done))
    text = (
        f"[{'#' * filled}{'-' * (width - filled)}] {frac * 100:3.0f}%  "
        f"{_size(done, unit)}/{_size(total, unit)} {unit[1]}"
    )
    if elapsed_s <= 0 or done <= 0:
        return text
    rate = done / elapsed_s
    rate_unit = _unit(rate)
    text += f"  {rate / rate_unit[0]:.0f} {rate_unit[1]}/s"
    if done < total:
        text += f"  {_duration((total - done) / rate)} left"
    else:
        text += f"  {_duration(elapsed_s)}"
    return text


class ProgressBar:
    """Callable as (done, total); draws `format_progress` over itself with '\\r'."""

    def __init__(
        self,
        stream: TextIO,
        min_interval_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._min_interval = min_interval_s
        self._clock = clock
        self._start = clock()
        self._last_draw: float | None = None
        self._width = 0

    def __call__(self, done: int, total: int) -> None:
        now = self._clock()
        finished = done >= total
        if (
            not finished
            and self._last_draw is not None
            and now - self._last_draw < self._min_interval
        ):
            return
        self._last_draw = now
        line = format_progress(done, total, now - self._start)
        # Pad over a longer previous line instead of clearing it (no terminal codes).
        self._stream.write("\r" + line.ljust(self._width))
        self._width = len(line)
        self._stream.flush()

    def close(self) -> None:
        """End the bar's line, if one was drawn."""
        if self._last_draw is not None:
            self._stream.write("\n")
            self._stream.flush()
            self._last_draw = None
