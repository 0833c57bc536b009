"""Bytes to frames: one whole frame parsed, then validated; every refusal a FrameError.

The body parser is shared with net.wire.decoder, which cuts frames out of a stream.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from itertools import starmap
from typing import Any

from net.errors import ErrorCode, FrameError
from net.wire.checks import as_enum, validate
from net.wire.frames import (
    Challenge,
    Close,
    Error,
    Frame,
    Hello,
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
)
from net.wire.layout import (
    DEFAULT_LIMITS,
    HEADER,
    PROTOCOL_VERSION,
    U32_MAX,
    VERSION,
    FrameType,
    Limits,
)
from net.wire.tensors import WireDtype
from net.wire.versions import needed


class _Reader:
    """Reads a body; running short or leaving bytes behind is MALFORMED."""

    def __init__(self, body: memoryview) -> None:
        self.body = body  # a view: only `raw` copies, so hidden rows are copied once
        self.offset = 0
        self._end = len(body)

    def unpack(self, st: struct.Struct) -> tuple[Any, ...]:
        # The per-token path runs this a dozen times a frame: bounds checked inline.
        start = self.offset
        end = start + st.size
        if end > self._end:
            raise FrameError(ErrorCode.MALFORMED, "body ends inside a field")
        self.offset = end
        values: tuple[Any, ...] = st.unpack_from(self.body, start)
        return values

    def u(self, st: struct.Struct) -> int:
        start = self.offset
        end = start + st.size
        if end > self._end:
            raise FrameError(ErrorCode.MALFORMED, "body ends inside a field")
        self.offset = end
        value: int = st.unpack_from(self.body, start)[0]
        return value

    def f64(self) -> float:
        (value,) = self.unpack(_F64)
        assert isinstance(value, float)
        return value

    def flag(self, what: str) -> bool:
        value = self.u(_U8)
        if value > 1:
            raise FrameError(ErrorCode.MALFORMED, f"{what} flag is {value}, not 0 or 1")
        return value == 1

    def raw(self, n: int) -> bytes:
        self._need(n)
        data = bytes(self.body[self.offset : self.offset + n])
        self.offset += n
        return data

    def string(self) -> str:
        raw = self.raw(self.u(_U16))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError(ErrorCode.MALFORMED, "string is not valid UTF-8") from None

    def ints(self) -> tuple[int, ...]:
        n = self.u(_U32)
        self._need(4 * n)  # before building a format for a count a peer chose
        values: tuple[int, ...] = struct.unpack_from(f"<{n}i", self.body, self.offset)
        self.offset += 4 * n
        return values

    def blob(self) -> bytes:
        return self.raw(self.u(_U32))

    def timings(self) -> tuple[StageTiming, ...]:
        n = self.u(_U32)
        size = _TIMING.size * n
        self._need(size)
        block = self.body[self.offset : self.offset + size]
        self.offset += size
        return tuple(starmap(StageTiming, _TIMING.iter_unpack(block)))

    def finish(self) -> None:
        if self.offset != len(self.body):
            raise FrameError(
                ErrorCode.MALFORMED, f"{len(self.body) - self.offset} trailing bytes in body"
            )

    def _need(self, n: int) -> None:
        if self.offset + n > len(self.body):
            raise FrameError(ErrorCode.MALFORMED, "body ends inside a field")


_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
_TIMING = struct.Struct(">Iddd")
_STEP_HEAD = struct.Struct(">QIBII")
"""step_id, start, wire dtype, n_rows, width: the fixed fields after a STEP's session."""


def _read_open(r: _Reader) -> Open:
    session, model = r.string(), r.string()
    dtype = as_enum(WireDtype, r.u(_U8), ErrorCode.BAD_DTYPE, "wire dtype")
    temperature, top_k, top_p, min_p = r.f64(), r.u(_U32), r.f64(), r.f64()
    penalty, window, seed = r.f64(), r.u(_U32), r.u(_U64)
    sampling = SamplingSpec(temperature, top_k, top_p, min_p, penalty, window, seed)
    reply_to, max_tokens, prompt_len = r.string(), r.u(_U32), r.u(_U32)
    if r.offset == len(r.body):  # no resume tail: a plain new session
        return Open(session, model, dtype, sampling, reply_to, max_tokens, prompt_len)
    resumes, held, digest = r.string(), r.u(_U32), r.blob()
    from_layer = r.u(_U32) if r.offset < len(r.body) else None  # absent: the last stage
    loop = None
    if r.offset < len(r.body):  # the ring's tail; the layer slot is always there before it
        first, address, last = r.string(), r.string(), r.string()
        loop = Loop(first, address, last, r.u(_U8), r.flag("adaptive"))
        from_layer = None if from_layer == U32_MAX else from_layer
    elif not resumes or from_layer == U32_MAX:  # one encoding per frame
        raise FrameError(ErrorCode.MALFORMED, "a resume tail without a session it resumes")
    return Open(session, model, dtype, sampling, reply_to, max_tokens, prompt_len,
                resumes, held, digest, from_layer, loop)  # fmt: skip


