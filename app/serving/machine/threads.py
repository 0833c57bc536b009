"""Measure a stage's one-row step at 1..n threads at start, to choose its thread count.

A worker whose `threads` is 0 ("auto") runs this once after loading its stage and
before the row-budget calibration (which then times steps at the chosen count). Each
count is timed on a scratch session: a warm-up step, then the best of a few, the cache
rolled back after each. `core.scheduling.choose_threads` turns the timings into the
count; the clock lives here, the decision there. Threads never change results
(tests/unit/core/test_engine_threads.py), so the choice is free to follow the clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from app.serving.machine.row_budget import SCRATCH, best_step_ms, scratch_rows
from core.scheduling import choose_threads, thread_candidates
from core.stage import Stage


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return max(1, len(affinity(0)))
    return max(1, os.cpu_count() or 1)


def measure_threads(
    stage: Stage,
    candidates: list[int],
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> list[tuple[int, float]]:
    """(threads, best one-row step ms) for each candidate count, on a scratch session."""
    req = scratch_rows(stage, 1)
    samples: list[tuple[int, float]] = []
    set_threads = _thread_setter(stage)
    if set_threads is None:
        return samples  # an engine without a thread count: nothing to choose
    stage.open(SCRATCH)
    try:
        for n in candidates:
            set_threads(n)
            best = best_step_ms(stage, req, repeats, clock)
            if best is None:
                return samples
            samples.append((n, best))
    finally:
        stage.close(SCRATCH)
    return samples


def calibrated_threads(
    stage: Stage, cpus: int | None = None, clock: Callable[[], float] = time.perf_counter
) -> tuple[int, list[tuple[int, float]]]:
    """Time the candidates, keep the chosen count on the stage's engine; return both."""
    samples = measure_threads(stage, thread_candidates(cpus or usable_cpus()), clock=clock)
    chosen = choose_threads(samples)
    set_threads = _thread_setter(stage)
    if set_threads is not None:
        set_threads(chosen)
    return chosen, samples


def _thread_setter(stage: Stage) -> Callable[[int], None] | None:
    """The engine's `set_threads` (LlamaStageEngine has one; core.stage.Engine does not
    require it, so fakes and other engines may lack it)."""
    setter: Callable[[int], None] | None = getattr(stage.engine, "set_threads", None)
    return setter
