"""The request a STEP makes on its stage, and which of a batch's steps get verifiers."""

from __future__ import annotations

import numpy as np
import pytest

from app.serving.session_records import PendingStep, ServedSession
from app.serving.steps.batch import guess_checks, step_request
from core.sampling import make_rng
from core.stage import StepRequest
from core.types import SamplingParams
from net import wire
from net.errors import ErrorCode, FrameError
from net.wire.tensors import WireDtype, encode_rows

OPEN = wire.Open("s", "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 2)


def _step(**kw: object) -> wire.Step:
    fields: dict[str, object] = {
        "session": "s",
        "step_id": 1,
        "start": 4,
        "tokens": (),
        "hidden": None,
        "n_rows": 0,
        "width": 0,
        "wire_dtype": WireDtype.F32,
    }
    fields.update(kw)
    return wire.Step(**fields)  # type: ignore[arg-type]


def _hidden_step(rows: np.ndarray, **kw: object) -> wire.Step:
    n, width = rows.shape
    data = encode_rows(rows, WireDtype.F32)
    return _step(hidden=data, n_rows=n, width=width, **kw)


def test_first_stage_gets_the_tokens_and_the_cut() -> None:
    req = step_request(_step(tokens=(5, 6, 7), n_rows=3, guesses=(7,), keep_until=3), True, 8)
    assert req.session == "s" and req.start == 4
    assert req.tokens is not None and req.tokens.dtype == np.int32
    assert req.tokens.tolist() == [5, 6, 7]
    assert req.hidden is None
    assert req.all_logits  # guesses: every row's logits are wanted
    assert req.keep_until == 3


def test_later_stage_gets_the_rows_exactly() -> None:
    rows = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    req = step_request(_hidden_step(rows), False, 4)
    assert req.tokens is None and req.hidden is not None
    np.testing.assert_array_equal(req.hidden, rows)
    assert not req.all_logits and req.keep_until is None


@pytest.mark.parametrize(
    ("frame", "is_first", "width"),
    [
        (_hidden_step(np.zeros((1, 4), dtype=np.float32)), True, 4),  # rows to the first
        (_step(tokens=(1,), n_rows=1), False, 4),  # tokens to a later stage
        (_hidden_step(np.zeros((1, 4), dtype=np.float32)), False, 8),  # another width
    ],
)
def test_rows_that_do_not_fit_the_stage_are_refused(
    frame: wire.Step, is_first: bool, width: int
) -> None:
    with pytest.raises(FrameError) as err:
        step_request(frame, is_first, width)
    assert err.value.code == ErrorCode.BAD_SHAPE


def _pending(step: wire.Step) -> PendingStep:
    request = StepRequest(step.session, step.start, tokens=np.zeros(1, dtype=np.int32))
    return PendingStep(step, request, 0.0)


def test_only_steps_with_guesses_of_known_sessions_get_verifiers() -> None:
    session = ServedSession(OPEN, history=[1, 2, 3, 4, 9])
    session.params = SamplingParams()
    session.rng = make_rng(session.params)
    batch = [
        _pending(_step(tokens=(8,), n_rows=1)),  # no guesses
        _pending(_step(tokens=(8, 10, 11), n_rows=3, guesses=(10, 11), keep_until=4)),
        _pending(_step(session="gone", tokens=(8, 10), n_rows=2, guesses=(10,))),
    ]
    checks = guess_checks(batch, {"s": session})
    assert list(checks) == [1]
    n, verifier = checks[1]
    assert n == 2 and verifier.guesses == (10, 11)
    # The penalty's history: kept positions, then the step's tokens without its guesses.
    assert verifier._seen == [1, 2, 3, 4, 8]


def test_a_session_without_sampling_settings_gets_no_verifier() -> None:
    session = ServedSession(OPEN)  # not the last stage: no params, no rng
    batch = [_pending(_step(tokens=(8, 10), n_rows=2, guesses=(10,)))]
    assert guess_checks(batch, {"s": session}) == {}