def _read_step(r: _Reader) -> Step:
    session = r.string()
    step_id, start, raw_dtype, n_rows, width = r.unpack(_STEP_HEAD)
    dtype = as_enum(WireDtype, raw_dtype, ErrorCode.BAD_DTYPE, "wire dtype")
    tokens = r.ints()
    hidden = r.blob() if r.flag("hidden") else None
    guesses = r.ints()
    keep_until = r.u(_U32) if r.flag("keep_until") else None
    timings, sent_at_ns = r.timings(), r.u(_U64)
    one_by_one = False
    if r.offset != len(r.body):  # the optional tail: rows one at a time
        one_by_one = r.flag("one_by_one")
        if not one_by_one:  # one encoding per frame: the writer omits a false tail
            raise FrameError(ErrorCode.MALFORMED, "a one_by_one tail of 0 (omitted when false)")
    return Step(session, step_id, start, tokens, hidden, n_rows, width, dtype, guesses,
                keep_until, timings, sent_at_ns, one_by_one)  # fmt: skip


def _read_tokens(r: _Reader) -> Tokens:
    session, step_id, tokens, guesses = r.string(), r.u(_U64), r.ints(), r.ints()
    n_accepted, finished = r.u(_U32), r.flag("finished")
    timings, logits = r.timings(), r.blob()
    looped, guessed = False, 0
    if r.offset != len(r.body):  # the optional tail: the ring's
        looped, guessed = r.flag("looped"), r.u(_U8)
        if not looped and not guessed:  # one encoding per frame: the writer omits it
            raise FrameError(ErrorCode.MALFORMED, "a ring tail of zeros (omitted when unset)")
    return Tokens(session, step_id, tokens, guesses, n_accepted, finished, timings, logits,
                  looped, guessed)  # fmt: skip


def _read_announced(r: _Reader) -> tuple[int, str]:
    """HELLO's and WELCOME's optional tail: protocol and release; (1, "") when absent."""
    if r.offset == len(r.body):
        return 1, ""
    protocol, release = r.u(_U16), r.string()
    if protocol < 2:  # one encoding per frame: protocol 1 is the frame without a tail
        raise FrameError(ErrorCode.MALFORMED, f"a version tail saying protocol {protocol}")
    return protocol, release


def _read_hello(r: _Reader) -> Hello:
    return Hello(*_read_announced(r))


def _read_welcome(r: _Reader) -> Welcome:
    node_id = r.string()
    return Welcome(node_id, *_read_announced(r))


def _read_error(r: _Reader) -> Error:
    session = r.string()
    code = as_enum(ErrorCode, r.u(_U16), ErrorCode.BAD_VALUE, "error code")
    return Error(session, code, r.string())


_READERS: dict[FrameType, Callable[[_Reader], Frame]] = {
    FrameType.OPEN: _read_open,
    FrameType.STEP: _read_step,
    FrameType.TOKENS: _read_tokens,
    FrameType.CLOSE: lambda r: Close(r.string(), r.string()),
    FrameType.ERROR: _read_error,
    FrameType.PING: lambda r: Ping(r.u(_U64)),
    FrameType.PONG: lambda r: Pong(r.u(_U64)),
    FrameType.HELLO: _read_hello,
    FrameType.CHALLENGE: lambda r: Challenge(r.blob()),
    FrameType.PROOF: lambda r: Proof(r.blob()),
    FrameType.WELCOME: _read_welcome,
}


def check_length(length: int, limits: Limits) -> None:
    if HEADER.size + length > limits.max_frame_bytes:
        raise FrameError(
            ErrorCode.TOO_LARGE,
            f"frame of {HEADER.size + length} bytes > {limits.max_frame_bytes}",
        )


def check_header(version: int, ftype: int) -> FrameType:
    if version != VERSION:
        raise FrameError(ErrorCode.UNSUPPORTED_VERSION, f"version {version}, we speak {VERSION}")
    return as_enum(FrameType, ftype, ErrorCode.MALFORMED, "frame type")


def parse_body(
    ftype: FrameType, body: memoryview, limits: Limits, version: int = PROTOCOL_VERSION
) -> Frame:
    """`version`: the newest protocol whose tails are read (a reader of an older release
    took them for trailing bytes: tests model such peers with it)."""
    reader = _Reader(body)
    frame = _READERS[ftype](reader)
    reader.finish()
    if version < PROTOCOL_VERSION and needed(frame) > version:
        raise FrameError(
            ErrorCode.MALFORMED, f"trailing bytes in body (a tail of protocol {needed(frame)})"
        )
    validate(frame, limits)
    return frame


def decode(data: bytes, limits: Limits = DEFAULT_LIMITS, version: int = PROTOCOL_VERSION) -> Frame:
    """Exactly one whole frame from `data`, validated; anything else is a FrameError."""
    if len(data) < HEADER.size:
        raise FrameError(ErrorCode.MALFORMED, f"{len(data)} bytes is shorter than a header")
    length, layout, raw_type = HEADER.unpack_from(data)
    check_length(length, limits)
    if HEADER.size + length != len(data):
        raise FrameError(
            ErrorCode.MALFORMED, f"header says {length} body bytes, {len(data) - HEADER.size} given"
        )
    ftype = check_header(layout, raw_type)
    return parse_body(ftype, memoryview(data)[HEADER.size :], limits, version)
