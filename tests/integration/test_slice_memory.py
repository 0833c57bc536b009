"""Slicing holds no more than a few chunks of the model in memory: a 300 MB model is cut
in a child process whose peak resident memory grows by a small fraction of the file
(through a memory map it grew by the whole file). A count, not a timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.slice import layers_for, measure_child, write_fixture

pytestmark = pytest.mark.integration

N_EMBD, N_FF, N_VOCAB = 1024, 2816, 8000


def test_peak_memory_stays_far_below_the_model_size(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    size = write_fixture(model, layers_for(300e6, N_EMBD, N_FF, N_VOCAB), N_EMBD, N_FF, N_VOCAB)
    assert size > 250e6
    run = measure_child(model, tmp_path / "pieces")
    assert run["source_size"] == size
    growth = run["peak_rss_bytes"] - run["rss_before_bytes"]
    assert growth < size / 8, f"slicing grew resident memory by {growth / 2**20:.0f} MiB"
    assert run["peak_rss_bytes"] < size / 2
    written = sum(p.stat().st_size for p in (tmp_path / "pieces").glob("*.gguf"))
    assert written > size * 0.99  # every tensor went through
