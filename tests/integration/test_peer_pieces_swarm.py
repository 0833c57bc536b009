"""Pieces from peers with real processes: two workers serve a model's two stages and
their pieces (app/serving/piece_server.py); a spare that joins later gets its standby
stage's pieces from the worker serving that stage, and the coordinator's piece endpoint
answers with no byte of them (its count is in the operator's swarm view)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.identity import Identity
from app.lab.processes import Child, spawn_sangama
from app.pieces_cache import pieces_dir
from core.manifest import Manifest, verify_piece
from core.types import LayerRange
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny8.gguf", n_layer=8)


@pytest.fixture(scope="module")
def coord(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    data = tmp_path_factory.mktemp("coordinator")
    c = CoordinatorProcess.start(
        data,
        model,
        min_stages=2,
        extra_args=["--spares", "1", "--stale-after", "2", "--dead-after", "4"],
    )
    yield c
    c.stop()


async def _start_worker(coord: CoordinatorProcess, wd: Path, name: str, wait: bool) -> Child:
    code = coord.admin.create_invite("worker")["code"]
    args = ["worker", "--join", code, "--identity-dir", str(wd / name)]
    return await spawn_sangama(name, args, wd / f"{name}.log", 180, wait_ready=wait)


def _until(what: str, check: object, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_spare_gets_its_pieces_from_the_peer_serving_them(
    coord: CoordinatorProcess, tmp_path: Path
) -> None:
    async def scenario() -> tuple[int, int, str, list[int]]:
        workers = list(
            await asyncio.gather(*(_start_worker(coord, tmp_path, f"w{i}", True) for i in range(2)))
        )
        loop = asyncio.get_running_loop()
        try:
            # Both stages serve, and say where their pieces are.
            await loop.run_in_executor(
                None,
                _until,
                "both stages serving their pieces",
                lambda: len(coord.admin.swarm()["pieces_served_at"]) == 2,
            )
            served_before = int(coord.admin.swarm()["piece_bytes_served"])
            workers.append(await _start_worker(coord, tmp_path, "spare", False))

            def spare_ready() -> bool:
                try:
                    me = Identity.load(tmp_path / "spare")
                except Exception:
                    return False
                return me.node_id in coord.admin.swarm()["pieces_served_at"]

            await loop.run_in_executor(None, _until, "the spare's standby pieces", spare_ready)
            swarm = coord.admin.swarm()
            standby = swarm["standby"][Identity.load(tmp_path / "spare").node_id]
            log = (tmp_path / "spare.log").read_text(errors="replace")
            return served_before, int(swarm["piece_bytes_served"]), log, standby
        finally:
            for w in workers:
                await w.stop()

    served_before, served_after, log, standby = asyncio.run(scenario())
    assert served_before > 0  # the first two stages came from the coordinator
    # The spare's stage came from the peer serving it: not one byte from the coordinator.
    assert served_after == served_before, log
    assert "demoted" not in log
    me = Identity.load(tmp_path / "spare")
    folder = pieces_dir(me.directory, coord.admin.swarm()["model"])
    manifest = Manifest.load(folder)
    for piece in manifest.pieces_for(LayerRange(*standby)):
        verify_piece(folder, piece)
