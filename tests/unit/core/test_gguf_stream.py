"""The streamed slicer: pieces byte-identical to what gguf-py's GGUFWriter wrote before,
hostile offsets refused before any read, and a run cut short resumed without rewriting
the pieces it finished."""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from pathlib import Path

import pytest
from gguf import GGUFReader

from core import gguf_stream
from core.errors import SliceError, UnsupportedModelError
from core.gguf_slices import slice_model
from core.manifest import Manifest, sha256_file
from tests.support.gguf_fixtures import reference_pieces, write_rich_model
from tests.support.tiny_models import write_tiny_model
from tests.support.tiny_qwen35 import write_qwen35_model

pytestmark = pytest.mark.unit


def _expected_plan(model: Path) -> list[tuple[str, list[str], bool]]:
    """Which tensors each piece holds, by the slicer's rules, read off the source."""
    r = GGUFReader(str(model))
    arch = r.fields["general.architecture"].contents()
    n_layer = int(r.fields[f"{arch}.block_count"].contents())
    n_mtp = (
        int(r.fields[f"{arch}.nextn_predict_layers"].contents())
        if (f"{arch}.nextn_predict_layers" in r.fields)
        else 0
    )
    groups: dict[str, list[str]] = {"embedding.gguf": []}
    for i in range(n_layer - n_mtp):
        groups[f"blk.{i:03d}.gguf"] = []
    groups["head.gguf"] = []
    for t in r.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m and int(m.group(1)) >= n_layer - n_mtp:
            file = "mtp.gguf"
        elif m:
            file = f"blk.{int(m.group(1)):03d}.gguf"
        elif t.name in ("token_embd.weight", "position_embd.weight"):
            file = "embedding.gguf"
        elif t.name.startswith("rope_"):
            file = "shared.gguf"
        else:
            file = "head.gguf"
        groups.setdefault(file, []).append(t.name)
    return [(f, names, f == "embedding.gguf") for f, names in groups.items()]


@pytest.mark.parametrize("kind", ["llama", "rich", "qwen35-mtp"])
def test_pieces_are_byte_identical_to_gguf_writers(tmp_path: Path, kind: str) -> None:
    model = {
        "llama": lambda p: write_tiny_model(p),
        "rich": lambda p: write_rich_model(p),
        "qwen35-mtp": lambda p: write_qwen35_model(p, mtp=True),
    }[kind](tmp_path / "m.gguf")
    manifest = slice_model(model, tmp_path / "pieces")
    plan = _expected_plan(model)
    assert sorted(p.file for p in manifest.pieces) == sorted(f for f, _, _ in plan)
    reference = reference_pieces(model, plan)
    for p in manifest.pieces:
        got = (tmp_path / "pieces" / p.file).read_bytes()
        assert got == reference[p.file], p.file
        assert p.sha256 == hashlib.sha256(got).hexdigest() and p.size == len(got)
    assert manifest.source_sha256 == sha256_file(model)
    assert manifest.source_size == model.stat().st_size
    assert not list((tmp_path / "pieces").glob("*.part"))
    assert not (tmp_path / "pieces" / gguf_stream.JOURNAL_FILE).exists()


