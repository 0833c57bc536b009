"""Pieces as ranges of the published files: the manifest field and its bounds, the reads
a piece takes and how their bodies become the piece, source demotion, and pieces planned
from headers alone that are byte-identical to sliced ones (one file and gguf-split sets)."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from io import BytesIO
from pathlib import Path

import pytest

from core.errors import SliceError
from core.gguf_header import GgufHeader, parse_header
from core.gguf_slices import slice_model
from core.manifest import Manifest, PieceInfo
from core.piece_sources import (
    DATA,
    FILL,
    HEADER,
    KEEP,
    OK,
    SKIP,
    TRANSIENT,
    WRONG,
    ZEROS,
    BodyMismatch,
    Mirror,
    MirrorFile,
    PieceRanges,
    SourceHealth,
    Span,
    after,
    mirror_from_doc,
    piece_segments,
    plan_reads,
    route_body,
    segments_between,
)
from core.published_model import plan_published, published_manifest, shard_urls
from tests.support.gguf_fixtures import split_gguf, write_rich_model

pytestmark = pytest.mark.unit

FILES = (
    MirrorFile("https://hub.example/a.gguf", 4000),
    MirrorFile("https://hub.example/b.gguf", 3000),
)
RANGES = PieceRanges(
    header=100,
    alignment=32,
    spans=(Span(0, 1000, 50), Span(0, 1056, 64), Span(0, 3000, 10), Span(1, 0, 33)),
)


def contents(seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(f.size) for f in FILES]


def expected_piece(header: bytes, files: Sequence[bytes], r: PieceRanges) -> bytes:
    out = bytearray(header)
    for s in r.spans:
        out += files[s.file][s.offset : s.offset + s.length]
        out += bytes(-s.length % r.alignment)
    return bytes(out)


def assemble(header: bytes, files: Sequence[bytes], start: int, stop: int | None) -> bytes:
    """Run the reads for [start, stop) against in-memory files, in 7-byte chunks."""
    out = bytearray()
    for read in plan_reads(segments_between(piece_segments(RANGES), start, stop)):
        body = (
            header[read.start : read.stop]
            if read.file < 0
            else files[read.file][read.start : read.stop]
        )
        chunks = [body[i : i + 7] for i in range(0, len(body), 7)]
        out += b"".join(route_body(read.ops, chunks))
    return bytes(out)


def test_segments_lay_out_the_piece_and_reads_merge_adjacent_tensors() -> None:
    segs = piece_segments(RANGES)
    assert [s.kind for s in segs] == [HEADER, DATA, ZEROS, DATA, DATA, ZEROS, DATA, ZEROS]
    assert sum(s.length for s in segs) == RANGES.size == 100 + 64 + 64 + 32 + 64
    reads = plan_reads(segs, max_gap=1024)
    # The first two tensors are 6 bytes apart in file 0: one request, the gap dropped;
    # the third is 1880 bytes on, beyond max_gap: a request of its own.
    assert [(r.file, r.start, r.stop) for r in reads] == [
        (-1, 0, 100),
        (0, 1000, 1120),
        (0, 3000, 3010),
        (1, 0, 33),
    ]
    assert reads[1].ops == ((KEEP, 50), (FILL, 14), (SKIP, 6), (KEEP, 64))
    assert reads[3].ops == ((KEEP, 33), (FILL, 31))
    assert sum(r.stop - r.start for r in reads if r.from_mirror) == 50 + 6 + 64 + 10 + 33


@pytest.mark.parametrize("start", [0, 1, 99, 100, 149, 150, 163, 164, 250, 300, 323])
def test_any_window_of_the_piece_is_built_exactly(start: int) -> None:
    header, files = bytes(range(100)), contents()
    whole = expected_piece(header, files, RANGES)
    assert assemble(header, files, 0, None) == whole
    assert assemble(header, files, start, None) == whole[start:]
    assert assemble(header, files, start, min(start + 40, len(whole))) == whole[start : start + 40]


def test_short_bodies_give_fewer_bytes_and_long_ones_raise() -> None:
    ops = ((KEEP, 5), (FILL, 3), (SKIP, 2), (KEEP, 4))
    assert b"".join(route_body(ops, [b"abcde", b"xy", b"fghi"])) == b"abcde\0\0\0fghi"
    assert b"".join(route_body(ops, [b"abc"])) == b"abc"
    with pytest.raises(BodyMismatch):
        b"".join(route_body(ops, [b"abcdexyfghi", b"!"]))


def test_wrong_bytes_demote_at_once_transient_failures_after_a_run() -> None:
    h = after(SourceHealth(), WRONG, "sha256")
    assert h.demoted and h.reason == "sha256"
    h = SourceHealth()
    for _ in range(2):
        h = after(h, TRANSIENT, "stall", max_failures=3)
    assert not h.demoted
    assert after(h, OK) == SourceHealth()  # a success resets the run
    assert after(h, TRANSIENT, "stall", max_failures=3).demoted
    assert after(after(h, WRONG, "x"), OK).demoted  # demoted stays demoted


def manifest_doc(tmp_path: Path) -> tuple[Manifest, dict[str, object]]:
    model = write_rich_model(tmp_path / "rich.gguf")
    manifest = slice_model(model, tmp_path / "pieces")
    doc = json.loads(manifest.to_json())
    return manifest, doc


def test_manifest_without_mirror_reads_as_before_and_old_readers_skip_the_field(
    tmp_path: Path,
) -> None:
    manifest, doc = manifest_doc(tmp_path)
    assert "mirror" not in doc and manifest.mirror is None
    mirror = Mirror(
        (MirrorFile("https://hub.example/m.gguf", 10**9),),
        {p.name: PieceRanges(p.size, 32, ()) for p in manifest.pieces},
    )
    with_mirror = Manifest(manifest.facts, manifest.pieces, "s", 1, mirror)
    again = Manifest.from_json(with_mirror.to_json())
    assert again == with_mirror
    # What a reader without the field does with each piece entry: still a PieceInfo.
    entries = json.loads(with_mirror.to_json())["pieces"]
    assert [PieceInfo(**e) for e in entries] == list(manifest.pieces)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["files"][0].update(url="http://hub.example/m.gguf"),
        lambda d: d["files"][0].update(url="https://hub.example/a b.gguf"),
        lambda d: d["files"][0].update(size=-1),
        lambda d: d["pieces"]["blk.000"].update(spans=[[0, 10**9 - 5, 10]]),
        lambda d: d["pieces"]["blk.000"].update(spans=[[1, 0, 10]]),
        lambda d: d["pieces"]["blk.000"].update(header=1),
        lambda d: d["pieces"]["blk.000"].update(alignment=48),
        lambda d: d["pieces"].update({"blk.999": d["pieces"]["blk.000"]}),
        lambda d: d["pieces"]["blk.000"].update(spans=[[0, 0, 1]] * 70000),
    ],
)
def test_a_hostile_mirror_field_is_refused(tmp_path: Path, change: object) -> None:
    manifest, _ = manifest_doc(tmp_path)
    sizes = {p.name: p.size for p in manifest.pieces}
    field = {
        "files": [{"url": "https://hub.example/m.gguf", "size": 10**9}],
        "pieces": {"blk.000": {"header": sizes["blk.000"], "alignment": 32, "spans": []}},
    }
    mirror_from_doc(json.loads(json.dumps(field)), sizes)  # the unchanged field is fine
    change(field)  # type: ignore[operator]
    with pytest.raises(SliceError):
        mirror_from_doc(field, sizes)


def headers_of(paths: Sequence[Path]) -> list[tuple[GgufHeader, bytes]]:
    return [(parse_header(BytesIO(p.read_bytes())), p.read_bytes()) for p in paths]


@pytest.mark.parametrize("max_tensors", [0, 4, 7])
def test_pieces_planned_from_headers_are_the_sliced_pieces(
    tmp_path: Path, max_tensors: int
) -> None:
    model = write_rich_model(tmp_path / "rich.gguf")
    sliced = slice_model(model, tmp_path / "pieces")
    (tmp_path / "hub").mkdir()
    paths = split_gguf(model, tmp_path / "hub", "rich", max_tensors) if max_tensors else [model]
    files = tuple(MirrorFile(f"https://hub.example/{p.name}", p.stat().st_size) for p in paths)
    if len(paths) > 1:
        assert shard_urls(files[0].url, len(paths)) == tuple(f.url for f in files)
    datas = [p.read_bytes() for p in paths]
    facts, plans, mirror = plan_published(files, headers_of(paths), "rich")
    built = {}
    for plan in plans:
        r = mirror.ranges(plan.name)
        assert r is not None
        built[plan.name] = hashlib.sha256(expected_piece(plan.header, datas, r)).hexdigest()
    manifest = published_manifest(facts, plans, mirror, built)
    assert manifest.facts == sliced.facts
    assert manifest.pieces == sliced.pieces  # names, sizes and sha256: byte-identical
    assert Manifest.from_json(manifest.to_json()) == manifest
    if max_tensors == 4:  # some block's tensors straddle two shards
        assert any(len({s.file for s in r.spans}) > 1 for r in mirror.pieces.values())


def test_a_shard_given_out_of_place_is_refused(tmp_path: Path) -> None:
    model = write_rich_model(tmp_path / "rich.gguf")
    (tmp_path / "hub").mkdir()
    paths = split_gguf(model, tmp_path / "hub", "rich", 5)
    files = tuple(MirrorFile(f"https://hub.example/{p.name}", p.stat().st_size) for p in paths)
    swapped = [paths[1], paths[0], *paths[2:]]
    with pytest.raises(SliceError, match="not shard 1"):
        plan_published(files, headers_of(swapped))
