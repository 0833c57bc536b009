"""Gemma 3 270M (a base model, selectable by name) cut into three stages equals the whole
model, exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.lab.local_run import build_pipeline
from core.models import stage_files
from core.pipeline import compare_generations
from core.tokenizer import Tokenizer
from core.types import LayerRange

pytestmark = pytest.mark.e2e

N_LAYER = 18


def _compare(
    gemma: Path, cuts: list[int], prompt: list[int], n_tokens: int, c_callback: bool = True
) -> None:
    ranges = LayerRange.from_cuts(cuts)
    _, paths = stage_files(gemma, ranges)
    n_ctx = 1024
    chain = build_pipeline(paths, ranges, N_LAYER, n_ctx, 64, 2, c_callback)
    whole = build_pipeline([gemma], [LayerRange(0, N_LAYER)], N_LAYER, n_ctx, 64, 2, c_callback)
    try:
        a = chain.generate(prompt, n_tokens, keep_logits=True)
        b = whole.generate(prompt, n_tokens, keep_logits=True)
    finally:
        chain.shutdown()
        whole.shutdown()
    cmp = compare_generations(a, b)
    assert len(a.tokens) == n_tokens
    assert cmp.identical, (a.tokens, b.tokens)
    assert cmp.max_abs_logit_diff == 0.0


@pytest.fixture(scope="module")
def tokenizer(gemma_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(gemma_path)


@pytest.mark.parametrize("cuts", [[0, 6, 12, 18], [0, 5, 11, 18], [0, 1, 17, 18]])
def test_three_stages_equal_the_whole_model_for_32_greedy_tokens(
    gemma_path: Path, tokenizer: Tokenizer, cuts: list[int]
) -> None:
    _compare(gemma_path, cuts, tokenizer.encode("The capital of France is"), 32)


def test_python_capture_callback_is_exact_too(gemma_path: Path, tokenizer: Tokenizer) -> None:
    _compare(gemma_path, [0, 5, 11, 18], tokenizer.encode("def fibonacci(n):"), 8, c_callback=False)


def test_prompt_longer_than_the_sliding_window(gemma_path: Path, tokenizer: Tokenizer) -> None:
    text = " ".join(
        f"Item {i}: the quick brown fox number {i} jumps over the lazy dog." for i in range(60)
    )
    prompt = tokenizer.encode(text)[:700]
    assert len(prompt) == 700  # > Gemma's 512-position window: sliding layers must mask
    _compare(gemma_path, [0, 5, 11, 18], prompt, 16)
