"""The step-time profile a worker reports: groups by rows, moving averages, calibration
filling only groups no served step has reached."""

from __future__ import annotations

import pytest

from core.step_profile import MAX_POINTS, StepProfile


def test_served_steps_group_by_powers_of_two_and_average() -> None:
    p = StepProfile(weight=0.5)
    p.observe(1, 10.0)
    p.observe(1, 20.0)  # 10 + 0.5 x (20 - 10)
    p.observe(5, 40.0)
    p.observe(7, 60.0)  # rows 5 + 0.5 x 2 = 6, ms 40 + 0.5 x 20 = 50
    assert p.points() == ((1, 15.0), (6, 50.0))


def test_calibration_fills_only_groups_not_yet_served() -> None:
    p = StepProfile()
    p.observe(2, 9.0)
    p.seed([(1, 4.0), (2, 5.0), (16, 30.0)])
    assert p.points() == ((1, 4.0), (2, 9.0), (16, 30.0))
    p.observe(16, 50.0)  # the first served step replaces the calibration's figure
    assert dict(p.points())[16] == 50.0


def test_rows_stay_strictly_increasing_and_bounded() -> None:
    p = StepProfile()
    for n in (1, 3, 3, 2, 1 << 20, 70_000, 255, 256):
        p.observe(n, float(n))
    rows = [r for r, _ in p.points()]
    assert rows == sorted(set(rows)) and len(rows) <= MAX_POINTS
    assert rows[-1] < 1 << MAX_POINTS


@pytest.mark.parametrize("rows, ms", [(0, 1.0), (-3, 1.0), (4, float("nan")), (4, -1.0)])
def test_unusable_figures_are_ignored(rows: int, ms: float) -> None:
    p = StepProfile()
    p.observe(rows, ms)
    p.seed([(rows, ms)])
    assert p.points() == ()
