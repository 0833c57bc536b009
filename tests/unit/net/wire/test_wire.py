"""net.wire: round trips, fuzzing, stream splitting, and one refusal test per rule."""

from __future__ import annotations

import contextlib
import dataclasses
import struct
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from net.errors import ErrorCode, FrameError
from net.wire import (
    HEADER,
    MAX_NONCE,
    MIN_NONCE,
    POS_MAX,
    TOKEN_MAX,
    U32_MAX,
    U64_MAX,
    Challenge,
    Close,
    Error,
    Frame,
    FrameDecoder,
    Hello,
    Limits,
    Loop,
    Open,
    Ping,
    Pong,
    Proof,
    SamplingSpec,
    StageTiming,
    Step,
    Tokens,
    Welcome,
    _pack,
    decode,
    encode,
    truncate_utf8,
)
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies: valid frames of every type ---------------------------------------------

names = st.text(min_size=1, max_size=12)
texts = st.text(max_size=12)
u32s = st.integers(0, U32_MAX)
u64s = st.integers(0, U64_MAX)
token_ids = st.integers(0, TOKEN_MAX)
millis = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
timings = st.lists(st.builds(StageTiming, u32s, millis, millis, millis), max_size=3).map(tuple)
samplings = st.builds(
    SamplingSpec,
    temperature=st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
    top_k=u32s,
    top_p=st.floats(0.0, 1.0, exclude_min=True),
    min_p=st.floats(0.0, 1.0, exclude_max=True),
    repetition_penalty=st.floats(min_value=0.0, exclude_min=True, allow_infinity=False),
    repetition_window=u32s,
    seed=u64s,
)


def token_tuples(size: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(token_ids, min_size=size, max_size=size).map(tuple)


@st.composite
def steps(draw: st.DrawFn) -> Step:
    dtype = draw(st.sampled_from(WireDtype))
    n_rows = draw(st.integers(1, 5))
    hidden: bytes | None = None
    width = 0
    if draw(st.booleans()):  # hidden rows, with or without their tokens
        width = draw(st.integers(1, 6))
        size = n_rows * width * dtype.itemsize
        hidden = draw(st.binary(min_size=size, max_size=size))
        tokens = draw(st.just(()) | token_tuples(n_rows))
    else:
        tokens = draw(token_tuples(n_rows))
    guesses = draw(st.lists(token_ids, max_size=n_rows - 1).map(tuple))
    start = draw(st.integers(0, POS_MAX - n_rows))
    keep_until = draw(st.none() | st.integers(0, start))
    one_by_one = not guesses and draw(st.booleans())  # a replay's rows: no guesses with it
    return Step(draw(names), draw(u64s), start, tokens, hidden, n_rows, width, dtype, guesses,
                keep_until, draw(timings), draw(u64s), one_by_one)  # fmt: skip


@st.composite
def loop_tails(draw: st.DrawFn) -> Loop:
    """The ring's tail: two distinct stages, the first one's host:port."""
    first, last = draw(names), draw(names)
    assume(first != last)
    host = draw(st.sampled_from(["127.0.0.1", "stage0.example", "[::1]"]))
    return Loop(first, f"{host}:{draw(st.integers(1, 65535))}", last)


loops = loop_tails()


@st.composite
def resume_opens(draw: st.DrawFn) -> Open:
    """An OPEN with the optional resume tail (a replay after a reroute), with or without
    its own optional first layer allowed to adopt."""
    session, resumes = draw(names), draw(names)
    assume(session != resumes)
    prompt_len = draw(st.integers(2, 0xFFFF_FFFF))
    held = draw(st.integers(1, prompt_len - 1))
    return Open(session, draw(names), draw(st.sampled_from(WireDtype)), draw(samplings),
                draw(texts), draw(u32s), prompt_len, resumes, held,
                draw(st.binary(min_size=32, max_size=32)),
                draw(st.none() | st.integers(0, U32_MAX - 1)), draw(st.none() | loops))  # fmt: skip


frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(Open, names, names, st.sampled_from(WireDtype), samplings, texts, u32s, u32s),
    st.builds(
        Open, names, names, st.sampled_from(WireDtype), samplings, texts, u32s, u32s, loop=loops
    ),
    resume_opens(),
    steps(),
    st.builds(
        Tokens,
        names,
        u64s,
        st.lists(token_ids, max_size=6).map(tuple),
        st.lists(token_ids, max_size=6).map(tuple),
        st.integers(0, 64),
        st.booleans(),
        timings,
        st.binary(max_size=16),
        st.booleans(),
    ),
    st.builds(Close, names, texts),
    st.builds(Error, texts, st.sampled_from(ErrorCode), texts),
    st.builds(Ping, u64s),
    st.builds(Pong, u64s),
    st.just(Hello()),
    st.builds(Challenge, st.binary(min_size=MIN_NONCE, max_size=MAX_NONCE)),
    st.builds(Proof, st.binary(min_size=1, max_size=64)),
    st.builds(Welcome, names),
)


