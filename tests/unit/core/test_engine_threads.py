"""Threads change how fast a stage computes, never what: results are bit-identical.

A worker may pick its thread count by measuring its step (LlamaStageEngine.set_threads);
that is only allowed if ggml's split of the work over threads leaves every float as it
was, for the last stage's logits and for a non-last stage's captured hidden state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.llama_engine import EngineConfig, LlamaStageEngine

pytestmark = pytest.mark.unit

TOKENS = np.array([1, 5, 17, 42, 99, 7, 300, 2], dtype=np.int32)


def _run(engine: LlamaStageEngine, threads: int) -> list[np.ndarray]:
    """A prompt of 8 rows, then 4 one-row decodes, at `threads`; every decode's output."""
    engine.clear()
    engine.set_threads(threads)
    n = len(TOKENS)
    outs = [
        engine.decode(
            np.arange(n, dtype=np.int32), np.zeros(n, dtype=np.int32), np.ones(n, np.bool_),
            tokens=TOKENS,
        )
    ]  # fmt: skip
    for i, tok in enumerate([11, 23, 5, 77]):
        outs.append(
            engine.decode(
                np.array([n + i], dtype=np.int32), np.zeros(1, dtype=np.int32),
                np.ones(1, np.bool_), tokens=np.array([tok], dtype=np.int32),
            )
        )  # fmt: skip
    return outs


@pytest.mark.parametrize("capture_hidden", [False, True], ids=["logits", "hidden"])
def test_one_and_several_threads_give_the_same_bits(tiny_llama: Path, capture_hidden: bool) -> None:
    config = EngineConfig(n_ctx=64, n_batch=16, n_threads=1, capture_hidden=capture_hidden)
    engine = LlamaStageEngine(tiny_llama, config)
    try:
        one = _run(engine, 1)
        for threads in (2, 3):
            many = _run(engine, threads)
            for a, b in zip(one, many, strict=True):
                assert a.shape == b.shape
                assert np.array_equal(a, b), f"{threads} threads moved the results"
        again = _run(engine, 1)  # and back: the thread count leaves no trace
        assert all(np.array_equal(a, b) for a, b in zip(one, again, strict=True))
    finally:
        engine.close()
