"""`sangama coordinator --model A --model B`: two --model naming one model are refused in
one line, before the database or the CA exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.main import main
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.unit


def test_one_model_given_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    data = tmp_path / "data"
    argv = ["coordinator", "--data", str(data), "--model", str(model), "--model", str(model)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "sangama coordinator: error: --model: two models are called 'tiny8': "
        "each --model needs its own name"
    )
    assert not (data / "coordinator.db").exists() and not (data / "ca").exists()
