"""bench/stage_compute.py's stage processes start with the workers' OpenMP settings."""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import Connection

import pytest

from app.serving.machine.openmp import STAGE_OMP_SETTINGS
from bench.stage_compute import start_with_stage_omp_settings

pytestmark = pytest.mark.unit


def _report_environment(conn: Connection) -> None:
    conn.send({name: os.environ.get(name) for name in STAGE_OMP_SETTINGS})


def _child_environment() -> dict[str, str | None]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_report_environment, args=(child,))
    start_with_stage_omp_settings(proc)
    try:
        seen: dict[str, str | None] = parent.recv()
    finally:
        proc.join(30)
    return seen


def test_child_starts_with_the_settings_and_this_process_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in STAGE_OMP_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert _child_environment() == STAGE_OMP_SETTINGS
    assert all(name not in os.environ for name in STAGE_OMP_SETTINGS)


def test_a_value_already_set_wins_in_the_child_and_stays_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    seen = _child_environment()
    assert seen["GOMP_SPINCOUNT"] == "5"
    assert os.environ["GOMP_SPINCOUNT"] == "5"
