"""Cheap checks of the hidden-state rows a stage receives, on every step: no IO.

A stage past the first feeds its upstream's rows into its own layers. Rows that no model
computes are refused before they reach the engine, so the session's KV never holds
them: a value that is NaN or infinite, a row that is all zeros (a residual stream is the
token's embedding plus every layer's additions, never exactly zero), and a row whose L2
norm is past a ceiling no language model's residual comes near. These hold for every
model, so they need nothing measured and never refuse an honest step.

What they cannot catch: rows that are wrong but look like a model's (small noise, a
plausible row of another session). Those are for spot checks of answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import numpy.typing as npt

NORM_CEILING = 1.0e10
"""The largest row L2 norm taken. Residual norms grow with depth and differ by model
(measured on a 400-token text: SmolLM2 135M reaches 2.3e4, Gemma 3 270M 1.0e5 at its
last boundaries), so the ceiling leaves five orders of magnitude above those; a
flipped high exponent bit makes a value 2^128 (3.4e38) times larger, far past it."""


class RowCheck(Enum):
    """The check that refused a step's rows; the value travels in the ERROR
    (app.session.rows_refusal)."""

    NOT_FINITE = "not-finite"
    ZERO_ROW = "zero-row"
    NORM_CEILING = "norm-ceiling"


@dataclass(frozen=True)
class RowsRefused:
    """Why a step's rows were refused: the check, the first row that failed it, and a
    sentence for people."""

    check: RowCheck
    row: int
    detail: str


def check_rows(rows: npt.NDArray[np.float32], ceiling: float = NORM_CEILING) -> RowsRefused | None:
    """The first check `rows` (n, width) fail, None when they pass every one."""
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        return RowsRefused(RowCheck.NOT_FINITE, row, f"row {row} holds NaN or infinity")
    # Squares summed in float64: a finite f32 row's sum cannot overflow there.
    squares = np.einsum("ij,ij->i", rows, rows, dtype=np.float64)
    zero = squares == 0.0
    if zero.any():
        row = int(np.argmax(zero))
        return RowsRefused(RowCheck.ZERO_ROW, row, f"row {row} is all zeros")
    over = squares > ceiling * ceiling
    if over.any():
        row = int(np.argmax(over))
        norm = float(np.sqrt(squares[row]))
        return RowsRefused(
            RowCheck.NORM_CEILING, row, f"row {row} has norm {norm:.3g} > {ceiling:.3g}"
        )
    return None
