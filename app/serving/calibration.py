"""Measure a stage's step time at a few batch sizes, to derive its row budget.

Runs once when a worker starts, before it serves: a scratch session evaluates 1, 2, 4,
... rows (zeros as hidden states, token 0 on a first stage), each size timed after a
warm-up, the cache rolled back after each, the session closed at the end.
`core.scheduling.choose_row_budget` turns the timings into the budget. The clock lives
here, the decision there.
"""

from __future__ import annotations

import time

import numpy as np

from core.scheduling import CALIBRATION_SIZES, choose_row_budget
from core.stage import Stage, StepFailure, StepRequest

SCRATCH = "\x00calibration"
"""Not a valid wire session id (ids are printable), so it never meets a real one."""


def measure_steps(stage: Stage, repeats: int = 2) -> list[tuple[int, float]]:
    """(rows, best step ms) for each calibration size the stage's batch and cache hold."""
    spec = stage.spec
    sizes = [n for n in CALIBRATION_SIZES if n <= min(spec.n_batch, spec.session_ctx)]
    samples: list[tuple[int, float]] = []
    stage.open(SCRATCH)
    try:
        for n in sizes:
            if spec.is_first:
                req = StepRequest(SCRATCH, 0, tokens=np.zeros(n, dtype=np.int32))
            else:
                req = StepRequest(
                    SCRATCH, 0, hidden=np.zeros((n, stage.engine.n_embd), dtype=np.float32)
                )
            best = float("inf")
            for _ in range(repeats + 1):  # the first run warms the kernels for this shape
                started = time.perf_counter()
                (result,) = stage.step([req])
                elapsed = (time.perf_counter() - started) * 1e3
                stage.rollback(SCRATCH, 0)
                if isinstance(result, StepFailure):
                    return samples
                best = min(best, elapsed)
            samples.append((n, best))
    finally:
        stage.close(SCRATCH)
    return samples


def calibrated_row_budget(stage: Stage) -> tuple[int, list[tuple[int, float]]]:
    """The row budget for this stage and the timings it was chosen from."""
    samples = measure_steps(stage)
    return choose_row_budget(samples, stage.spec.n_batch), samples
