"""The STEP's optional one_by_one tail (a replay's rows, each evaluated as first
computed): plain STEPs keep their bytes, the tail round-trips, and a tail a peer could
get wrong is a typed refusal."""

from __future__ import annotations

import dataclasses

import pytest

from net.errors import ErrorCode, FrameError
from net.wire import Step, _pack, decode, encode
from net.wire.layout import HEADER
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

PLAIN = Step("s", 3, 12, (5, 6, 7), None, 3, 0, WireDtype.F32, sent_at_ns=9)
ALONE = dataclasses.replace(PLAIN, one_by_one=True)


def test_a_plain_step_has_no_tail_and_one_by_one_adds_one_byte() -> None:
    plain, alone = encode(PLAIN), encode(ALONE)
    assert alone[HEADER.size :] == plain[HEADER.size :] + b"\x01"
    assert decode(plain) == PLAIN
    decoded = decode(alone)
    assert isinstance(decoded, Step) and decoded.one_by_one and decoded == ALONE


def test_hidden_rows_one_by_one_round_trip() -> None:
    rows = Step("s", 0, 4, (1, 2), bytes(2 * 3 * 2), 2, 3, WireDtype.BF16, one_by_one=True)
    assert decode(encode(rows)) == rows


def _with_tail(tail: bytes) -> bytes:
    """PLAIN's bytes with `tail` appended and the header's length fixed up."""
    body = encode(PLAIN)[HEADER.size :] + tail
    _, version, ftype = HEADER.unpack_from(encode(PLAIN))
    return HEADER.pack(len(body), version, ftype) + body


@pytest.mark.parametrize(
    ("tail", "code"),
    [
        (b"\x00", ErrorCode.MALFORMED),  # false is written as no tail: one encoding
        (b"\x02", ErrorCode.MALFORMED),  # not a flag
        (b"\x01\x00", ErrorCode.MALFORMED),  # trailing bytes after it
    ],
)
def test_a_bad_tail_is_refused_typed(tail: bytes, code: ErrorCode) -> None:
    with pytest.raises(FrameError) as refused:
        decode(_with_tail(tail))
    assert refused.value.code is code
    assert decode(_with_tail(b"\x01")) == ALONE  # the same frame with the right tail


def test_one_by_one_with_guesses_is_refused_both_ways() -> None:
    bad = dataclasses.replace(ALONE, guesses=(6, 7))
    with pytest.raises(FrameError) as refused:
        encode(bad)
    assert refused.value.code is ErrorCode.BAD_SHAPE
    with pytest.raises(FrameError) as refused:
        decode(_pack(bad))
    assert refused.value.code is ErrorCode.BAD_SHAPE
