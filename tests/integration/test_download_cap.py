"""The download cap on real piece downloads from a real HTTP server: the throttle is
charged every byte received, and a caller that waits as told is held to the cap.

Time is the throttle's own clock, advanced only by its sleeps, so the test asserts the
exact wait the cap implies from byte counts; nothing is timed."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from coordinator.client.downloads import download_pieces
from core.gguf_slices import slice_model
from core.manifest import verify_piece
from net.rate import Throttle, bucket_for
from tests.support.range_server import serve_dir

pytestmark = pytest.mark.integration

RATE = 200_000  # bytes per second


def test_a_capped_download_waits_exactly_what_its_bytes_cost(
    tiny_llama: Path, tmp_path: Path
) -> None:
    manifest = slice_model(tiny_llama, tmp_path / "served")
    pieces = manifest.pieces
    clock = [0.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds

    throttle = Throttle(RATE, clock=lambda: clock[0], sleep=sleep)
    with serve_dir(tmp_path / "served") as server, requests.Session() as http:
        download_pieces(
            http, server.url, pieces, tmp_path / "dest", parallel=1, chunk_bytes=16 << 10,
            throttle=throttle,
        )  # fmt: skip
    for p in pieces:
        verify_piece(tmp_path / "dest", p)
    total = sum(p.size for p in pieces)
    burst = bucket_for(RATE).burst
    assert total > burst  # the cap must have bitten
    # Only sleeping moves this clock, so the bytes took exactly (total - burst) / rate.
    assert clock[0] == pytest.approx((total - burst) / RATE)
    assert total / clock[0] > RATE  # the burst on top, never more
    assert len(sleeps) > 1 and throttle.waited_s == pytest.approx(clock[0])
