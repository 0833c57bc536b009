"""The ring's wire parts: the OPEN's loop tail (after the resume fields, which it then
writes in full) and the TOKENS' `looped` flag; plain frames keep their bytes, and every
way a peer could get them wrong is a typed refusal."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from net.errors import ErrorCode, FrameError
from net.wire import Loop, Open, SamplingSpec, Tokens, _pack, decode, encode
from net.wire.layout import HEADER, U32_MAX
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

PLAIN = Open("s2", "m", WireDtype.F32, SamplingSpec(), "client", 16, 9)
LOOP = Loop("first", "10.0.0.1:7000", "last")
LOOPED = dataclasses.replace(PLAIN, loop=LOOP)
RESUME = dataclasses.replace(PLAIN, resumes="s1", resume_held=8, resume_digest=bytes(range(32)))


def _string(text: str) -> bytes:
    return struct.pack(">H", len(text)) + text.encode()


def test_a_loop_tail_follows_an_empty_resume_group_and_a_layer_slot() -> None:
    tail = _string("") + struct.pack(">II", 0, 0) + struct.pack(">I", U32_MAX)
    tail += _string("first") + _string("10.0.0.1:7000") + _string("last") + b"\x00\x01"
    assert encode(LOOPED)[HEADER.size :] == encode(PLAIN)[HEADER.size :] + tail
    assert decode(encode(LOOPED)) == LOOPED


@pytest.mark.parametrize("from_layer", [None, 0, 4])
def test_a_replay_going_round_keeps_its_resume_fields(from_layer: int | None) -> None:
    frame = dataclasses.replace(RESUME, resume_from_layer=from_layer, loop=LOOP)
    assert decode(encode(frame)) == frame


def test_the_layer_slot_value_none_stands_for_is_not_a_layer() -> None:
    with pytest.raises(FrameError) as refused:
        encode(dataclasses.replace(RESUME, resume_from_layer=U32_MAX))
    assert refused.value.code is ErrorCode.BAD_VALUE


def test_a_resume_group_without_a_session_and_without_a_loop_is_malformed() -> None:
    """One encoding per frame: an empty resume group is written only before a loop."""
    data = _pack(PLAIN) + _string("") + struct.pack(">II", 0, 0)
    _length, version, ftype = HEADER.unpack_from(data)
    data = HEADER.pack(len(data) - HEADER.size, version, ftype) + data[HEADER.size :]
    with pytest.raises(FrameError) as refused:
        decode(data)
    assert refused.value.code is ErrorCode.MALFORMED


@pytest.mark.parametrize(
    "loop",
    [
        Loop("", "10.0.0.1:7000", "last"),
        Loop("first", "10.0.0.1:7000", ""),
        Loop("same", "10.0.0.1:7000", "same"),  # a one-stage route has no ring
        Loop("first", "10.0.0.1", "last"),
        Loop("first", ":7000", "last"),
        Loop("first", "10.0.0.1:0", "last"),
        Loop("first", "10.0.0.1:70000", "last"),
        Loop("first", "10.0.0.1:x", "last"),
    ],
)
def test_bad_loops_are_refused_typed(loop: Loop) -> None:
    with pytest.raises(FrameError) as refused:
        encode(dataclasses.replace(PLAIN, loop=loop))
    assert refused.value.code is ErrorCode.BAD_VALUE


def test_a_decoded_bad_loop_is_refused_too() -> None:
    """The checks run on what arrives, not only on what we send."""
    unchecked = _pack(dataclasses.replace(PLAIN, loop=Loop("first", "10.0.0.1:0", "last")))
    with pytest.raises(FrameError) as refused:
        decode(unchecked)
    assert refused.value.code is ErrorCode.BAD_VALUE


@pytest.mark.parametrize(
    ("address", "text"), [(("10.0.0.1", 7000), "10.0.0.1:7000"), (("::1", 5), "[::1]:5")]
)
def test_addresses_round_trip_through_their_text(address: tuple[str, int], text: str) -> None:
    assert Loop.address_text(address) == text
    assert Loop("a", text, "b").address == address


def test_the_guesses_a_ring_may_guess_travel_with_the_loop() -> None:
    guessing = dataclasses.replace(PLAIN, loop=Loop("a", "h:1", "b", guesses=6, adaptive=False))
    assert decode(encode(guessing)) == guessing
    with pytest.raises(FrameError) as refused:
        encode(dataclasses.replace(PLAIN, loop=Loop("a", "h:1", "b", guesses=33)))
    assert refused.value.code is ErrorCode.BAD_VALUE


def test_the_ring_tail_of_tokens_adds_two_bytes_and_zeros_are_malformed() -> None:
    plain = Tokens("s", 3, (5,), (), 0, False, ())
    looped = dataclasses.replace(plain, looped=True)
    assert encode(looped)[HEADER.size :] == encode(plain)[HEADER.size :] + b"\x01\x00"
    guessed = dataclasses.replace(plain, tokens=(5, 6, 7), n_accepted=2, guessed=4)
    for frame in (plain, looped, guessed, dataclasses.replace(guessed, looped=True)):
        assert decode(encode(frame)) == frame
    data = bytearray(encode(looped))
    data[-2] = 0
    with pytest.raises(FrameError) as refused:
        decode(bytes(data))
    assert refused.value.code is ErrorCode.MALFORMED
    with pytest.raises(FrameError) as refused:  # more accepted than the step carried
        encode(dataclasses.replace(guessed, guessed=1))
    assert refused.value.code is ErrorCode.BAD_VALUE