def refused(code: ErrorCode) -> Any:
    return pytest.raises(FrameError, match=f"^{code.name}: ")


# --- round trips and fuzzing ------------------------------------------------------------


@given(frames)
@FUZZ
def test_decode_inverts_encode(frame: Frame) -> None:
    data = encode(frame)
    assert decode(data) == frame
    assert FrameDecoder().feed(data) == [frame]


@given(st.binary(max_size=200))
@FUZZ
def test_arbitrary_bytes_raise_only_frame_errors(data: bytes) -> None:
    try:
        frame = decode(data)
    except FrameError:
        pass
    else:
        assert encode(frame) == data  # whatever decodes is valid and encoded canonically
    with contextlib.suppress(FrameError):
        FrameDecoder().feed(data)


@given(frames, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4))
@FUZZ
def test_mutated_frames_raise_only_frame_errors(frame: Frame, edits: list[tuple[int, int]]) -> None:
    # Random bytes rarely get past the header; mutating real frames reaches the body parsers.
    data = bytearray(encode(frame))
    for where, value in edits:
        data[where % len(data)] = value
    try:
        decoded = decode(bytes(data))
    except FrameError:
        return
    assert encode(decoded) == bytes(data)


@given(st.lists(frames, min_size=1, max_size=6), st.lists(st.integers(0, 10_000), max_size=12))
@FUZZ
def test_any_split_of_a_stream_gives_the_same_frames(batch: list[Frame], cuts: list[int]) -> None:
    stream = b"".join(encode(f) for f in batch)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    decoder = FrameDecoder()
    got: list[Frame] = []
    for a, b in zip([0, *points], [*points, len(stream)], strict=True):
        got += decoder.feed(stream[a:b])
    assert got == batch
    assert decoder.buffered == 0
    decoder.end_of_stream()


def test_byte_by_byte_feeding_matches() -> None:
    batch: list[Frame] = [Ping(1), Close("s", "done"), Pong(2)]
    decoder = FrameDecoder()
    stream = b"".join(encode(f) for f in batch)
    got = [f for byte in stream for f in decoder.feed(bytes([byte]))]
    assert got == batch


# --- the layout, pinned -----------------------------------------------------------------


def test_layout_of_a_ping_and_a_close() -> None:
    assert encode(Ping(258)) == b"\x00\x00\x00\x08\x01\x06" + (258).to_bytes(8, "big")
    assert encode(Close("s", "é")) == b"\x00\x00\x00\x07\x01\x04\x00\x01s\x00\x02\xc3\xa9"


def test_layout_of_a_step() -> None:
    step = Step("s", 7, 3, (1, 256), b"\xaa" * 8, 2, 2, WireDtype.BF16, (256,), 3,
                (StageTiming(0, 1.5, 0.0, 2.0),), 99)  # fmt: skip
    body = (
        b"\x00\x01s" + struct.pack(">QIBII", 7, 3, 2, 2, 2)
        + struct.pack(">I", 2) + struct.pack("<2i", 1, 256)
        + b"\x01" + struct.pack(">I", 8) + b"\xaa" * 8
        + struct.pack(">I", 1) + struct.pack("<i", 256)
        + b"\x01" + struct.pack(">I", 3)
        + struct.pack(">IIddd", 1, 0, 1.5, 0.0, 2.0)
        + struct.pack(">Q", 99)
    )  # fmt: skip
    assert encode(step) == HEADER.pack(len(body), 1, 2) + body


# --- header and framing rules -----------------------------------------------------------

SMALL = Limits(max_frame_bytes=4096, max_rows=16, max_width=16, max_tokens_per_frame=8,
               max_guesses=3, max_string=10, max_timings=2, max_proof_bytes=100)  # fmt: skip


