"""The stage runtime on a real (tiny) llama.cpp model: chains, batches, rollback, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.errors import (
    ContextFullError,
    DecodeError,
    DuplicateSessionError,
    InputShapeError,
    PositionError,
    StageFullError,
    UnknownSessionError,
)
from core.gguf_slices import assemble_stage, slice_model
from core.pipeline import LocalPipeline, compare_generations
from core.stage import Stage, StepFailure, StepRequest, StepResult
from core.types import LayerRange, StageSpec
from tests.support.fakes import FakeEngine

pytestmark = pytest.mark.unit

N_LAYER = 8


def _stages(
    model: Path, tmp: Path, cuts: list[int], n_seq_max: int = 4, n_batch: int = 64
) -> list[Stage]:
    manifest = slice_model(model, tmp / "pieces")
    stages = []
    for layers in LayerRange.from_cuts(cuts):
        path = assemble_stage(manifest, tmp / "pieces", layers, tmp / f"stage{layers.start}.gguf")
        spec = StageSpec(layers, N_LAYER, n_ctx=512, n_batch=n_batch, n_seq_max=n_seq_max)
        stages.append(Stage.from_file(path, spec))
    return stages


def _whole(model: Path, n_seq_max: int = 4, n_batch: int = 64) -> Stage:
    spec = StageSpec(
        LayerRange(0, N_LAYER), N_LAYER, n_ctx=512, n_batch=n_batch, n_seq_max=n_seq_max
    )
    return Stage.from_file(model, spec)


PROMPT = [1, 5, 17, 42, 99, 7, 300, 2]


@pytest.mark.parametrize("arch_fixture", ["tiny_llama", "tiny_qwen3"])
@pytest.mark.parametrize("cuts", [[0, 3, 6, 8], [0, 1, 7, 8]])
def test_chain_equals_whole_model_exactly(
    request: pytest.FixtureRequest, tmp_path: Path, arch_fixture: str, cuts: list[int]
) -> None:
    model: Path = request.getfixturevalue(arch_fixture)
    chain = LocalPipeline(_stages(model, tmp_path, cuts))
    whole = LocalPipeline([_whole(model)])
    try:
        a = chain.generate(PROMPT, 16, chunk=3, keep_logits=True)
        b = whole.generate(PROMPT, 16, chunk=3, keep_logits=True)
    finally:
        chain.shutdown()
        whole.shutdown()
    cmp = compare_generations(a, b)
    assert cmp.identical and len(a.tokens) == 16
    assert cmp.max_abs_logit_diff == 0.0


def _drive(stages: list[Stage], reqs: list[StepRequest]) -> list[StepResult | StepFailure]:
    results: list[StepResult | StepFailure] = []
    for stage in stages:
        results = stage.step(reqs)
        reqs = [
            StepRequest(r.session, r.start, hidden=r.hidden, all_logits=q.all_logits)
            for r, q in zip(results, reqs, strict=True)
            if isinstance(r, StepResult) and r.hidden is not None
        ]
    return results


def test_one_batch_of_many_sessions_equals_the_whole_model_batched_alike(
    tiny_llama: Path, tmp_path: Path
) -> None:
    stages = _stages(tiny_llama, tmp_path, [0, 3, 6, 8])
    whole = _whole(tiny_llama)
    prompts = {"a": [1, 5, 17, 42], "b": [9, 300, 2], "c": [77, 400, 12, 13, 14]}
    try:
        for s in [*stages, whole]:
            for name in prompts:
                s.open(name)
        reqs = [StepRequest(n, 0, tokens=np.array(p, dtype=np.int32)) for n, p in prompts.items()]
        chain_out = _drive(stages, reqs)
        whole_out = whole.step(reqs)
        assert stages[0].stats.per_decode_rows == [12]  # all three sessions in one llama_decode
        for c, w in zip(chain_out, whole_out, strict=True):
            assert isinstance(c, StepResult) and isinstance(w, StepResult)
            assert c.logits is not None and w.logits is not None
            assert np.array_equal(c.logits, w.logits)
        # and the batched result picks the same next tokens as each session alone
        for name, p in prompts.items():
            solo = _whole(tiny_llama, n_seq_max=1)
            solo.open(name)
            (alone,) = solo.step([StepRequest(name, 0, tokens=np.array(p, dtype=np.int32))])
            solo.shutdown()
            together = next(r for r in chain_out if r.session == name)
            assert isinstance(alone, StepResult) and isinstance(together, StepResult)
            assert alone.logits is not None and together.logits is not None
            assert int(alone.logits[-1].argmax()) == int(together.logits[-1].argmax())
            assert np.abs(alone.logits - together.logits).max() < 1e-3
    finally:
        for s in [*stages, whole]:
            s.shutdown()


def test_rollback_equals_never_having_seen_the_rejected_positions(
    tiny_llama: Path, tmp_path: Path
) -> None:
    stages = _stages(tiny_llama, tmp_path, [0, 4, 8])
    chain = LocalPipeline(stages)
    try:
        chain.open("s")
        chain.forward("s", 0, PROMPT)
        chain.forward("s", len(PROMPT), [11, 22, 33, 44], all_logits=True)
        for s in stages:
            s.rollback("s", len(PROMPT))
        after_rollback = chain.forward("s", len(PROMPT), [123])
        chain.close("s")
        chain.open("s")
        chain.forward("s", 0, PROMPT)
        fresh = chain.forward("s", len(PROMPT), [123])
        assert np.array_equal(after_rollback, fresh)
        # keep_until on a request does the same in the same trip
        chain.forward("s", len(PROMPT) + 1, [5, 6], all_logits=True)
        (res,) = stages[0].step(
            [
                StepRequest(
                    "s",
                    len(PROMPT) + 1,
                    tokens=np.array([7], dtype=np.int32),
                    keep_until=len(PROMPT) + 1,
                )
            ]
        )
        assert isinstance(res, StepResult) and stages[0].n_past("s") == len(PROMPT) + 2
    finally:
        chain.shutdown()


def test_bad_requests_fail_alone_and_the_rest_are_served(tiny_llama: Path, tmp_path: Path) -> None:
    first, middle, _ = _stages(tiny_llama, tmp_path, [0, 3, 6, 8], n_seq_max=2)
    try:
        first.open("good")
        first.open("other")
        with pytest.raises(StageFullError):
            first.open("third")
        with pytest.raises(DuplicateSessionError):
            first.open("good")
        tok = np.array([1, 2, 3], dtype=np.int32)
        out = first.step(
            [
                StepRequest("ghost", 0, tokens=tok),
                StepRequest("good", 0, tokens=tok),
                StepRequest("other", 5, tokens=tok),
                StepRequest("other", 0, hidden=np.zeros((3, 64), dtype=np.float32)),
                StepRequest("other", 0, tokens=np.array([1, 9999], dtype=np.int32)),
                StepRequest("other", 0, tokens=np.arange(600, dtype=np.int32) % 500),
            ]
        )
        kinds = [type(r.error) if isinstance(r, StepFailure) else StepResult for r in out]
        assert kinds == [
            UnknownSessionError,
            StepResult,
            PositionError,
            InputShapeError,
            InputShapeError,
            ContextFullError,
        ]
        assert first.n_past("good") == 3 and first.n_past("other") == 0

        middle.open("m")
        bad = middle.step([StepRequest("m", 0, hidden=np.zeros((2, 65), dtype=np.float32))])
        assert isinstance(bad[0], StepFailure) and isinstance(bad[0].error, InputShapeError)
        nan = np.full((1, 64), np.nan, dtype=np.float32)
        assert isinstance(middle.step([StepRequest("m", 0, hidden=nan)])[0], StepFailure)
        ok = middle.step([StepRequest("m", 0, hidden=np.ones((2, 64), dtype=np.float32))])
        assert (
            isinstance(ok[0], StepResult)
            and ok[0].hidden is not None
            and ok[0].hidden.shape == (2, 64)
        )

        first.close("other")
        first.open("third")  # the freed slot is reusable
        with pytest.raises(UnknownSessionError):
            first.close("other")
    finally:
        first.shutdown()
        middle.shutdown()


def test_requests_longer_than_a_batch_are_split_and_match(tiny_llama: Path, tmp_path: Path) -> None:
    small = _whole(tiny_llama, n_batch=4)
    big = _whole(tiny_llama, n_batch=64)
    tok = np.array(PROMPT + PROMPT[:3], dtype=np.int32)  # 11 rows: 3 decodes of <= 4
    try:
        for s in (small, big):
            s.open("s")
        (a,) = small.step([StepRequest("s", 0, tokens=tok, all_logits=True)])
        (b,) = big.step([StepRequest("s", 0, tokens=tok, all_logits=True)])
        assert small.stats.per_decode_rows == [4, 4, 3]
        assert isinstance(a, StepResult) and isinstance(b, StepResult)
        assert a.logits is not None and b.logits is not None and a.logits.shape == (11, 512)
        assert np.argmax(a.logits, axis=1).tolist() == np.argmax(b.logits, axis=1).tolist()
    finally:
        small.shutdown()
        big.shutdown()


def test_decode_failure_leaves_sessions_as_they_were() -> None:
    engine = FakeEngine()
    stage = Stage(engine, StageSpec(LayerRange(2, 4), 8, n_ctx=64, n_batch=8, n_seq_max=2))
    stage.open("a")
    stage.open("b")
    h = np.ones((2, 4), dtype=np.float32)
    engine.fail_next_with = 1
    out = stage.step([StepRequest("a", 0, hidden=h), StepRequest("b", 0, hidden=h)])
    assert all(isinstance(r, StepFailure) and isinstance(r.error, DecodeError) for r in out)
    assert stage.n_past("a") == 0 and stage.n_past("b") == 0
    ok = stage.step([StepRequest("a", 0, hidden=h)])
    assert isinstance(ok[0], StepResult) and stage.n_past("a") == 2


def test_invalid_keep_until_is_a_position_error() -> None:
    stage = Stage(FakeEngine(), StageSpec(LayerRange(2, 4), 8, n_ctx=64, n_batch=8, n_seq_max=1))
    stage.open("a")
    h = np.ones((3, 4), dtype=np.float32)
    stage.step([StepRequest("a", 0, hidden=h)])
    (bad,) = stage.step([StepRequest("a", 5, hidden=h[:1], keep_until=5)])
    assert isinstance(bad, StepFailure) and isinstance(bad.error, PositionError)
    (good,) = stage.step([StepRequest("a", 1, hidden=h[:1], keep_until=1)])
    assert isinstance(good, StepResult) and stage.n_past("a") == 2


def test_keep_until_cuts_rejected_guesses_counts_the_undo_and_fails_typed() -> None:
    engine = FakeEngine()
    stage = Stage(engine, StageSpec(LayerRange(2, 4), 8, n_ctx=64, n_batch=8, n_seq_max=2))
    stage.open("a")
    stage.open("b")
    h = np.ones((4, 4), dtype=np.float32)
    assert all(isinstance(r, StepResult) for r in stage.step([StepRequest("a", 0, hidden=h)]))
    # Guesses at 2..3 were rejected: the next step starts at 2 and cuts there first.
    (res,) = stage.step([StepRequest("a", 2, hidden=h[:1], keep_until=2)])
    assert isinstance(res, StepResult) and stage.n_past("a") == 3
    assert engine.removed[-1] == (0, 2, -1) and stage.stats.undos == 1
    assert stage.stats.undo_ms >= 0.0
    # A cache that cannot step back is a typed failure of that session only.
    stage.step([StepRequest("b", 0, hidden=h)])
    engine.can_cut = False
    out = stage.step(
        [StepRequest("b", 1, hidden=h[:1], keep_until=1), StepRequest("a", 3, hidden=h[:1])]
    )
    assert isinstance(out[0], StepFailure) and isinstance(out[0].error, PositionError)
    assert isinstance(out[1], StepResult) and stage.n_past("a") == 4 and stage.n_past("b") == 4
