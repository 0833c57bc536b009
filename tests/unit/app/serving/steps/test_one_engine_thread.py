"""A stage is built, calibrated and stepped on one thread (app/serving/serve.py,
standby_stage.py): libgomp keeps a pool of OpenMP threads per thread that starts a
parallel region, and more pooled threads than CPUs cut its spin at every barrier, which
halved a 2-thread model's speed on a 2-core machine (docs/decisions/one-engine-thread.md).
The stage is a stand-in that records the thread of every call made on it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from app.config import WorkerConfig
from app.serving import serve
from app.serving import standby as standby_stage
from app.serving.machine import threads as thread_calibration
from core.types import LayerRange, StageSpec


class _Stage:
    def __init__(self, spec: StageSpec) -> None:
        self.spec = spec
        self.threads: dict[str, set[int]] = {}
        self.record("build")

    def record(self, what: str) -> None:
        self.threads.setdefault(what, set()).add(threading.get_ident())

    def shutdown(self) -> None:
        self.record("shutdown")


def _config(**kw: Any) -> WorkerConfig:
    return WorkerConfig(
        node_id="n",
        listen=("127.0.0.1", 1),
        model="m",
        layers=LayerRange(0, 4),
        credentials=Path("c"),
        **kw,
    )


@pytest.fixture
def fake_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    from core import stage as core_stage

    monkeypatch.setattr(serve, "prepare_stage_file", lambda config: (Path("stage.gguf"), 8))
    monkeypatch.setattr(core_stage.Stage, "from_file", staticmethod(lambda p, spec: _Stage(spec)))

    def calibrated_threads(
        stage: _Stage, cpus: int | None = None
    ) -> tuple[int, list[tuple[int, float]]]:
        assert cpus is None  # no cpus chosen: the machine's usable CPUs are the candidates
        stage.record("threads")
        return 2, [(1, 2.0), (2, 1.0)]

    monkeypatch.setattr(thread_calibration, "calibrated_threads", calibrated_threads)


@pytest.mark.usefixtures("fake_stage")
def test_building_and_timing_threads_run_on_the_thread_the_steps_will_use() -> None:
    async def run() -> None:
        loaded = await serve.load_stage(_config(threads=0))  # auto: calibrated
        assert loaded.calls is not None
        stage = loaded.stage
        assert isinstance(stage, _Stage)
        await loaded.calls.run(stage.record, "step")
        one = stage.threads["build"]
        assert len(one) == 1 and stage.threads["threads"] == one == stage.threads["step"]
        assert one != {threading.get_ident()}  # not the event loop's thread
        standby_stage.free(loaded)
        assert stage.threads["shutdown"] == one

    asyncio.run(run())


@pytest.mark.usefixtures("fake_stage")
def test_a_spare_calibrates_its_row_budget_on_the_stage_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.serving.machine import row_budget as calibration

    def calibrated_row_budget(stage: _Stage) -> tuple[int, list[tuple[int, float]]]:
        stage.record("budget")
        return 16, [(1, 1.0)]

    monkeypatch.setattr(calibration, "calibrated_row_budget", calibrated_row_budget)
    monkeypatch.setattr(standby_stage, "check_within_cap", lambda *a: None)
    monkeypatch.setattr(standby_stage, "stage_compute", lambda stage: None)
    monkeypatch.setattr(standby_stage, "admission_policy", lambda path, spec: None)

    async def run() -> None:
        loaded = await standby_stage.preload(_config(threads=2, calibrate_budget=True))
        assert loaded is not None and loaded.calibration == (16, [(1, 1.0)])
        stage = loaded.stage
        assert isinstance(stage, _Stage)
        assert stage.threads["budget"] == stage.threads["build"]
        standby_stage.free(loaded)

    asyncio.run(run())


def test_workers_make_the_throttled_spin_as_long_as_the_other() -> None:
    # Importing app.serving.serve sets both, before llama.cpp loads libgomp; without the
    # active policy libgomp's throttled spin would be 100 turns. An environment that
    # sets them wins.
    import os
    import subprocess
    import sys

    code = (
        "import os, app.serving.serve;"
        "print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    root = str(Path(__file__).resolve().parents[5])
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["active", "1000"]
    env["OMP_WAIT_POLICY"] = "passive"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["passive", "1000"]
