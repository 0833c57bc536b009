"""The OPEN's optional resume tail (a replay after a reroute names the session it
continues): plain OPENs keep their bytes, the tail round-trips, and every field a peer
could get wrong is a typed refusal."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from net.errors import ErrorCode, FrameError
from net.wire import Open, SamplingSpec, decode, encode
from net.wire.layout import HEADER
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

PLAIN = Open("s2", "m", WireDtype.F32, SamplingSpec(), "client", 16, 9)
RESUME = dataclasses.replace(PLAIN, resumes="s1", resume_held=8, resume_digest=bytes(range(32)))


def test_a_plain_open_has_no_tail_and_a_resume_open_adds_exactly_it() -> None:
    plain, resumed = encode(PLAIN), encode(RESUME)
    tail = struct.pack(">H", 2) + b"s1" + struct.pack(">II", 8, 32) + bytes(range(32))
    assert resumed[HEADER.size :] == plain[HEADER.size :] + tail
    decoded = decode(plain)
    assert decoded == PLAIN and isinstance(decoded, Open) and decoded.resumes == ""
    assert decode(resumed) == RESUME


def test_the_first_layer_to_adopt_is_a_second_optional_tail() -> None:
    """Absent (a client before the field): the last stage alone may adopt, and the bytes
    are those of the first tail; present: four more bytes, read back as sent."""
    assert decode(encode(RESUME)) == RESUME and RESUME.resume_from_layer is None
    layered = dataclasses.replace(RESUME, resume_from_layer=4)
    assert encode(layered) == _with_length(encode(RESUME) + struct.pack(">I", 4))
    assert decode(encode(layered)) == layered
    with pytest.raises(FrameError) as refused:  # only a replay names a layer to adopt from
        encode(dataclasses.replace(PLAIN, resume_from_layer=4))
    assert refused.value.code is ErrorCode.BAD_VALUE


def _with_length(frame: bytes) -> bytes:
    """`frame` with its header's body length fixed after bytes were appended."""
    _length, version, ftype = HEADER.unpack_from(frame)
    return HEADER.pack(len(frame) - HEADER.size, version, ftype) + frame[HEADER.size :]


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"resumes": "s2"}, ErrorCode.BAD_VALUE),  # itself
        ({"resume_held": 0}, ErrorCode.BAD_POSITIONS),
        ({"resume_held": 9}, ErrorCode.BAD_POSITIONS),  # the final row must be computed
        ({"resume_digest": bytes(31)}, ErrorCode.BAD_VALUE),
        ({"resume_digest": b""}, ErrorCode.BAD_VALUE),
        ({"resumes": "", "resume_held": 3, "resume_digest": b""}, ErrorCode.BAD_VALUE),
        ({"resumes": "", "resume_held": 0}, ErrorCode.BAD_VALUE),  # a digest alone
    ],
)
def test_bad_resume_fields_are_refused_typed(changes: dict[str, object], code: ErrorCode) -> None:
    bad = dataclasses.replace(RESUME, **changes)  # type: ignore[arg-type]
    with pytest.raises(FrameError) as refused:
        encode(bad)
    assert refused.value.code is code


def test_a_decoded_bad_tail_is_refused_too() -> None:
    """The checks run on what arrives, not only on what we send."""
    data = bytearray(encode(RESUME))
    at = len(data) - 32 - 8  # resume_held
    data[at : at + 4] = struct.pack(">I", 9)
    with pytest.raises(FrameError) as refused:
        decode(bytes(data))
    assert refused.value.code is ErrorCode.BAD_POSITIONS
