"""A stage's step time by rows per step, as it serves: what its heartbeat reports, so
that the coordinator can predict the fleet's tokens/s (coordinator/server/prediction.py).

Steps are grouped by rows in powers of two (1, 2-3, 4-7, ...); each group keeps a moving
average of its rows and its step time, so the figures follow what the PC does now (other
programs, other stages sharing its cores) rather than what it did at start. The start-up
calibration's timings (app/serving/machine/row_budget.py) fill the groups no step has reached
yet. No clock here: the worker times its steps and hands the figures in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["MAX_POINTS", "StepProfile"]

MAX_POINTS = 16
"""Groups kept: rows up to 2**16 - 1 (a step never holds more than its n_batch)."""


class StepProfile:
    def __init__(self, weight: float = 0.2) -> None:
        if not 0 < weight <= 1:
            raise ValueError("weight must be in (0, 1]")
        self._weight = weight
        self._groups: dict[int, tuple[float, float]] = {}
        """Group (log2 of rows) -> (mean rows, mean step ms)."""
        self._seen: set[int] = set()
        """Groups a served step reached: calibration no longer overwrites them."""

    @staticmethod
    def _group(rows: int) -> int:
        return min(rows.bit_length() - 1, MAX_POINTS - 1)

    @staticmethod
    def _usable(rows: int, ms: float) -> bool:
        return rows >= 1 and math.isfinite(ms) and ms >= 0

    def seed(self, samples: Iterable[tuple[int, float]]) -> None:
        """Timings measured at start, for groups no served step has reached."""
        for rows, ms in samples:
            g = self._group(rows) if rows >= 1 else -1
            if self._usable(rows, ms) and g not in self._seen:
                self._groups[g] = (float(rows), float(ms))

    def observe(self, rows: int, ms: float) -> None:
        """One served step of `rows` rows that took `ms`."""
        if not self._usable(rows, ms):
            return
        g = self._group(rows)
        old = self._groups.get(g)
        if old is None or g not in self._seen:
            self._groups[g] = (float(rows), float(ms))
        else:
            w = self._weight
            self._groups[g] = (old[0] + w * (rows - old[0]), old[1] + w * (ms - old[1]))
        self._seen.add(g)

    def points(self) -> tuple[tuple[int, float], ...]:
        """(rows, step ms) by increasing rows: a group's mean rows lie within the group,
        so rounded they still increase strictly."""
        out: list[tuple[int, float]] = []
        for g in sorted(self._groups):
            rows, ms = self._groups[g]
            r = max(1 << g, min(round(rows), (1 << (g + 1)) - 1))
            out.append((r, round(ms, 3)))
        return tuple(out)