def test_a_huge_length_prefix_is_refused_before_any_body_arrives() -> None:
    decoder = FrameDecoder()
    with refused(ErrorCode.TOO_LARGE):
        decoder.feed(b"\xff\xff\xff\xff")  # just the prefix: nothing else is waited for
    assert decoder.buffered == 0
    with refused(ErrorCode.TOO_LARGE):
        decode(b"\xff\xff\xff\xff\x01\x06")


def test_the_frame_cap_counts_the_header() -> None:
    limits = Limits(max_frame_bytes=14)
    assert FrameDecoder(limits).feed(encode(Ping(1), limits)) == [Ping(1)]  # 6 + 8: at the cap
    with refused(ErrorCode.TOO_LARGE):
        FrameDecoder(Limits(max_frame_bytes=13)).feed(struct.pack(">I", 8))
    with refused(ErrorCode.TOO_LARGE):
        encode(Ping(1), Limits(max_frame_bytes=13))
    with refused(ErrorCode.TOO_LARGE):
        decode(encode(Ping(1)), Limits(max_frame_bytes=13))


def test_encode_refuses_a_frame_over_the_cap() -> None:
    step = Step("s", 0, 0, (), bytes(16 * 16 * 4), 16, 16, WireDtype.F32)
    encode(step, dataclasses.replace(SMALL, max_frame_bytes=2048))
    with refused(ErrorCode.TOO_LARGE):
        encode(step, dataclasses.replace(SMALL, max_frame_bytes=1024))


@pytest.mark.parametrize("version", [0, 2, 255])
def test_other_versions_are_refused(version: int) -> None:
    data = bytearray(encode(Ping(1)))
    data[4] = version
    with refused(ErrorCode.UNSUPPORTED_VERSION):
        decode(bytes(data))
    with refused(ErrorCode.UNSUPPORTED_VERSION):
        FrameDecoder().feed(bytes(data[:6]))  # refused before the body arrives


@pytest.mark.parametrize("ftype", [0, 12, 255])
def test_unknown_frame_types_are_malformed(ftype: int) -> None:
    data = bytearray(encode(Ping(1)))
    data[5] = ftype
    with refused(ErrorCode.MALFORMED):
        decode(bytes(data))
    with refused(ErrorCode.MALFORMED):
        FrameDecoder().feed(bytes(data[:6]))


def with_body(data: bytes, body: bytes) -> bytes:
    return HEADER.pack(len(body), data[4], data[5]) + body


SAMPLES: list[Frame] = [
    Open("s", "m", WireDtype.BF16, SamplingSpec(), "client", 16, 4),
    Open("s", "m", WireDtype.BF16, SamplingSpec(), "client", 16, 4, "old", 3, bytes(32)),
    Step("s", 1, 0, (5,), None, 1, 0, WireDtype.F32),
    Tokens("s", 1, (5,), (), 0, False, ()),
    Close("s", "bye"),
    Error("", ErrorCode.OVERLOADED, "busy"),
    Ping(1),
    Pong(2),
    Hello(),
    Challenge(bytes(32)),
    Proof(b"cert+signature"),
    Welcome("node-1"),
]


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: type(f).__name__)
def test_trailing_and_missing_body_bytes_are_malformed(frame: Frame) -> None:
    data = encode(frame)
    bodies = [data[6:] + b"\x00", data[6:-1]] if len(data) > 6 else [b"\x00"]
    for body in bodies:
        with refused(ErrorCode.MALFORMED):
            decode(with_body(data, body))
        with refused(ErrorCode.MALFORMED):
            FrameDecoder().feed(with_body(data, body))


def test_decode_wants_exactly_one_frame() -> None:
    data = encode(Ping(1))
    for bad in (data + b"\x00", data + data, data[:-1], data[:5], b""):
        with refused(ErrorCode.MALFORMED):
            decode(bad)
    for wrong_length in (7, 9):  # a whole, valid body under a length prefix that lies
        with refused(ErrorCode.MALFORMED):
            decode(HEADER.pack(wrong_length, 1, 6) + data[6:])


def test_strings_must_be_utf8() -> None:
    data = encode(Close("s", "ab"))
    with refused(ErrorCode.MALFORMED):
        decode(data.replace(b"ab", b"\xff\xfe"))


