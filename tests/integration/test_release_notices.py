"""Releases across a swarm, as volunteers meet them on the command line: the operator
announces a newer release (`--latest-release`) and `sangama status` says so; a swarm that
admits only newer releases (`--min-release`) refuses this one at join, in one line that
names the release to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from net.wire.versions import this_release
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration


def sangama(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny4.gguf", n_layer=4)


def test_status_tells_of_the_release_the_operator_announced(model: Path, tmp_path: Path) -> None:
    coord = CoordinatorProcess.start(
        tmp_path / "coordinator", model, extra_args=["--latest-release", "99.1.0"]
    )
    try:
        code = coord.admin.create_invite("client")["code"]
        joined = sangama("join", code, "--identity", str(tmp_path / "me"))
        assert joined.returncode == 0, joined.stderr
        status = sangama("status", "--identity", str(tmp_path / "me"))
    finally:
        coord.stop()
    line = next(ln for ln in status.stdout.splitlines() if ln.startswith("release"))
    assert (
        line
        == f"release     {this_release()}: Sangama 99.1.0 is available (you run {this_release()})"
    )


def test_a_swarm_of_newer_releases_refuses_this_one_at_join_in_one_line(
    model: Path, tmp_path: Path
) -> None:
    coord = CoordinatorProcess.start(
        tmp_path / "coordinator", model, extra_args=["--min-release", "99.0"]
    )
    try:
        code = coord.admin.create_invite("worker")["code"]
        refused = sangama("join", code, "--identity", str(tmp_path / "me"))
    finally:
        coord.stop()
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert (
        f"Sangama {this_release()} is too old for this swarm: update to 99.0 or later" in lines[0]
    )
    assert not (tmp_path / "me" / "identity.json").exists()


def test_a_release_flag_that_is_no_release_stops_the_coordinator_with_its_name(
    model: Path, tmp_path: Path
) -> None:
    r = sangama(
        "coordinator", "--data", str(tmp_path / "c"), "--model", str(model),
        "--min-release", "soon",
    )  # fmt: skip
    assert r.returncode != 0
    assert "--min-release: 'soon' is not a release like 0.2.0" in r.stderr
