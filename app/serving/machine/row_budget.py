"""Measure a stage's step time at a few batch sizes, to derive its row budget.

Runs once when a worker starts, before it serves: a scratch session evaluates 1, 2, 4,
... rows (zeros as hidden states, token 0 on a first stage), each size timed after a
warm-up, the cache rolled back after each, the session closed at the end.
`core.scheduling.choose_row_budget` turns the timings into the budget. The clock lives
here, the decision there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from core.scheduling import CALIBRATION_SIZES, choose_row_budget
from core.stage import Stage, StepFailure, StepRequest

SCRATCH = "\x00calibration"
"""Not a valid wire session id (ids are printable), so it never meets a real one."""


def scratch_rows(stage: Stage, n: int) -> StepRequest:
    """`n` rows from position 0 of the scratch session: token 0 on a first stage, zeros
    as hidden states further down."""
    if stage.spec.is_first:
        return StepRequest(SCRATCH, 0, tokens=np.zeros(n, dtype=np.int32))
    return StepRequest(SCRATCH, 0, hidden=np.zeros((n, stage.engine.n_embd), dtype=np.float32))


def best_step_ms(
    stage: Stage,
    req: StepRequest,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float | None:
    """The best of `repeats` + 1 timed steps of `req` (the extra first one wakes the
    threads and warms the kernels for this shape, and is seldom the best), the scratch
    session's cache rolled back after each; None when the stage cannot take the rows."""
    best = float("inf")
    for _ in range(repeats + 1):
        started = clock()
        (result,) = stage.step([req])
        elapsed = (clock() - started) * 1e3
        stage.rollback(SCRATCH, 0)
        if isinstance(result, StepFailure):
            return None
        best = min(best, elapsed)
    return best


def measure_steps(stage: Stage, repeats: int = 2) -> list[tuple[int, float]]:
    """(rows, best step ms) for each calibration size the stage's batch and cache hold."""
    spec = stage.spec
    sizes = [n for n in CALIBRATION_SIZES if n <= min(spec.n_batch, spec.session_ctx)]
    samples: list[tuple[int, float]] = []
    stage.open(SCRATCH)
    try:
        for n in sizes:
            best = best_step_ms(stage, scratch_rows(stage, n), repeats)
            if best is None:
                return samples
            samples.append((n, best))
    finally:
        stage.close(SCRATCH)
    return samples


def calibrated_row_budget(stage: Stage) -> tuple[int, list[tuple[int, float]]]:
    """The row budget for this stage and the timings it was chosen from."""
    samples = measure_steps(stage)
    return choose_row_budget(samples, stage.spec.n_batch), samples
