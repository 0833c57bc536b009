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
