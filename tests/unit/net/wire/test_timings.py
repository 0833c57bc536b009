"""Timings in STEP and TOKENS frames: packed as one block, checked in one pass, and the
bad one still named (the block layout is net.wire.layout's: a u32 count, then
`>Iddd` per stage)."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from net.errors import ErrorCode, FrameError
from net.wire import StageTiming, Step, Tokens, decode, encode
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

TIMINGS = tuple(StageTiming(k, 1.0 + k, 0.25 * k, 3.5) for k in range(19))
STEP = Step("s", 1, 10, (1,), None, 1, 0, WireDtype.F32, (), None, TIMINGS, 5)


def test_nineteen_timings_sit_in_the_frame_as_the_per_stage_layout_and_come_back() -> None:
    data = encode(STEP)
    block = struct.pack(">I", 19) + b"".join(
        struct.pack(">Iddd", t.stage, t.compute_ms, t.queue_ms, t.recv_to_send_ms) for t in TIMINGS
    )
    assert block in data
    assert decode(data) == STEP
    tokens = Tokens("s", 1, (4,), (), 0, False, TIMINGS)
    assert decode(encode(tokens)) == tokens


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (StageTiming(7, float("nan"), 0.0, 0.0), "stage 7 timing nan ms"),
        (StageTiming(8, 0.0, float("inf"), 0.0), "stage 8 timing inf ms"),
        (StageTiming(9, 0.0, 0.0, -0.5), "stage 9 timing -0.5 ms"),
        (StageTiming(1 << 32, 0.0, 0.0, 0.0), "timing stage=4294967296 outside"),
    ],
)
def test_one_bad_timing_among_many_is_refused_by_name(bad: StageTiming, message: str) -> None:
    frame = dataclasses.replace(STEP, timings=(*TIMINGS[:5], bad, *TIMINGS[5:10]))
    with pytest.raises(FrameError) as err:
        encode(frame)
    assert err.value.code == ErrorCode.BAD_VALUE
    assert message in err.value.message
