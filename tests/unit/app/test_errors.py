"""app.errors: a stage's refusal keeps the wire's code as an enum, not only its name."""

from __future__ import annotations

import pickle

import pytest

from app.errors import ClientError, StageFailed
from net.errors import ErrorCode

pytestmark = pytest.mark.unit


def test_stage_failed_carries_the_wire_code() -> None:
    err = StageFailed(ErrorCode.STAGE_ERROR, "next hop lost")
    assert isinstance(err, ClientError)
    assert err.error_code is ErrorCode.STAGE_ERROR
    assert err.code == "STAGE_ERROR"
    assert err.message == "next hop lost"
    assert str(err) == "STAGE_ERROR: next hop lost"


def test_stage_failed_survives_pickling() -> None:
    err = pickle.loads(pickle.dumps(StageFailed(ErrorCode.OVERLOADED, "busy")))
    assert err.error_code is ErrorCode.OVERLOADED and err.message == "busy"


def test_an_overloaded_error_frame_becomes_a_typed_overloaded_with_its_hint() -> None:
    import pickle

    from app.errors import Overloaded, StageFailed, stage_error
    from net.errors import ErrorCode as Code
    from net.protocol import OverloadHint, overloaded

    frame = overloaded("s", "KV memory full", OverloadHint(750, True))
    err = stage_error(frame.code, frame.message)
    assert isinstance(err, Overloaded) and isinstance(err, StageFailed)
    assert (err.retry_after_ms, err.try_another_route, err.message) == (750, True, "KV memory full")
    assert err.code == "OVERLOADED"
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, Overloaded) and again.retry_after_ms == 750
    plain = stage_error(Code.STAGE_ERROR, "boom")
    assert type(plain) is StageFailed and plain.message == "boom"
