"""A replay's rows one at a time (app.serving.steps.replay_rows) on a real tiny llama.cpp stage:
the rows a replay sends in one step come out exactly as plain decoding's one-row steps
did, and a batch is split so that the other steps go through the usual path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.serving.steps.replay_rows import Result, rows_one_by_one, step_apart
from core.errors import PositionError
from core.gguf_slices import assemble_stage, slice_model
from core.stage import Stage, StepFailure, StepRequest, StepResult
from core.types import LayerRange, StageSpec

pytestmark = pytest.mark.unit

N_LAYER = 8
PROMPT = [46, 396, 89, 255, 13, 12, 429, 5]
GENERATED = [300, 17, 2, 99, 450, 7]


def _stage(model: Path, tmp: Path, layers: LayerRange) -> Stage:
    manifest = slice_model(model, tmp / "pieces")
    path = assemble_stage(manifest, tmp / "pieces", layers, tmp / f"stage{layers.start}.gguf")
    return Stage.from_file(path, StageSpec(layers, N_LAYER, n_ctx=256, n_batch=64, n_seq_max=4))


def _toks(xs: list[int]) -> np.ndarray:
    return np.asarray(xs, dtype=np.int32)


@pytest.mark.parametrize("layers", [LayerRange(0, 3), LayerRange(3, 8)])
def test_one_step_of_rows_alone_equals_plain_decoding_bit_for_bit(
    tiny_llama: Path, tmp_path: Path, layers: LayerRange
) -> None:
    stage = _stage(tiny_llama, tmp_path, layers)
    first = layers.start == 0
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((len(PROMPT) + len(GENERATED), 64)).astype(np.float32)

    def req(name: str, a: int, b: int) -> StepRequest:
        if first:
            return StepRequest(name, a, tokens=_toks([*PROMPT, *GENERATED][a:b]))
        return StepRequest(name, a, hidden=rows[a:b])

    n, m = len(PROMPT), len(PROMPT) + len(GENERATED)
    try:
        for name in ("plain", "replay", "batched"):
            stage.open(name)
            stage.step([req(name, 0, n)])
        plain = [stage.step([req("plain", p, p + 1)])[0] for p in range(n, m)]
        replay = rows_one_by_one(stage, req("replay", n, m))
        (batched,) = stage.step([req("batched", n, m)])
        assert stage.n_past("replay") == m
        assert all(isinstance(r, StepResult) for r in [*plain, replay, batched])
        if first:  # hidden rows out: every one of them, each plain decoding's
            want = np.concatenate([r.hidden for r in plain])  # type: ignore[union-attr]
            assert isinstance(replay, StepResult) and replay.hidden is not None
            assert np.array_equal(replay.hidden, want)
        else:  # logits of the final row only, plain decoding's
            last = plain[-1]
            assert isinstance(last, StepResult) and last.logits is not None
            assert isinstance(replay, StepResult) and replay.logits is not None
            assert replay.logits.shape == (1, last.logits.shape[1])
            assert np.array_equal(replay.logits, last.logits)
        # With batch-invariant kernels the rows' shapes no longer matter: one multi-row
        # decode of the same rows is bit-equal too.
        assert isinstance(batched, StepResult)
        out = batched.hidden if first else batched.logits
        assert isinstance(replay, StepResult)
        got = replay.hidden if first else replay.logits
        assert out is not None and got is not None
        assert np.array_equal(out[-1:], got[-1:])
    finally:
        stage.shutdown()


def test_a_row_that_does_not_continue_the_cache_fails_typed(
    tiny_llama: Path, tmp_path: Path
) -> None:
    stage = _stage(tiny_llama, tmp_path, LayerRange(0, 3))
    try:
        stage.open("s")
        res = rows_one_by_one(stage, StepRequest("s", 4, tokens=_toks([1, 2])))
        assert isinstance(res, StepFailure) and stage.n_past("s") == 0
    finally:
        stage.shutdown()


def _failed(session: str) -> Result:
    return StepFailure(session, PositionError(session, "a stand-in result"))


def test_step_apart_sends_the_rest_in_one_call_with_their_checks_rekeyed() -> None:
    items = ["a", "ALONE1", "b", "ALONE2", "c"]
    calls: list[tuple[list[str], dict[int, str]]] = []
    alone_calls: list[str] = []

    def rest(batch: list[str], checks: dict[int, str]) -> tuple[list[Result], dict[int, str]]:
        calls.append((batch, checks))
        return [_failed(x) for x in batch], {k: f"v{c}" for k, c in checks.items()}

    def alone(item: str) -> Result:
        alone_calls.append(item)
        return _failed(item)

    results, verdicts = step_apart(items, str.isupper, {2: "b", 4: "c"}, rest, alone)
    assert calls == [(["a", "b", "c"], {1: "b", 2: "c"})]
    assert alone_calls == ["ALONE1", "ALONE2"]
    assert [r.session for r in results] == items  # in the batch's order
    assert verdicts == {2: "vb", 4: "vc"}


def test_step_apart_with_only_rows_alone_calls_no_batch() -> None:
    def rest(batch: list[str], checks: dict[int, str]) -> tuple[list[Result], dict[int, str]]:
        raise AssertionError("nothing to batch")

    results, verdicts = step_apart(["X"], str.isupper, {}, rest, _failed)
    assert [r.session for r in results] == ["X"] and verdicts == {}
