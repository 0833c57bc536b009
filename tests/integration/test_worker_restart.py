"""A volunteer restarts a worker with the README's command: `sangama worker --join CODE`
run a second time (after Ctrl+C or a reboot) serves again as the same node, without a
new invite; and with the coordinator gone, `sangama status` says so in one sentence."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from app.identity import Identity
from app.lab.processes import spawn_sangama
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration


def test_the_join_command_run_again_restarts_the_same_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README's command names no folder: the identity goes to the user's config
    # folder, here one of the test's own.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    identity_dir = tmp_path / "config" / "sangama" / "identity"
    model = write_tiny_model(tmp_path / "tiny4.gguf", n_layer=4)
    coord = CoordinatorProcess.start(tmp_path / "coordinator", model, min_stages=1)
    try:
        code = coord.admin.create_invite("worker", uses=1)["code"]
        command = ["worker", "--join", code]

        async def serve_once(name: str) -> str:
            child = await spawn_sangama(name, command, tmp_path / f"{name}.log", 240)
            try:
                return child.ready_line
            finally:
                await child.stop()  # SIGTERM, as Ctrl+C or a shutdown ends it

        first = asyncio.run(serve_once("first"))
        second = asyncio.run(serve_once("second"))
        node_id = Identity.load(identity_dir).node_id
        assert first.split()[1] == second.split()[1] == node_id
        assert second.split()[-2:] == ["layers", "0-3"]  # READY NODE ADDRESS layers 0-3
        said = (tmp_path / "second.log").read_text()
        assert f"restarting as {node_id} (worker)" in said, said
        # One identity, one use of the invite: the restart did not join again.
        invites = coord.admin.get("/api/v1/invites")
        assert [i["uses_left"] for i in invites] == [0]
        assert [n["node_id"] for n in coord.admin.swarm()["nodes"]] == [node_id]
        address = coord.url.removeprefix("https://")
    finally:
        coord.stop()

    # The coordinator is gone: one plain sentence, nothing from urllib3.
    status = subprocess.run(
        [sys.executable, "-m", "app.cli", "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = (status.stdout + status.stderr).strip()
    assert status.returncode != 0
    assert (
        f"cannot reach the coordinator at {address} (connection refused): is it running? "
        "check the address in your invite"
    ) in out, out
    for internal in ("HTTPSConnectionPool", "Max retries", "Errno", "Traceback"):
        assert internal not in out, out
