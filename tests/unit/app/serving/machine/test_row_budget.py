"""app.serving.machine.row_budget: the start-up measurement behind the row budget (fake engine)."""

from __future__ import annotations

import pytest

from app.serving.machine.row_budget import SCRATCH, calibrated_row_budget, measure_steps
from core.stage import Stage
from core.types import LayerRange, StageSpec
from tests.support.fakes import FakeEngine

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("first", [True, False])
def test_calibration_times_each_size_the_batch_holds_and_leaves_the_stage_empty(
    first: bool,
) -> None:
    layers = LayerRange(0, 2) if first else LayerRange(2, 4)
    engine = FakeEngine(capture_hidden=True)
    stage = Stage(engine, StageSpec(layers, 6, n_ctx=512, n_batch=64, n_seq_max=4))
    samples = measure_steps(stage)
    assert [n for n, _ in samples] == [1, 2, 4, 8, 16, 32, 64]
    assert all(ms > 0 for _, ms in samples)
    assert stage.sessions == [] and SCRATCH not in stage.sessions, "the scratch session is gone"
    budget, _ = calibrated_row_budget(stage)
    assert 1 <= budget <= 64
    stage.open("real")  # every slot is free again for real sessions
    assert stage.n_past("real") == 0


def test_the_calibration_stays_within_one_session_stream() -> None:
    spec = StageSpec(LayerRange(0, 2), 6, n_ctx=64, n_batch=256, n_seq_max=4)
    samples = measure_steps(Stage(FakeEngine(), spec))
    assert max(n for n, _ in samples) == 16  # 64 positions / 4 streams
