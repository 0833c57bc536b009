"""What a piece server request gets (app/serving/piece_server.py, pure): only a name that
is exactly a piece of the offered model's manifest, and one Range interval of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.serving.piece_server import Offered, PieceFile, Refusal, answer, byte_range
from core.manifest import PieceInfo

pytestmark = pytest.mark.unit

PIECE = PieceInfo("blk.000", "blk.000.gguf", "block", 0, "0" * 64, 100)
OFFERED = Offered("tiny", Path("/cache/tiny"), (PIECE,))


def test_a_manifest_piece_of_the_offered_model_is_its_file_in_the_cache() -> None:
    assert answer("/pieces/tiny/blk.000.gguf", OFFERED) == PieceFile(
        PIECE, Path("/cache/tiny/blk.000.gguf")
    )
    assert answer("/pieces/tiny/blk%2E000.gguf?x=1", OFFERED) == PieceFile(
        PIECE, Path("/cache/tiny/blk.000.gguf")
    )


@pytest.mark.parametrize(
    "path",
    [
        "/pieces/tiny/blk.000.gguf.part",
        "/pieces/tiny/..%2Fother%2Fblk.000.gguf",
        "/pieces/tiny/../blk.000.gguf",
        "/pieces/tiny/%2E%2E",
        "/pieces/other/blk.000.gguf",
        "/pieces/tiny/manifest.json",
        "/pieces/tiny/",
        "/pieces/tiny",
        "/",
    ],
)
def test_anything_else_is_refused(path: str) -> None:
    got = answer(path, OFFERED)
    assert isinstance(got, Refusal) and got.status == 404


def test_nothing_is_served_before_anything_is_offered() -> None:
    assert isinstance(answer("/pieces/tiny/blk.000.gguf", None), Refusal)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-", (0, 100)),
        ("bytes=10-19", (10, 20)),
        ("bytes=90-500", (90, 100)),
        ("bytes=-30", (70, 100)),
        ("bytes=0-1,5-6", None),  # several intervals: the whole file, as HTTP allows
        ("items=0-1", None),
    ],
)
def test_one_range_interval(header: str | None, expected: tuple[int, int] | None) -> None:
    assert byte_range(header, 100) == expected


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=20-10", "bytes=-0"])
def test_an_unsatisfiable_range_is_416(header: str) -> None:
    got = byte_range(header, 100)
    assert isinstance(got, Refusal) and got.status == 416
