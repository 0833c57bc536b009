"""Where downloaded pieces go: the user cache dir for the default identity (what `apt purge`
with the marker removes), the identity's own folder for an explicit one; and how the cache
stays under its cap: other stages' files evicted least recently used first, the current
stage's never, a stage that cannot fit refused with nothing deleted."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.errors import PiecesCacheFull
from app.identity import default_identity_dir
from app.pieces_cache import (
    LAST_USED_FILE,
    cached_files,
    current_stage,
    default_cap,
    make_room,
    pieces_dir,
    pieces_root,
    record_use,
)
from core.gguf_slices import slice_model
from core.manifest import MANIFEST_FILE, Manifest, PieceInfo
from core.types import LayerRange
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.unit


@pytest.fixture
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_the_default_identity_keeps_pieces_in_the_user_cache(xdg: Path) -> None:
    got = pieces_dir(default_identity_dir(), "SmolLM2-135M-Instruct.Q4_1")
    assert got == xdg / "cache" / "sangama" / "pieces" / "SmolLM2-135M-Instruct.Q4_1"
    assert not got.is_relative_to(xdg / "config")  # purge keeps config, removes this


def test_the_default_identity_is_recognised_through_another_spelling(xdg: Path) -> None:
    spelled = xdg / "config" / "x" / ".." / "sangama" / "identity"
    assert pieces_dir(spelled, "m") == xdg / "cache" / "sangama" / "pieces" / "m"


def test_an_explicit_identity_keeps_its_pieces_to_itself(xdg: Path) -> None:
    own = xdg / "node-b"
    assert pieces_dir(own, "m") == own / "pieces" / "m"


# --- the cap: make_room on a cache written here -------------------------------------------

MODEL = "tiny"


@pytest.fixture(scope="module")
def sliced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    work = tmp_path_factory.mktemp("sliced")
    model = write_tiny_model(work / "tiny.gguf", arch="llama")
    return work / "src", slice_model(model, work / "src")


def copy_pieces(src: Path, dest: Path, pieces: list[PieceInfo]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for p in pieces:
        shutil.copyfile(src / p.file, dest / p.file)


def old_model(node: Path, name: str, sizes: list[int], last_used: float) -> Path:
    """A model served long ago: files of `sizes` bytes, stamped as used at `last_used`."""
    folder = pieces_dir(node, name)
    folder.mkdir(parents=True)
    paths = []
    for i, size in enumerate(sizes):
        (folder / f"blk.{i:03d}.gguf").write_bytes(b"\0" * size)
        paths.append(f"blk.{i:03d}.gguf")
    (folder / MANIFEST_FILE).write_text("{}")
    record_use(folder, paths, last_used)
    return folder


def stage_bytes(manifest: Manifest, layers: LayerRange) -> int:
    """What a stage takes in the cache: its pieces, and the stage file about as large."""
    return 2 * sum(p.size for p in manifest.pieces_for(layers))


def test_make_room_evicts_an_old_model_and_keeps_the_stage(
    sliced: tuple[Path, Manifest], tmp_path: Path
) -> None:
    src, manifest = sliced
    layers = LayerRange(0, 2)
    node = tmp_path / "node"
    copy_pieces(src, pieces_dir(node, MODEL), manifest.pieces_for(layers)[:2])
    old = old_model(node, "old", [100_000, 100_000], last_used=1.0)
    cap = stage_bytes(manifest, layers) + 50_000  # room for the stage, not for the old model

    plan = make_room(node, MODEL, manifest, layers, cap, now=1000.0)

    assert plan.fits and {f.model for f in plan.evict} == {"old"}
    assert not old.exists()  # its manifest and record went with its last piece
    kept = sorted(p.name for p in pieces_dir(node, MODEL).iterdir())
    assert kept == ["blk.000.gguf", "embedding.gguf", LAST_USED_FILE]
    current = current_stage(pieces_root(node))
    assert current is not None and current.model == MODEL and current.layers == layers
    stamps = {f.path: f.last_used for f in cached_files(pieces_root(node))}
    assert stamps == {"blk.000.gguf": 1000.0, "embedding.gguf": 1000.0}


def test_only_as_much_as_needed_goes_and_the_record_not_the_file_times_decide(
    sliced: tuple[Path, Manifest], tmp_path: Path
) -> None:
    _src, manifest = sliced
    layers = LayerRange(0, 2)
    node = tmp_path / "node"
    older = old_model(node, "older", [100_000], last_used=1.0)
    old = old_model(node, "old", [100_000], last_used=2.0)
    # Written (and read) just now: file times would call "older" the newest; the record wins.
    now = time.time()
    os.utime(older / "blk.000.gguf", (now, now))
    cap = stage_bytes(manifest, layers) + 150_000

    plan = make_room(node, MODEL, manifest, layers, cap)

    assert [f.model for f in plan.evict] == ["older"]
    assert not older.exists() and old.exists()


def test_a_stage_that_cannot_fit_is_refused_and_nothing_is_deleted(
    sliced: tuple[Path, Manifest], tmp_path: Path
) -> None:
    _src, manifest = sliced
    layers = LayerRange(0, 8)
    node = tmp_path / "node"
    old = old_model(node, "old", [100_000], last_used=1.0)
    cap = stage_bytes(manifest, layers) - 1

    with pytest.raises(PiecesCacheFull) as caught:
        make_room(node, MODEL, manifest, layers, cap)

    text = str(caught.value)
    assert caught.value.needed_bytes == cap + 1 and caught.value.cap_bytes == cap
    assert f"layers 0-7 of {MODEL}" in text and "--pieces-cap" in text and "Settings" in text
    assert (old / "blk.000.gguf").exists()
    assert current_stage(pieces_root(node)) is None


def test_the_default_cap_is_read_from_the_disk_of_the_cache(
    sliced: tuple[Path, Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _src, manifest = sliced
    node = tmp_path / "node"
    old_model(node, "old", [100_000], last_used=1.0)
    seen: list[Path] = []

    def usage(path: Path) -> Any:
        seen.append(Path(path))
        return SimpleNamespace(total=1_000_000, used=600_000, free=400_000)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    with pytest.raises(PiecesCacheFull, match="the default: half the free disk space"):
        make_room(node, MODEL, manifest, LayerRange(0, 2))
    assert seen == [pieces_root(node)]
    # Half of the 400 kB free and the 100 kB the cache holds (a tenth of the disk stays
    # free): 250 kB, less than the stage needs.
    assert default_cap(pieces_root(node), cached_files(pieces_root(node))) == 250_000