def test_flags_must_be_zero_or_one() -> None:
    done, running = (
        encode(Tokens("s", 1, (), (), 0, True, ())),
        encode(Tokens("s", 1, (), (), 0, False, ())),
    )
    (where,) = [i for i in range(len(done)) if done[i] != running[i]]
    with refused(ErrorCode.MALFORMED):
        decode(done[:where] + b"\x02" + done[where + 1 :])


def test_a_failed_decoder_stays_failed() -> None:
    decoder = FrameDecoder()
    with refused(ErrorCode.UNSUPPORTED_VERSION):
        decoder.feed(b"\x00\x00\x00\x08\x09\x06")
    for _ in range(2):
        with refused(ErrorCode.UNSUPPORTED_VERSION):
            decoder.feed(encode(Ping(1)))
    with refused(ErrorCode.UNSUPPORTED_VERSION):
        decoder.end_of_stream()


def test_a_bad_body_fails_the_stream_and_drops_the_frames_before_it() -> None:
    bad_close = encode(Close("s", "ab")).replace(b"ab", b"\xff\xfe")
    decoder = FrameDecoder()
    assert decoder.feed(encode(Ping(1))[:3]) == []
    with refused(ErrorCode.MALFORMED):
        decoder.feed(encode(Ping(1))[3:] + encode(Pong(2)) + bad_close + encode(Ping(3)))
    with refused(ErrorCode.MALFORMED):  # a FrameError again, not a buffer error
        decoder.feed(encode(Ping(4)))


def test_a_stream_cut_inside_a_frame_is_malformed_at_its_end() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode(Ping(1)) + encode(Ping(2))[:9]) == [Ping(1)]
    with refused(ErrorCode.MALFORMED):
        decoder.end_of_stream()


# --- one test per validation rule: encode refuses, and so does decode where bytes can say it

STEP = Step("s", 1, 10, (1, 2, 3), None, 3, 0, WireDtype.F32, (2, 3), 10,
            (StageTiming(0, 1.0, 0.5, 2.0),), 5)  # fmt: skip
HIDDEN = Step("s", 1, 10, (), bytes(2 * 4 * 2), 2, 4, WireDtype.BF16, (7,), None, (), 0)
OPEN = Open("s", "m", WireDtype.F32, SamplingSpec(), "me", 100, 10)
TOKENS = Tokens("s", 1, (4,), (5,), 1, False, (StageTiming(1, 1.0, 1.0, 1.0),))
NAN, INF = float("nan"), float("inf")


def step(**changes: Any) -> Step:
    return dataclasses.replace(STEP, **changes)


def hidden(**changes: Any) -> Step:
    return dataclasses.replace(HIDDEN, **changes)


def sampling(**changes: Any) -> Open:
    return dataclasses.replace(OPEN, sampling=dataclasses.replace(OPEN.sampling, **changes))


def timing(**changes: Any) -> Step:
    return step(timings=(dataclasses.replace(STEP.timings[0], **changes),))


BAD_DTYPE = cast(WireDtype, 9)
T, V, S, P = ErrorCode.TOO_LARGE, ErrorCode.BAD_VALUE, ErrorCode.BAD_SHAPE, ErrorCode.BAD_POSITIONS
D = ErrorCode.BAD_DTYPE

