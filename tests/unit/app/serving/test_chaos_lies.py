"""app.serving.chaos_lies: the test-only liar, and what the next stage's checks make of
each of its lies."""

from __future__ import annotations

import numpy as np
import pytest

from app.serving.chaos_lies import (
    Liar,
    LieKind,
    LieSettings,
    flip_high_bit,
    settings_from_env,
)
from app.serving.steps.row_checks import RowCheck, check_rows
from net import wire
from net.wire.tensors import WireDtype, decode_rows, encode_rows

pytestmark = pytest.mark.unit


def _step(session: str, step_id: int, rows: np.ndarray, dtype: WireDtype) -> wire.Step:
    n, width = rows.shape
    return wire.Step(session, step_id, 10, (1,) * n, encode_rows(rows, dtype), n, width, dtype)


def _rows(seed: int, n: int = 3, width: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 1.0, (n, width)).astype(np.float32)


def _sent(step: wire.Step) -> np.ndarray:
    assert step.hidden is not None
    return decode_rows(step.hidden, WireDtype(step.wire_dtype), step.n_rows, step.width)


def test_the_environment_names_the_lie_or_none() -> None:
    assert settings_from_env({}) is None
    assert settings_from_env({"SANGAMA_TEST_LIE": ""}) is None
    assert settings_from_env({"SANGAMA_TEST_LIE": "zeros"}) == LieSettings(LieKind.ZEROS)
    env = {"SANGAMA_TEST_LIE": "flip", "SANGAMA_TEST_LIE_RATE": "0.25",
           "SANGAMA_TEST_LIE_SEED": "7"}  # fmt: skip
    assert settings_from_env(env) == LieSettings(LieKind.FLIP, 0.25, 7)
    for bad in ({"SANGAMA_TEST_LIE": "truth"},
                {"SANGAMA_TEST_LIE": "noise", "SANGAMA_TEST_LIE_RATE": "2"}):  # fmt: skip
        with pytest.raises(ValueError):
            settings_from_env(bad)


@pytest.mark.parametrize("dtype", [WireDtype.F32, WireDtype.BF16])
@pytest.mark.parametrize(
    ("kind", "caught"),
    [
        (LieKind.ZEROS, {RowCheck.ZERO_ROW}),
        (LieKind.FLIP, {RowCheck.NOT_FINITE, RowCheck.NORM_CEILING}),
        (LieKind.NOISE, None),  # a plausible lie: it passes
    ],
)
def test_each_lie_and_whether_the_next_stage_catches_it(
    kind: LieKind, caught: set[RowCheck] | None, dtype: WireDtype
) -> None:
    liar = Liar(LieSettings(kind))
    rows = _rows(1)
    sent = _sent(liar.tamper(_step("a", 0, rows, dtype)))
    assert liar.lies == 1
    assert not np.array_equal(sent, decode_rows(encode_rows(rows, dtype), dtype, 3, 32))
    refused = check_rows(sent)
    if caught is None:
        assert refused is None
    else:
        assert refused is not None and refused.check in caught


def test_swap_sends_another_sessions_rows_once_there_is_one() -> None:
    liar = Liar(LieSettings(LieKind.SWAP))
    mine, theirs = _rows(1), _rows(2)
    alone = liar.tamper(_step("a", 0, mine, WireDtype.F32))
    assert np.array_equal(_sent(alone), mine) and liar.lies == 0  # no other session yet
    swapped = _sent(liar.tamper(_step("b", 0, theirs, WireDtype.F32)))
    assert np.array_equal(swapped, mine) and liar.lies == 1  # a's rows go as b's
    one_row = _sent(liar.tamper(_step("a", 1, mine[:1], WireDtype.F32)))
    assert np.array_equal(one_row, theirs[-1:])  # b's honest rows, as many as asked
    assert check_rows(swapped) is None and check_rows(one_row) is None  # plausible lies


def test_the_rate_and_seed_choose_the_same_steps_every_run() -> None:
    def lied_on(seed: int) -> list[int]:
        liar = Liar(LieSettings(LieKind.ZEROS, rate=0.3, seed=seed))
        out = []
        for i in range(40):
            if not _sent(liar.tamper(_step("a", i, _rows(i), WireDtype.F32))).any():
                out.append(i)
        return out

    first = lied_on(5)
    assert first == lied_on(5) and 4 <= len(first) <= 24
    assert lied_on(6) != first


def test_a_flip_makes_a_value_below_two_huge_or_infinite() -> None:
    rows = np.array([[0.5, -1.5, 3.0, 0.0]], dtype=np.float32)
    flip_high_bit(rows, 0)
    assert rows[0, 0] == 0.5 and rows[0, 2] == 3.0
    assert not np.isfinite(rows[0, 1])  # -1.5 had the largest magnitude below 2
