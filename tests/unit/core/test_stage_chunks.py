"""A session's prompt chunks each get a decode of their own, however many of them one
engine step takes (core.stage): a chunk's rows then have the same shapes whenever they
come, which a replay repeats exactly (app.session.replay_shapes). Other sessions still share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.stage import Stage, StepRequest, StepResult
from core.types import LayerRange, StageSpec

pytestmark = pytest.mark.unit

PROMPT = [46, 396, 89, 255, 13, 12, 429, 5, 77, 400]


def test_two_chunks_of_one_session_never_share_a_decode(tiny_llama: Path) -> None:
    spec = StageSpec(LayerRange(0, 8), 8, n_ctx=256, n_batch=64, n_seq_max=5)
    stage = Stage.from_file(tiny_llama, spec)
    toks = np.asarray(PROMPT, dtype=np.int32)
    try:
        for name in ("a", "b", "apart", "c"):
            stage.open(name)
        together = stage.step(
            [
                StepRequest("a", 0, tokens=toks[:6]),
                StepRequest("b", 0, tokens=toks[:3]),
                StepRequest("a", 6, tokens=toks[6:]),
            ]
        )
        # a's first chunk with b's, a's second in a decode of its own
        assert stage.stats.per_decode_rows == [9, 4]
        # The same rows in separate steps, shaped as above: the same numbers.
        stage.step([StepRequest("apart", 0, tokens=toks[:6]), StepRequest("c", 0, tokens=toks[:3])])
        (alone,) = stage.step([StepRequest("apart", 6, tokens=toks[6:])])
        second = together[2]
        assert isinstance(second, StepResult) and isinstance(alone, StepResult)
        assert second.logits is not None and alone.logits is not None
        assert np.array_equal(second.logits, alone.logits)  # the chunk's own shape
    finally:
        stage.shutdown()


def test_a_new_session_takes_the_lowest_free_slot(tiny_llama: Path) -> None:
    # Live sessions keep to the lowest slots, so those stepping together tend to be
    # consecutive: llama.cpp computes a run of consecutive slots in one micro-batch.
    spec = StageSpec(LayerRange(0, 8), 8, n_ctx=64 * 6, n_batch=64, n_seq_max=6)
    stage = Stage.from_file(tiny_llama, spec)
    try:
        for name in "abcde":
            stage.open(name)
        stage.close("b")
        stage.close("d")
        stage.open("f")
        stage.open("g")
        slots = {name: s.slot for name, s in stage._sessions.items()}
        assert slots == {"a": 0, "c": 2, "e": 4, "f": 1, "g": 3}
    finally:
        stage.shutdown()