# (frame, code, whether the wire can carry it: u32/u64/i32 fields cannot hold some values)
RULES: dict[str, tuple[Frame, ErrorCode, bool]] = {
    "empty session": (step(session=""), V, True),
    "long session": (step(session="s" * 11), T, True),
    "string cap counts bytes": (Close("s", "é" * 6), T, True),
    "lone surrogate": (Close("s", "\ud800"), ErrorCode.MALFORMED, False),
    "negative step_id": (step(step_id=-1), V, False),
    "huge step_id": (step(step_id=U64_MAX + 1), V, False),
    "unknown dtype": (step(wire_dtype=BAD_DTYPE), D, True),
    "too many tokens": (step(tokens=(1,) * 9, n_rows=9, guesses=()), T, True),
    "negative token": (step(tokens=(1, -2, 3)), V, True),
    "token past int32": (step(tokens=(1, TOKEN_MAX + 1, 3)), V, False),
    "too many guesses": (step(tokens=(1,) * 5, n_rows=5, guesses=(1,) * 4), T, True),
    "negative guess": (step(guesses=(-1,)), V, True),
    "guesses fill every row": (step(guesses=(1, 2, 3)), S, True),
    "no rows": (hidden(n_rows=0, hidden=b"", guesses=()), S, True),
    "too many rows": (hidden(n_rows=17, width=1, hidden=bytes(34), guesses=()), T, True),
    "too wide": (hidden(n_rows=1, width=17, hidden=bytes(34), guesses=()), T, True),
    "hidden with width 0": (hidden(n_rows=1, width=0, hidden=b"", guesses=()), S, True),
    "token rows with a width": (step(width=4), S, True),
    "token count != token rows": (step(tokens=(1, 2), guesses=()), S, True),
    "hidden bytes short": (hidden(hidden=bytes(15)), S, True),
    "hidden bytes of another dtype": (hidden(wire_dtype=WireDtype.F32), S, True),
    "tokens beside hidden miscounted": (hidden(tokens=(1,)), S, True),
    "negative start": (step(start=-1, keep_until=None), P, False),
    "start overflows int32": (step(start=POS_MAX - 2, keep_until=None), P, True),
    "keep_until ahead of start": (step(keep_until=11), P, True),
    "negative keep_until": (step(keep_until=-1), P, False),
    "too many timings": (step(timings=STEP.timings * 3), T, True),
    "NaN timing": (timing(compute_ms=NAN), V, True),
    "infinite timing": (timing(queue_ms=INF), V, True),
    "negative timing": (timing(recv_to_send_ms=-0.5), V, True),
    "negative timing stage": (timing(stage=-1), V, False),
    "negative sent_at_ns": (step(sent_at_ns=-1), V, False),
    "open: empty session": (dataclasses.replace(OPEN, session=""), V, True),
    "open: empty model": (dataclasses.replace(OPEN, model=""), V, True),
    "open: long model": (dataclasses.replace(OPEN, model="x" * 11), T, True),
    "open: long reply_to": (dataclasses.replace(OPEN, reply_to="x" * 11), T, True),
    "open: unknown dtype": (dataclasses.replace(OPEN, wire_dtype=BAD_DTYPE), D, True),
    "open: negative max_tokens": (dataclasses.replace(OPEN, max_tokens=-1), V, False),
    "open: negative prompt_len": (dataclasses.replace(OPEN, prompt_len=-1), V, False),
    "temperature NaN": (sampling(temperature=NAN), V, True),
    "temperature inf": (sampling(temperature=INF), V, True),
    "temperature negative": (sampling(temperature=-0.1), V, True),
    "top_p zero": (sampling(top_p=0.0), V, True),
    "top_p above one": (sampling(top_p=1.01), V, True),
    "top_p NaN": (sampling(top_p=NAN), V, True),
    "min_p one": (sampling(min_p=1.0), V, True),
    "min_p negative": (sampling(min_p=-0.1), V, True),
    "min_p NaN": (sampling(min_p=NAN), V, True),
    "penalty zero": (sampling(repetition_penalty=0.0), V, True),
    "penalty inf": (sampling(repetition_penalty=INF), V, True),
    "negative top_k": (sampling(top_k=-1), V, False),
    "negative window": (sampling(repetition_window=-1), V, False),
    "negative seed": (sampling(seed=-1), V, False),
    "tokens: empty session": (dataclasses.replace(TOKENS, session=""), V, True),
    "tokens: too many": (dataclasses.replace(TOKENS, tokens=(1,) * 9), T, True),
    "tokens: negative": (dataclasses.replace(TOKENS, tokens=(-5,)), V, True),
    "tokens: too many guesses": (dataclasses.replace(TOKENS, guesses=(1,) * 4), T, True),
    "tokens: negative guess": (dataclasses.replace(TOKENS, guesses=(-1,)), V, True),
    "tokens: n_accepted over max_guesses": (dataclasses.replace(TOKENS, n_accepted=4), V, True),
    "tokens: negative step_id": (dataclasses.replace(TOKENS, step_id=-1), V, False),
    "tokens: NaN timing": (
        dataclasses.replace(TOKENS, timings=(StageTiming(0, NAN, 0.0, 0.0),)), V, True),
    "close: empty session": (Close("", "bye"), V, True),
    "close: long reason": (Close("s", "r" * 11), T, True),
    "error: unknown code": (Error("s", cast(ErrorCode, 999), "?"), V, True),
    "error: long session": (Error("s" * 11, ErrorCode.INTERNAL, "m"), T, True),
    "error: long message": (Error("s", ErrorCode.INTERNAL, "m" * 11), T, True),
    "challenge: short nonce": (Challenge(bytes(MIN_NONCE - 1)), V, True),
    "challenge: long nonce": (Challenge(bytes(MAX_NONCE + 1)), T, True),
    "proof: empty": (Proof(b""), V, True),
    "proof: over the cap": (Proof(bytes(101)), T, True),
    "welcome: empty node_id": (Welcome(""), V, True),
    "welcome: long node_id": (Welcome("n" * 11), T, True),
    "ping: negative nonce": (Ping(-1), V, False),
    "pong: nonce past u64": (Pong(U64_MAX + 1), V, False),
}  # fmt: skip


