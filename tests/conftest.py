"""Shared fixtures: tiny models (session-scoped, written once) and the bundled models:
SmolLM2 135M Instruct (the default) and Gemma 3 270M (the tests written for it)."""

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
    from core.models import GEMMA3, bundled_model_path

    return bundled_model_path(GEMMA3)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from core.models import default_model_path

    return default_model_path()
