"""Shared fixtures: tiny models (session-scoped, written once) and the default model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_models import write_tiny_model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama.gguf", arch="llama")


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3.gguf", arch="qwen3")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from core.models import default_model_path

    return default_model_path()