@pytest.mark.parametrize("name", list(RULES))
def test_each_rule_refuses_its_frame(name: str) -> None:
    frame, code, on_wire = RULES[name]
    with refused(code):
        encode(frame, SMALL)
    if not on_wire:
        return
    data = _pack(frame)  # the bytes a careless or hostile peer would send
    with refused(code):
        decode(data, SMALL)
    with refused(code):
        FrameDecoder(SMALL).feed(data)


# Values right at each boundary are fine, so the rules above are not stricter than meant.
ACCEPTED: dict[str, Frame] = {
    "samples": STEP,
    "hidden sample": HIDDEN,
    "string of exactly max_string bytes": Close("s" * 10, "é" * 5),
    "token rows with the token cap": step(tokens=(TOKEN_MAX,) * 8, n_rows=8, guesses=()),
    "guesses in all rows but one": step(guesses=(2, 3)),
    "max guesses": step(tokens=(1,) * 4, n_rows=4, guesses=(1,) * 3),
    "max rows, width": hidden(n_rows=16, width=16, hidden=bytes(512), guesses=()),
    "hidden rows with their tokens": hidden(tokens=(1, 2)),
    "keep_until at start": step(keep_until=10),
    "keep_until zero": step(keep_until=0),
    "last position": step(start=POS_MAX - 3, keep_until=None),
    "max timings": step(timings=STEP.timings * 2),
    "greedy edge sampling": sampling(temperature=0.0, top_p=1.0, min_p=0.0, top_k=0),
    "u64 extremes": dataclasses.replace(STEP, step_id=U64_MAX, sent_at_ns=U64_MAX),
    "n_accepted = max_guesses": dataclasses.replace(TOKENS, n_accepted=3),
    "finished with no tokens": Tokens("s", 0, (), (), 0, True, ()),
    "connection-level error": Error("", ErrorCode.UNAUTHENTICATED, ""),
    "ping extremes": Ping(U64_MAX),
    "nonce sizes": Challenge(bytes(MIN_NONCE)),
    "nonce sizes, max": Challenge(bytes(MAX_NONCE)),
    "proof at the cap": Proof(bytes(100)),
}


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_boundary_values_are_accepted(name: str) -> None:
    frame = ACCEPTED[name]
    assert decode(encode(frame, SMALL), SMALL) == frame


def test_limits_refuse_nonsense() -> None:
    for bad in ({"max_rows": 0}, {"max_frame_bytes": 5}, {"max_string": 70_000}):
        with pytest.raises(ValueError):
            Limits(**bad)


def test_truncate_utf8_never_splits_a_character() -> None:
    assert truncate_utf8("aé", 2) == "a"
    assert truncate_utf8("aé", 3) == "aé"
    message = truncate_utf8("é" * 1000, 1024)
    assert len(message.encode()) <= 1024
    encode(Error("s", ErrorCode.INTERNAL, message))


def test_frame_errors_pickle_with_their_code() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(FrameError(ErrorCode.BAD_SHAPE, "x")))
    assert err.code is ErrorCode.BAD_SHAPE and err.message == "x"


@given(frames)
@FUZZ
def test_frames_decoded_never_share_the_decoder_buffer(frame: Frame) -> None:
    decoder = FrameDecoder()
    data = encode(frame)
    (got,) = decoder.feed(data[:-1]) + decoder.feed(data[-1:])
    decoder.feed(encode(Ping(0))[:3])  # the buffer is reused; the frame must not change
    assert got == frame
