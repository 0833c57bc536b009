"""app.serving.machine.threads: the start-up measurement behind `threads = auto`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.serving.machine.row_budget import SCRATCH
from app.serving.machine.threads import calibrated_threads, measure_threads, usable_cpus
from core.stage import Stage, StepRequest, StepResult
from core.types import LayerRange, StageSpec
from tests.support.fakes import FakeEngine

pytestmark = pytest.mark.unit


class ThreadedEngine(FakeEngine):
    """A fake whose every decode advances a fake clock by the step time of its thread
    count (the shell's clock is injected, so the test reads no real time)."""

    def __init__(self, step_ms: dict[int, float], **kw: Any) -> None:
        super().__init__(**kw)
        self.step_ms = step_ms
        self.threads = 1
        self.history: list[int] = []
        self.now = 0.0

    def set_threads(self, n: int) -> None:
        self.threads = n
        self.history.append(n)

    def decode(self, *args: Any, **kw: Any) -> Any:
        self.now += self.step_ms[self.threads] / 1e3
        return super().decode(*args, **kw)


@pytest.mark.parametrize("first", [True, False])
def test_every_candidate_is_timed_on_a_scratch_session_that_is_gone_after(first: bool) -> None:
    layers = LayerRange(0, 2) if first else LayerRange(2, 4)
    engine = ThreadedEngine({1: 40.0, 2: 21.0, 3: 30.0}, capture_hidden=True)
    stage = Stage(engine, StageSpec(layers, 6, n_ctx=64, n_batch=16, n_seq_max=2))
    samples = measure_threads(stage, [1, 2, 3], repeats=2, clock=lambda: engine.now)
    assert [(n, round(ms, 6)) for n, ms in samples] == [(1, 40.0), (2, 21.0), (3, 30.0)]
    assert engine.decoded_rows == [1] * 9, "one-row steps: a warm-up and 2 timed per count"
    assert stage.sessions == [] and SCRATCH not in stage.sessions
    stage.open("a")  # both slots free again, and the cache of the scratch session cut
    stage.open("b")


def test_the_fastest_count_within_the_share_is_kept_on_the_engine() -> None:
    engine = ThreadedEngine({1: 40.0, 2: 21.0, 3: 20.0, 4: 60.0})
    stage = Stage(engine, StageSpec(LayerRange(2, 4), 6, n_ctx=64, n_batch=16, n_seq_max=1))
    chosen, samples = calibrated_threads(stage, cpus=4, clock=lambda: engine.now)
    assert [n for n, _ in samples] == [1, 2, 3, 4]
    assert chosen == 2  # 20/21 = 0.95: the third thread is not worth a core
    assert engine.history[-1] == 2, "the engine is left at the chosen count"


def test_one_cpu_means_one_thread_without_choice() -> None:
    engine = ThreadedEngine({1: 5.0})
    stage = Stage(engine, StageSpec(LayerRange(0, 2), 6, n_ctx=64, n_batch=16, n_seq_max=1))
    assert calibrated_threads(stage, cpus=1, clock=lambda: engine.now)[0] == 1
    assert usable_cpus() >= 1


def test_a_real_stage_chooses_a_count_and_still_computes_the_same(tiny_llama: Path) -> None:
    """The tiny model's first stage: auto leaves its answers as they were (~1 s)."""
    spec = StageSpec(LayerRange(0, 1), 2, n_ctx=64, n_batch=16, n_seq_max=2, n_threads=1)
    stage = Stage.from_file(tiny_llama, spec)
    try:
        req = StepRequest("s", 0, tokens=np.array([1, 5, 17], dtype=np.int32))
        stage.open("s")
        (before,) = stage.step([req])
        stage.close("s")
        chosen, samples = calibrated_threads(stage, cpus=2)
        assert chosen in (1, 2) and [n for n, _ in samples] == [1, 2]
        stage.open("s")
        (after,) = stage.step([req])
        assert isinstance(before, StepResult) and isinstance(after, StepResult)
        assert before.hidden is not None and after.hidden is not None
        assert np.array_equal(before.hidden, after.hidden), "threads moved the hidden state"
    finally:
        stage.shutdown()
