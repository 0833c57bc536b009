"""The last stage's logits read in place: several rows, argmax and top-k per row, no copy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.llama_engine import EngineConfig, LlamaStageEngine

pytestmark = pytest.mark.unit


def test_rows_read_in_place_equal_the_copied_logits_row_for_row(tiny_llama: Path) -> None:
    engine = LlamaStageEngine(tiny_llama, EngineConfig(n_ctx=256, n_batch=32, n_seq_max=2))
    try:
        tokens = np.array([1, 5, 17, 42, 99, 7, 300, 2], dtype=np.int32)
        outputs = np.zeros(8, dtype=np.bool_)
        outputs[[2, 5, 7]] = True  # e.g. a prompt's last row and two guessed positions
        copied = engine.decode(
            np.arange(8, dtype=np.int32), np.zeros(8, dtype=np.int32), outputs, tokens=tokens
        )
        view = engine.logits_view()
        assert view.shape == copied.shape == (3, engine.n_vocab)
        assert not view.flags.writeable  # llama.cpp's own buffer: nobody writes to it
        assert np.array_equal(view, copied)
        assert engine.argmax_rows() == [int(np.argmax(r)) for r in copied]
        ids, vals = engine.top_k_rows(5)
        for row, (i, v) in enumerate(zip(ids, vals, strict=True)):
            assert list(i) == sorted(i)
            assert set(i.tolist()) == set(np.argsort(-copied[row], kind="stable")[:5].tolist())
            assert np.array_equal(v, copied[row][i])
        # the copy outlives the next decode; the view is the next decode's
        engine.decode(
            np.array([8], dtype=np.int32),
            np.zeros(1, dtype=np.int32),
            np.ones(1, np.bool_),
            tokens=np.array([11], dtype=np.int32),
        )
        assert engine.logits_view().shape == (1, engine.n_vocab)
    finally:
        engine.close()


def test_a_hidden_state_stage_has_no_logits_to_read(tiny_llama: Path) -> None:
    engine = LlamaStageEngine(tiny_llama, EngineConfig(n_ctx=64, n_batch=8, capture_hidden=True))
    try:
        with pytest.raises(ValueError):
            engine.logits_view()
    finally:
        engine.close()
