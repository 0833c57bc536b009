"""app.serving.machine.cpus: the shell that moves a stage's compute threads, with the
process's threads given (logic), then on this process's real threads and a real
2-thread llama.cpp stage (Linux)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from app.errors import ConfigError
from app.serving.machine.cpus import ComputePinning, compute_pinning
from app.serving.steps.engine_calls import EngineCalls
from core.stage import Stage, StepRequest, StepResult
from core.types import LayerRange, StageSpec

pytestmark = pytest.mark.unit


class _Threads:
    def __init__(self, process: set[int], python: set[int]) -> None:
        self.process, self.python = process, python
        self.moves: list[tuple[int, int]] = []
        self.gone: set[int] = set()

    def set_affinity(self, tid: int, cpus: set[int]) -> None:
        if tid in self.gone:
            raise ProcessLookupError(tid)
        (cpu,) = cpus
        self.moves.append((tid, cpu))

    def pinning(self, cpus: tuple[int, ...]) -> ComputePinning:
        return ComputePinning(
            cpus,
            threads_of_process=lambda: set(self.process),
            threads_of_python=lambda: set(self.python),
            set_affinity=self.set_affinity,
        )


def test_the_stepping_thread_leads_and_native_threads_are_its_team() -> None:
    me = threading.get_native_id()
    t = _Threads(process={me, 2, 50, 51}, python={me, 2})  # 2: the event loop, not stepping
    pin = t.pinning((0, 1, 2))
    pin.after_step()
    assert sorted(t.moves) == sorted([(me, 0), (50, 1), (51, 2)])
    pin.after_step()  # the team stands: nothing moves again
    assert pin.moves == 3 and len(t.moves) == 3


def test_a_new_team_member_is_placed_and_a_vanished_one_is_let_go() -> None:
    me = threading.get_native_id()
    t = _Threads(process={me, 50}, python={me})
    pin = t.pinning((0, 1))
    pin.after_step()
    t.process |= {60, 61}
    t.gone = {61}  # ended between the listing and the move: skipped, not fatal
    pin.after_step()
    assert (60, 1) in t.moves and all(tid != 61 for tid, _ in t.moves)
    t.process -= {50, 61}
    pin.after_step()
    assert pin.moves == 3  # me, 50, 60


def test_chosen_cpus_outside_the_process_are_refused_before_anything_runs() -> None:
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no affinity on this platform: compute_pinning refuses any cpus")
    assert compute_pinning(()) is None
    outside = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(ConfigError, match=str(outside)):
        compute_pinning((outside,))


@pytest.mark.skipif(sys.platform != "linux", reason="thread affinity is read from /proc")
def test_a_real_two_thread_stage_keeps_its_team_on_two_cpus(tiny_llama: Path) -> None:
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        pytest.skip("needs two usable CPUs to place a 2-thread team on")
    cpus = (usable[1], usable[0])  # not in order: the first named CPU is the leader's
    hook = compute_pinning(cpus)
    assert hook is not None
    calls = EngineCalls(hook)
    spec = StageSpec(LayerRange(0, 1), 2, n_ctx=64, n_batch=16, n_seq_max=1, n_threads=2)
    before = set(os.listdir("/proc/self/task"))
    stage = calls.submit(Stage.from_file, tiny_llama, spec).result()
    try:
        stage.open("s")

        def step(pos: int) -> tuple[int, np.ndarray]:
            (res,) = stage.step([StepRequest("s", pos, tokens=np.array([3], dtype=np.int32))])
            assert isinstance(res, StepResult) and res.hidden is not None
            return threading.get_native_id(), res.hidden.copy()

        leader, _ = calls.submit(step, 0).result()
        calls.submit(step, 1).result()
        assert os.sched_getaffinity(leader) == {cpus[0]}
        python = {t.native_id for t in threading.enumerate()}
        team = set(os.listdir("/proc/self/task")) - before - {str(n) for n in python}
        assert team, "a 2-thread graph starts an OpenMP helper thread"
        assert {cpus[1]} in [os.sched_getaffinity(int(tid)) for tid in team]
        assert all(os.sched_getaffinity(int(t)) != {cpus[0]} for t in team if int(t) != leader)
    finally:
        calls.submit(stage.shutdown).result()
        calls.shutdown()
