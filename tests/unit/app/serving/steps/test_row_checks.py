"""app.serving.steps.row_checks: the per-step checks of a stage's inbound rows."""

from __future__ import annotations

import numpy as np
import pytest

from app.serving.steps.row_checks import NORM_CEILING, RowCheck, check_rows

pytestmark = pytest.mark.unit


def _rows(n: int = 4, width: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 1.0, (n, width)).astype(np.float32)


def test_rows_like_a_models_pass() -> None:
    rows = _rows()
    assert check_rows(rows) is None
    # Outlier dimensions as large as real residuals have (thousands) pass too, and
    # rows with norms past Gemma 3 270M's deepest (1e5).
    rows[2, 7] = 8000.0
    rows[3, :] *= 2e4
    assert check_rows(rows) is None
    assert check_rows(np.zeros((0, 64), dtype=np.float32)) is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_value_that_is_not_finite_names_its_row(bad: float) -> None:
    rows = _rows()
    rows[2, 5] = bad
    refused = check_rows(rows)
    assert refused is not None
    assert (refused.check, refused.row) == (RowCheck.NOT_FINITE, 2)


def test_an_all_zero_row_is_refused_but_a_row_with_zeros_is_not() -> None:
    rows = _rows()
    rows[1, :10] = 0.0
    assert check_rows(rows) is None
    rows[3] = 0.0
    refused = check_rows(rows)
    assert refused is not None and (refused.check, refused.row) == (RowCheck.ZERO_ROW, 3)


def test_a_flipped_high_exponent_bit_passes_the_ceiling() -> None:
    rows = _rows()
    bits = rows.view(np.uint32)
    bits[0, 9] ^= np.uint32(1 << 30)  # |x| < 2 times 2^128: huge or infinite
    refused = check_rows(rows)
    assert refused is not None and refused.row == 0
    assert refused.check in (RowCheck.NOT_FINITE, RowCheck.NORM_CEILING)


def test_the_ceiling_is_on_the_rows_l2_norm_without_overflow() -> None:
    rows = np.full((2, 4), NORM_CEILING / 2 * 0.999, dtype=np.float32)  # norm just under
    assert check_rows(rows) is None
    rows[1] *= 1.01
    refused = check_rows(rows)
    assert refused is not None and (refused.check, refused.row) == (RowCheck.NORM_CEILING, 1)
    # Squares past float32's range are summed without overflowing.
    rows = np.full((1, 4), 1e30, dtype=np.float32)
    refused = check_rows(rows)
    assert refused is not None and refused.check is RowCheck.NORM_CEILING
    assert "1e+30" in refused.detail or "2e+30" in refused.detail
