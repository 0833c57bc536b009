"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.gguf_slices import slice_model
from core.manifest import Manifest
from tests.support.range_server import RangeServer, serve_dir


@pytest.fixture
def sliced(tiny_llama: Path, tmp_path: Path) -> tuple[Path, Manifest]:
    """The tiny model sliced into tmp_path/served: its pieces and their manifest."""
    src = tmp_path / "served"
    return src, slice_model(tiny_llama, src)


@pytest.fixture
def server(sliced: tuple[Path, Manifest]) -> Iterator[RangeServer]:
    """An HTTP server with Range support over the sliced pieces."""
    with serve_dir(sliced[0]) as s:
        yield s