def test_progress_counts_every_byte_of_the_source_once(tmp_path: Path) -> None:
    model = write_rich_model(tmp_path / "m.gguf")
    calls: list[tuple[int, int]] = []
    slice_model(model, tmp_path / "p", progress=lambda d, t: calls.append((d, t)))
    size = model.stat().st_size
    assert calls and all(t == size for _, t in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == size


# ---------------------------------------------------------------- hostile files


def _tensor_offset_field(model: Path, index: int) -> int:
    """Byte position of tensor `index`'s offset in the header."""
    field = GGUFReader(str(model)).tensors[index].field
    return int(field.offset) + sum(int(p.nbytes) for p in field.parts[:-1])


def test_a_tensor_beyond_the_file_is_refused_before_reading(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "m.gguf")
    data = bytearray(model.read_bytes())
    at = _tensor_offset_field(model, 3)
    data[at : at + 8] = struct.pack("<Q", 1 << 50)
    model.write_bytes(bytes(data))
    with pytest.raises(SliceError):
        slice_model(model, tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_tensor_data_out_of_header_order_is_refused(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "m.gguf")
    data = bytearray(model.read_bytes())
    a, b = _tensor_offset_field(model, 1), _tensor_offset_field(model, 2)
    data[a : a + 8], data[b : b + 8] = data[b : b + 8], data[a : a + 8]
    model.write_bytes(bytes(data))
    with pytest.raises(SliceError, match="expected"):
        slice_model(model, tmp_path / "p")


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "m.gguf")
    size = model.stat().st_size
    with open(model, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(SliceError):
        slice_model(model, tmp_path / "p")


def test_an_unchecked_architecture_is_refused_by_name(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "m.gguf")
    data = model.read_bytes().replace(b"llama", b"xlama")  # every llama.* key: xlama.*
    model.write_bytes(data)
    with pytest.raises(UnsupportedModelError, match=r"'xlama'.*not checked"):
        slice_model(model, tmp_path / "p")


# ---------------------------------------------------------------- resuming


class _Stop(Exception):
    pass


def _interrupted(model: Path, out: Path, after_bytes: int) -> None:
    def stop(done: int, total: int) -> None:
        if done >= after_bytes:
            raise _Stop

    with pytest.raises(_Stop):
        slice_model(model, out, progress=stop)


def _stamps(out: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("*.gguf")}


@pytest.fixture
def fresh(tmp_path: Path) -> tuple[Path, Manifest]:
    model = write_tiny_model(tmp_path / "m.gguf", n_layer=8, n_embd=128, n_ff=512)
    return model, slice_model(model, tmp_path / "fresh")


def test_an_interrupted_run_resumes_without_rewriting_finished_pieces(
    fresh: tuple[Path, Manifest], tmp_path: Path
) -> None:
    model, expected = fresh
    out = tmp_path / "out"
    _interrupted(model, out, model.stat().st_size // 2)
    finished = _stamps(out)
    parts = list(out.glob("*.part"))
    assert finished and parts  # some pieces done, one half-written
    assert not (out / "manifest.json").exists()
    journal = (out / gguf_stream.JOURNAL_FILE).read_text().splitlines()
    assert {json.loads(line)["file"] for line in journal[1:]} == set(finished)

    manifest = slice_model(model, out)
    assert manifest == expected
    after = _stamps(out)
    for name, stamp in finished.items():
        assert after[name] == stamp, f"{name} was rewritten"
    assert not list(out.glob("*.part"))
    assert not (out / gguf_stream.JOURNAL_FILE).exists()
    assert Manifest.load(out) == expected


def test_a_finished_piece_whose_bytes_changed_is_written_again(
    fresh: tuple[Path, Manifest], tmp_path: Path
) -> None:
    model, expected = fresh
    out = tmp_path / "out"
    _interrupted(model, out, model.stat().st_size * 3 // 4)
    victim = sorted(_stamps(out))[0]
    raw = bytearray((out / victim).read_bytes())
    raw[-40] ^= 0xFF  # same size, other bytes
    (out / victim).write_bytes(bytes(raw))
    assert slice_model(model, out) == expected
    assert sha256_file(out / victim) == expected.piece(victim.removesuffix(".gguf")).sha256


def test_a_journal_of_another_source_is_not_trusted(
    fresh: tuple[Path, Manifest], tmp_path: Path
) -> None:
    model, expected = fresh
    out = tmp_path / "out"
    _interrupted(model, out, model.stat().st_size // 2)
    finished = _stamps(out)
    os.utime(model, ns=(1, 1))  # the source changed since (its mtime says so)
    assert slice_model(model, out).pieces == expected.pieces
    after = _stamps(out)
    assert all(after[name][1] != stamp[1] for name, stamp in finished.items())


def test_a_torn_journal_line_is_skipped(tmp_path: Path) -> None:
    identity = [["m.gguf", 10, 1]]
    (tmp_path / gguf_stream.JOURNAL_FILE).write_text(
        json.dumps({"format": gguf_stream.JOURNAL_FORMAT, "source": identity})
        + "\n"
        + json.dumps({"file": "blk.000.gguf", "sha256": "ab", "size": 5})
        + '\n{"file": "blk.001.gg'
    )
    assert gguf_stream.read_journal(tmp_path, identity) == {"blk.000.gguf": ("ab", 5)}
    assert gguf_stream.read_journal(tmp_path, [["m.gguf", 11, 1]]) == {}
