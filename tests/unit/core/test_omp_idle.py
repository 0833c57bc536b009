"""core.omp_idle: when parking OpenMP's idle threads applies, and that it changes nothing
a stage computes (Gemma-sized work is not needed: the tiny model, ~1 s)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from core.omp_idle import OmpIdle, park_threads
from core.stage import Stage, StepRequest, StepResult
from core.types import LayerRange, StageSpec

pytestmark = pytest.mark.unit


def test_park_threads_is_one_more_than_the_cpus_and_only_where_it_pays() -> None:
    assert park_threads(1, 2) is None  # one thread: OpenMP keeps no idle threads
    assert park_threads(2, 2) == 3
    assert park_threads(2, 3) == 4
    assert park_threads(4, 4) == 5
    assert park_threads(2, 16) is None  # 15 threads made per token for cores left free
    assert park_threads(8, 8, max_extra=1) == 9
    with pytest.raises(ValueError):
        park_threads(0, 2)


def _steps(stage: Stage, idle: OmpIdle | None, n: int) -> list[np.ndarray]:
    stage.open("s")
    out = []
    for i in range(n):
        (res,) = stage.step([StepRequest("s", i, tokens=np.array([3 + i], dtype=np.int32))])
        assert isinstance(res, StepResult) and res.hidden is not None
        out.append(res.hidden.copy())
        if idle is not None:
            idle.park()
    stage.close("s")
    return out


@pytest.mark.skipif(
    sys.platform != "linux", reason="parking needs libgomp (Linux) and /proc to count threads"
)
def test_parking_between_steps_leaves_every_bit_and_no_thread_behind(tiny_llama: Path) -> None:
    spec = StageSpec(LayerRange(0, 1), 2, n_ctx=64, n_batch=16, n_seq_max=1, n_threads=2)
    stage = Stage.from_file(tiny_llama, spec)
    try:
        plain = _steps(stage, None, 6)  # loads ggml's CPU module, and libgomp with it
        idle = OmpIdle.load(2, 2)
        assert idle is not None, "libgomp is in this process once ggml's CPU module is"
        threads_before = len(os.listdir("/proc/self/task"))
        parked = _steps(stage, idle, 6)
        assert idle.parks == 6
        assert all(np.array_equal(a, b) for a, b in zip(plain, parked, strict=True))
        # The park's extra thread is released by the next graph: no thread piles up.
        assert len(os.listdir("/proc/self/task")) <= threads_before + 1
    finally:
        stage.shutdown()
