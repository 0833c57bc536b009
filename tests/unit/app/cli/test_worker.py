"""`sangama worker` refuses bad coordinated-mode options in one line, before any work."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from app.cli.main import main

pytestmark = pytest.mark.unit

FIRST_CPU = str(min(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "0"
"""A CPU this process may run on (--cpus is checked against the process's affinity)."""


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The options `sangama worker` hands the coordinated worker, which is not started."""
    import app.serving.guest.loop as guest

    options: list[Any] = []

    def run_guest(given: Any, _settings: Any) -> int:
        options.append(given)
        return 0

    monkeypatch.setattr(guest, "run_guest", run_guest)
    return options


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--coordinator", "http://swarm.example.org:8443"], "must start with https://"),
        (["--coordinator", "https://swarm.example.org:99999"], "is not valid"),
        (["--drain", "-1"], "--drain must be 0..3600 seconds"),
        (["--drain", "nan"], "--drain must be 0..3600 seconds"),
        (["--quiet-hours", "after dinner"], "quiet hours look like 22:00-07:00"),
        (["--quiet-hours", "22:00-25:00"], "is not a time of day"),
        (["--max-upload=-5M"], "a bandwidth cap is 0 (none) or a positive number"),
        (["--max-download", "fast"], "must look like 12G or 512M"),
        (["--pieces-cap=-5G"], "--pieces-cap must be 0 (the default) or a size like 50G"),
        (["--pieces-cap", "plenty"], "must look like 12G or 512M"),
    ],
)
def test_worker_refuses_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    assert main(["worker", "--identity", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sangama worker: error:") and says in err, err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("flag", [True, False])
def test_reproducible_reaches_the_coordinated_worker(
    tmp_path: Path, seen: list[Any], flag: bool
) -> None:
    extra = ["--reproducible"] if flag else []
    assert main(["worker", "--identity", str(tmp_path), *extra]) == 0
    assert [o.reproducible for o in seen] == [flag]


@pytest.mark.parametrize(
    ("given", "threads"), [([], 1), (["--threads", "auto"], 0), (["--threads", "3"], 3)]
)
def test_threads_reach_the_coordinated_worker(
    tmp_path: Path, seen: list[Any], given: list[str], threads: int
) -> None:
    """0 is `auto`: the worker times its step at 1..n threads (app/serving/thread_calibration)."""
    assert main(["worker", "--identity", str(tmp_path), *given]) == 0
    assert [o.threads for o in seen] == [threads]


@pytest.mark.parametrize("bad", ["0", "-2", "lots"])
def test_a_bad_thread_count_is_refused_by_the_parser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["worker", "--identity", str(tmp_path), "--threads", bad])
    assert exit_.value.code == 2
    assert "threads must be auto or >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(("given", "budget"), [([], 0), (["--row-budget", "32"], 32)])
def test_a_row_budget_reaches_the_stage_and_skips_its_timing(
    tmp_path: Path, seen: list[Any], given: list[str], budget: int
) -> None:
    from app.config import WorkerConfig
    from app.serving.coordinated import stage_config
    from coordinator.contract import Assignment

    assert main(["worker", "--identity", str(tmp_path), *given]) == 0
    (options,) = seen
    assert options.row_budget == budget
    identity = type("Identity", (), {"node_id": "n1", "directory": tmp_path})()
    assignment = Assignment("m", (0, 6), None, "/manifest", "/pieces")
    config = stage_config(options, identity, 7000, assignment, tmp_path)
    # Set: used as it is; not set: the default ceiling, measured at start.
    assert config.row_budget == (budget or WorkerConfig.row_budget)
    assert config.calibrate_budget is (budget == 0)


@pytest.mark.parametrize("bad", ["0", "-1", "257", "many"])
def test_a_bad_row_budget_is_refused_by_the_parser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["worker", "--identity", str(tmp_path), "--row-budget", bad])
    assert exit_.value.code == 2
    assert "row budget must be 1..256" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--cpus", "0-4096"], "are not among this process's"),
        (["--cpus", FIRST_CPU, "--threads", "2"], "--threads 2 needs as many CPUs, --cpus has 1"),
    ],
)
def test_unusable_cpus_are_refused_before_joining(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seen: list[Any], extra: list[str], says: str
) -> None:
    assert main(["worker", "--identity", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sangama worker: error:") and says in err, err
    assert seen == []


def test_cpus_reach_the_coordinated_worker(tmp_path: Path, seen: list[Any]) -> None:
    assert main(["worker", "--identity", str(tmp_path), "--cpus", FIRST_CPU]) == 0
    assert [o.cpus for o in seen] == [FIRST_CPU]


@pytest.mark.parametrize(("given", "cap"), [([], 0), (["--pieces-cap", "50G"], 50 << 30)])
def test_the_pieces_cap_reaches_the_coordinated_worker(
    tmp_path: Path, seen: list[Any], given: list[str], cap: int
) -> None:
    """0: the default share of the free disk space (app.pieces_cache.make_room)."""
    assert main(["worker", "--identity", str(tmp_path), *given]) == 0
    assert [o.pieces_cap_bytes for o in seen] == [cap]
