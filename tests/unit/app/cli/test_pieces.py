"""`sangama pieces list|clear` on a cache written here: what it shows, what it deletes, what
it keeps (the stage this node last prepared, unless --all --yes), and one-line errors."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from app.cli.main import main
from app.pieces_cache import CURRENT_FILE, make_room, pieces_dir, pieces_root, record_use
from core.gguf_slices import slice_model
from core.manifest import Manifest
from core.types import LayerRange
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.unit

STAGE = LayerRange(0, 2)
LONG_AGO = 46_353_600.0
"""1971-07-01 06:00 UTC: that year and month in any time zone."""


@pytest.fixture(scope="module")
def sliced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    work = tmp_path_factory.mktemp("sliced")
    model = write_tiny_model(work / "tiny.gguf", arch="llama")
    return work / "src", slice_model(model, work / "src")


@pytest.fixture
def node(sliced: tuple[Path, Manifest], tmp_path: Path) -> Path:
    """A node's identity folder whose cache holds `tiny` (layers 0-1 prepared last, and
    blk.005 of an earlier stage) and `old`, a model served long ago."""
    src, manifest = sliced
    node = tmp_path / "node"
    tiny = pieces_dir(node, "tiny")
    tiny.mkdir(parents=True)
    for p in [*manifest.pieces_for(STAGE), manifest.piece("blk.005")]:
        shutil.copyfile(src / p.file, tiny / p.file)
    old = pieces_dir(node, "old")
    old.mkdir()
    (old / "blk.000.gguf").write_bytes(b"\0" * (3 << 20))
    (old / "blk.001.gguf.part").write_bytes(b"\0" * (1 << 20))
    os.utime(old / "blk.001.gguf.part", (LONG_AGO, LONG_AGO))
    record_use(old, ["blk.000.gguf"], LONG_AGO)
    manifest.save(tiny)
    make_room(node, "tiny", manifest, STAGE, 1 << 40)
    return node


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["pieces", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_list_shows_each_model_its_pieces_size_last_use_and_the_stage_in_use(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "list", "--identity", str(node))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"Pieces in {pieces_root(node)}: 2 models, 4.")
    assert "the default cap here now:" in lines[0]
    assert lines[1].split() == ["MODEL", "PIECES", "SIZE", "LAST", "USED", "IN", "USE"]
    old = lines[2].split()
    assert old[:4] == ["old", "1", "4.0", "MiB"] and old[4].startswith("1971-0") and old[-1] == "-"
    tiny = lines[3].split()
    assert tiny[:2] == ["tiny", "4"]  # embedding, blk.000, blk.001, blk.005
    assert lines[3].endswith("layers 0-1 (3 files)")
    assert lines[4].startswith("In use: the stage this node last prepared")


def test_list_reads_a_cache_folder_named_directly(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    by_identity = run(capsys, "list", "--identity", str(node))
    assert run(capsys, "list", "--cache", str(pieces_root(node))) == by_identity


def test_list_of_an_empty_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "list", "--cache", str(tmp_path / "none")) == (
        0,
        f"No pieces in {tmp_path / 'none'}.\n",
        "",
    )


def test_clear_deletes_all_but_the_stage_last_prepared(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "clear", "--identity", str(node))
    assert code == 0
    assert out.startswith("Deleted 3 files (4.1 MiB) of 2 models from ")
    assert "Kept 3 files" in out and "layers 0-1 of tiny" in out and "--all --yes" in out
    root = pieces_root(node)
    assert names(root) == [CURRENT_FILE, "tiny"]  # the old model's folder went too
    assert names(root / "tiny") == [
        "blk.000.gguf",
        "blk.001.gguf",
        "embedding.gguf",
        "last_used.json",
        "manifest.json",
    ]


def test_clear_one_model(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "clear", "--model", "old", "--identity", str(node))
    assert code == 0 and out.startswith("Deleted 2 files (4.0 MiB) of 1 model from ")
    assert "Kept" not in out
    assert names(pieces_root(node)) == [CURRENT_FILE, "tiny"]
    assert "blk.005.gguf" in names(pieces_root(node) / "tiny")


def test_clear_all_needs_yes_and_then_deletes_everything(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "clear", "--all", "--identity", str(node))
    assert code == 2 and out == ""
    assert err.startswith("sangama pieces: error: --all also deletes the stage this node")
    assert "layers 0-1 of tiny" in err and "add --yes" in err and len(err.splitlines()) == 1
    assert "blk.000.gguf" in names(pieces_root(node) / "tiny")

    code, out, _ = run(capsys, "clear", "--all", "--yes", "--identity", str(node))
    assert code == 0 and out.startswith("Deleted 6 files") and "Kept" not in out
    assert names(pieces_root(node)) == []
    assert run(capsys, "clear", "--identity", str(node))[1].startswith("Nothing to delete in ")


@pytest.mark.parametrize(
    ("model", "says"),
    [("absent", "no pieces of model 'absent' in "), ("../etc", "model name")],
)
def test_clear_refuses_a_model_it_does_not_hold_in_one_line(
    node: Path, capsys: pytest.CaptureFixture[str], model: str, says: str
) -> None:
    code, out, err = run(capsys, "clear", "--model", model, "--identity", str(node))
    assert code == 2 and out == ""
    assert err.startswith("sangama pieces: error: ") and says in err
    assert len(err.splitlines()) == 1
    assert len(names(pieces_root(node))) == 3  # nothing deleted
