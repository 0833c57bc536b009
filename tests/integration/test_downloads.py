"""coordinator.client.downloads against a real HTTP server on loopback serving real model pieces.

Only contents, counts, headers and the order of progress reports are asserted, never
how fast anything was.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from coordinator.client.downloads import (
    PART_SUFFIX,
    DownloadError,
    DownloadProgress,
    download_pieces,
    format_progress,
)
from core.errors import PieceCorruptError
from core.manifest import Manifest, PieceInfo, verify_piece
from core.types import LayerRange
from tests.support.range_server import RangeServer

pytestmark = pytest.mark.integration

CHUNK = 16 << 10
"""Small chunks, so that a ~150 KB piece gives several progress reports."""


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


class Recorder:
    def __init__(self) -> None:
        self.events: list[DownloadProgress] = []
        self.concurrent = 0
        self.overlapped = False
        self._inside = threading.Lock()

    def __call__(self, p: DownloadProgress) -> None:
        # Calls must be serialised by download_pieces: a second caller would find this taken.
        if not self._inside.acquire(blocking=False):
            self.overlapped = True
            return
        try:
            self.events.append(p)
        finally:
            self._inside.release()

    def finished(self) -> list[str]:
        return [e.piece for e in self.events if e.finished]


def fetch(
    http: requests.Session,
    server: RangeServer,
    pieces: list[PieceInfo],
    dest: Path,
    **kw: object,
) -> list[Path]:
    kw.setdefault("chunk_bytes", CHUNK)
    kw.setdefault("backoff", 0.0)
    return download_pieces(http, server.url, pieces, dest, **kw)  # type: ignore[arg-type]


def assert_same_files(src: Path, dest: Path, pieces: list[PieceInfo]) -> None:
    for p in pieces:
        verify_piece(dest, p)
        assert (dest / p.file).read_bytes() == (src / p.file).read_bytes()
    assert sorted(f.name for f in dest.iterdir()) == sorted(p.file for p in pieces)


def test_downloads_a_stage_subset_with_progress(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    pieces = manifest.pieces_for(LayerRange(3, 6))
    dest = tmp_path / "dest"
    rec = Recorder()

    paths = fetch(http, server, pieces, dest, progress=rec)

    assert paths == [dest / p.file for p in pieces]
    assert_same_files(src, dest, pieces)
    assert set(server.requests) == {p.file for p in pieces}
    assert all(server.requests[p.file] == 1 for p in pieces)
    assert all(r == [None] for r in server.ranges.values())

    total = sum(p.size for p in pieces)
    assert not rec.overlapped
    assert all(e.all_total_bytes == total for e in rec.events)
    overall = [e.all_done_bytes for e in rec.events]
    assert overall == sorted(overall)
    assert overall[-1] == total
    assert sorted(rec.finished()) == sorted(p.name for p in pieces)
    sizes = {p.name: p.size for p in pieces}
    for name, size in sizes.items():
        own = [e for e in rec.events if e.piece == name]
        assert all(e.total_bytes == size for e in own)
        assert [e.done_bytes for e in own] == sorted(e.done_bytes for e in own)
        assert own[-1].finished and own[-1].done_bytes == size
        assert len({e.done_bytes for e in own}) > 2  # reported chunk by chunk


@pytest.mark.parametrize("parallel", [1, 4])
def test_parallel_or_serial_gives_the_same_files(
    sliced: tuple[Path, Manifest],
    server: RangeServer,
    http: requests.Session,
    tmp_path: Path,
    parallel: int,
) -> None:
    src, manifest = sliced
    pieces = manifest.pieces_for(LayerRange(5, manifest.facts.n_layer))  # embedding + head too
    rec = Recorder()
    paths = fetch(http, server, pieces, tmp_path / "dest", parallel=parallel, progress=rec)
    assert [p.name for p in paths] == [p.file for p in pieces]
    assert_same_files(src, tmp_path / "dest", pieces)
    assert sorted(rec.finished()) == sorted(p.name for p in pieces)
    assert not rec.overlapped


def test_dropped_connection_resumes_where_it_stopped(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    pieces = manifest.pieces_for(LayerRange(3, 6))
    victim = pieces[1]
    cut = 50_000  # not a multiple of the chunk size
    server.fail_after_bytes[victim.file] = cut

    fetch(http, server, pieces, tmp_path / "dest")

    assert_same_files(src, tmp_path / "dest", pieces)
    assert server.ranges[victim.file] == [None, f"bytes={cut}-"]
    assert server.sent_bytes[victim.file] == victim.size  # resumed, not restarted


def test_read_timeout_resumes(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    pieces = manifest.pieces_for(LayerRange(3, 4))
    server.stall_after_bytes[pieces[0].file] = 40_000

    fetch(http, server, pieces, tmp_path / "dest", timeout=0.5)

    assert_same_files(src, tmp_path / "dest", pieces)
    assert server.ranges[pieces[0].file][:2] == [None, "bytes=40000-"]


def test_part_left_by_an_earlier_run_is_resumed(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    pieces = manifest.pieces_for(LayerRange(3, 6))
    dest = tmp_path / "dest"
    dest.mkdir()
    p = pieces[0]
    have = 70_000
    (dest / (p.file + PART_SUFFIX)).write_bytes((src / p.file).read_bytes()[:have])
    rec = Recorder()

    fetch(http, server, pieces, dest, progress=rec)

    assert_same_files(src, dest, pieces)
    assert server.ranges[p.file] == [f"bytes={have}-"]
    assert server.sent_bytes[p.file] == p.size - have
    first = next(e for e in rec.events if e.piece == p.name)
    assert first.done_bytes == have  # what was on disk counts as done
    assert rec.events[-1].all_done_bytes == sum(q.size for q in pieces)


def test_complete_part_is_verified_after_416(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    p = manifest.piece("blk.002")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / (p.file + PART_SUFFIX)).write_bytes((src / p.file).read_bytes())

    fetch(http, server, [p], dest)

    assert_same_files(src, dest, [p])
    assert server.ranges[p.file] == [f"bytes={p.size}-"]
    assert server.sent_bytes[p.file] == 0


def test_server_ignoring_range_means_starting_over(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    p = manifest.piece("blk.002")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / (p.file + PART_SUFFIX)).write_bytes((src / p.file).read_bytes()[:30_000])
    server.ignore_range.add(p.file)

    fetch(http, server, [p], dest)

    assert_same_files(src, dest, [p])  # the 200 body replaced the part, not appended to it
    assert server.ranges[p.file] == ["bytes=30000-"]


def test_corrupt_piece_raises_and_leaves_nothing(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    _, manifest = sliced
    pieces = manifest.pieces_for(LayerRange(3, 6))
    bad = pieces[2]
    server.corrupt.add(bad.file)
    dest = tmp_path / "dest"

    with pytest.raises(PieceCorruptError) as err:
        fetch(http, server, pieces, dest)

    assert err.value.piece == bad.name
    assert bad.name in str(err.value)
    assert not (dest / bad.file).exists()
    assert not (dest / (bad.file + PART_SUFFIX)).exists()
    assert server.ranges[bad.file] == [None, None]  # one fresh retry, then give up


def test_corruption_once_is_fixed_by_a_fresh_download(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    pieces = manifest.pieces_for(LayerRange(3, 6))
    server.corrupt_once.add(pieces[0].file)

    fetch(http, server, pieces, tmp_path / "dest")

    assert_same_files(src, tmp_path / "dest", pieces)
    assert server.ranges[pieces[0].file] == [None, None]


def test_bad_part_from_an_earlier_run_is_replaced(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    p = manifest.piece("blk.001")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / (p.file + PART_SUFFIX)).write_bytes(b"\0" * 10_000)

    fetch(http, server, [p], dest)

    assert_same_files(src, dest, [p])
    assert server.ranges[p.file] == ["bytes=10000-", None]


def test_persistent_503_raises_download_error(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    _, manifest = sliced
    pieces = manifest.pieces_for(LayerRange(3, 6))
    bad = pieces[1]
    server.status_override[bad.file] = 503

    with pytest.raises(DownloadError) as err:
        fetch(http, server, pieces, tmp_path / "dest", retries=3)

    assert err.value.piece == bad.name
    assert bad.name in str(err.value) and "503" in str(err.value)
    assert server.requests[bad.file] == 3
    assert not (tmp_path / "dest" / bad.file).exists()


def test_transient_503_is_retried(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    pieces = manifest.pieces_for(LayerRange(3, 6))
    server.status_once[pieces[0].file] = 503

    fetch(http, server, pieces, tmp_path / "dest")

    assert_same_files(src, tmp_path / "dest", pieces)
    assert server.requests[pieces[0].file] == 2


def test_missing_piece_fails_without_retrying(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    ghost = PieceInfo("blk.099", "blk.099.gguf", "block", 99, "0" * 64, 10)

    with pytest.raises(DownloadError, match=r"blk\.099.*404"):
        fetch(http, server, [ghost], tmp_path / "dest")

    assert server.requests["blk.099.gguf"] == 1


def test_complete_pieces_are_not_requested_again(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    pieces = manifest.pieces_for(LayerRange(3, 6))
    dest = tmp_path / "dest"
    fetch(http, server, pieces[:2], dest)
    server.reset_counters()
    rec = Recorder()

    paths = fetch(http, server, pieces, dest, progress=rec)

    assert paths == [dest / p.file for p in pieces]
    assert_same_files(src, dest, pieces)
    assert dict(server.requests) == {pieces[2].file: 1}
    assert sorted(rec.finished()) == sorted(p.name for p in pieces)
    assert rec.events[-1].all_done_bytes == sum(p.size for p in pieces)


def test_invalid_final_file_is_downloaded_again(
    sliced: tuple[Path, Manifest], server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    src, manifest = sliced
    p = manifest.piece("blk.004")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / p.file).write_bytes(b"not a gguf")

    fetch(http, server, [p], dest)

    assert_same_files(src, dest, [p])
    assert server.requests[p.file] == 1


def test_unsafe_file_name_is_refused_before_any_request(
    server: RangeServer, http: requests.Session, tmp_path: Path
) -> None:
    evil = PieceInfo("blk.000", "../escape.gguf", "block", 0, "0" * 64, 10)
    with pytest.raises(DownloadError, match="unsafe"):
        fetch(http, server, [evil], tmp_path / "dest")
    assert not server.requests


def test_format_progress() -> None:
    mib = 1 << 20
    p = DownloadProgress("blk.007", 5, 10, 130 * mib, 250 * mib, False)
    assert format_progress(p) == "[#####.....]  52% 130/250 MiB blk.007"
    small = DownloadProgress("head", 0, 10, 0, 3 * mib // 2, False)
    assert format_progress(small) == "[..........]   0% 0.0/1.5 MiB head"
    done = DownloadProgress("head", 10, 10, 10, 10, True)
    assert format_progress(done) == "[##########] 100% 10/10 B head"
