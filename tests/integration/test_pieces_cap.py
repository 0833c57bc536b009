"""A stage's download (app.serving.assigned_stage.prepare_pieces) against a real HTTP server on
loopback, under a cap on the pieces cache: other models' and stages' pieces are evicted
least recently used first, the assigned stage's never; a stage that cannot fit is refused
before any request; a re-assignment fetches only the pieces it lacks.

Only files, request counts and errors are asserted, never how fast anything was.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests

from app.errors import PiecesCacheFull
from app.pieces_cache import pieces_dir, record_use
from app.serving.assigned_stage import prepare_pieces
from coordinator.contract import Assignment
from core.manifest import Manifest, verify_piece
from core.types import LayerRange
from tests.support.range_server import RangeServer

pytestmark = pytest.mark.integration

MODEL = "tiny"


@dataclass
class Coordinator:
    """The two calls prepare_pieces makes of a CoordinatorClient, answered from `served`."""

    session: requests.Session
    served: Manifest
    base_url: str

    def manifest(self, _url: str) -> Manifest:
        return self.served

    def pieces_url(self, _assignment: Assignment) -> str:
        return self.base_url


@pytest.fixture
def coordinator(sliced: tuple[Path, Manifest], server: RangeServer) -> Iterator[Coordinator]:
    with requests.Session() as http:
        yield Coordinator(http, sliced[1], server.url)


def prepare(node: Path, coordinator: Coordinator, layers: LayerRange, cap: int) -> Path:
    assignment = Assignment(MODEL, (layers.start, layers.stop), None, "manifest", "pieces")
    identity: Any = SimpleNamespace(directory=node)
    client: Any = coordinator
    return asyncio.run(
        prepare_pieces(identity, client, assignment, lambda _p: None, pieces_cap_bytes=cap)
    )


def stage_bytes(manifest: Manifest, layers: LayerRange) -> int:
    """A stage's room in the cache: its pieces, and the stage file about as large."""
    return 2 * sum(p.size for p in manifest.pieces_for(layers))


def old_model(src: Path, node: Path, manifest: Manifest) -> Path:
    """Another model this node served long ago, all of its pieces still cached."""
    folder = pieces_dir(node, "old-model")
    folder.mkdir(parents=True)
    for p in manifest.pieces:
        shutil.copyfile(src / p.file, folder / p.file)
    record_use(folder, [p.file for p in manifest.pieces], 1.0)
    return folder


def test_a_download_over_the_cap_evicts_an_old_model_and_keeps_the_assigned_pieces(
    sliced: tuple[Path, Manifest], server: RangeServer, coordinator: Coordinator, tmp_path: Path
) -> None:
    src, manifest = sliced
    node = tmp_path / "node"
    old = old_model(src, node, manifest)
    layers = LayerRange(0, 4)
    cap = stage_bytes(manifest, layers) + 1000  # less than any piece of the old model

    folder = prepare(node, coordinator, layers, cap)

    assert not old.exists()
    for p in manifest.pieces_for(layers):
        verify_piece(folder, p)
    assert set(server.requests) == {p.file for p in manifest.pieces_for(layers)}


def test_a_reassignment_evicts_the_old_stage_and_fetches_only_what_it_lacks(
    sliced: tuple[Path, Manifest], server: RangeServer, coordinator: Coordinator, tmp_path: Path
) -> None:
    _src, manifest = sliced
    node = tmp_path / "node"
    folder = prepare(node, coordinator, LayerRange(0, 4), 1 << 40)
    server.reset_counters()
    moved = LayerRange(2, 6)

    prepare(node, coordinator, moved, stage_bytes(manifest, moved) + 10_000)

    assert dict(server.requests) == {"blk.004.gguf": 1, "blk.005.gguf": 1}
    on_disk = sorted(p.name for p in folder.glob("*.gguf"))
    assert on_disk == [p.file for p in manifest.pieces_for(moved)]  # 0, 1 and embedding went


def test_a_reassignment_with_room_keeps_every_verified_piece_and_asks_for_none_again(
    sliced: tuple[Path, Manifest], server: RangeServer, coordinator: Coordinator, tmp_path: Path
) -> None:
    _src, manifest = sliced
    node = tmp_path / "node"
    folder = prepare(node, coordinator, LayerRange(0, 6), 0)  # the default cap
    server.reset_counters()

    prepare(node, coordinator, LayerRange(2, 5), 0)
    prepare(node, coordinator, LayerRange(0, 3), 0)

    assert dict(server.requests) == {}
    assert len(list(folder.glob("*.gguf"))) == len(manifest.pieces_for(LayerRange(0, 6)))


def test_a_stage_that_cannot_fit_is_refused_before_any_request(
    sliced: tuple[Path, Manifest], server: RangeServer, coordinator: Coordinator, tmp_path: Path
) -> None:
    src, manifest = sliced
    node = tmp_path / "node"
    old = old_model(src, node, manifest)
    layers = LayerRange(0, manifest.facts.n_layer)

    with pytest.raises(PiecesCacheFull, match="raise the cap") as caught:
        prepare(node, coordinator, layers, stage_bytes(manifest, layers) - 1)

    assert caught.value.needed_bytes == stage_bytes(manifest, layers)
    assert dict(server.requests) == {}
    assert len(list(old.glob("*.gguf"))) == len(manifest.pieces)
