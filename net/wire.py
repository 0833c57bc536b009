"""Frames between peers (net.frames, re-exported here): validation and bytes; no IO.

Layout of every frame: a 6-byte header `>IBB` = body length (bytes after the header),
version (1), frame type; then the body. Body scalars are big-endian (network order);
strings are u16 byte length + UTF-8; integer arrays are u32 count + little-endian int32
(what numpy reads without a copy); blobs are u32 length + raw bytes; optional values are
a u8 flag (0 or 1) then the value; floats are f64 so Python floats round-trip exactly.

A frame is validated by the same `validate` before it is encoded and after it is
decoded, so nothing invalid ever leaves or enters; every refusal is a `FrameError`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import Enum, IntEnum
from typing import TypeVar

from net.errors import ErrorCode, FrameError
from net.frames import (
    Challenge,
    Close,
    Error,
    Frame,
    Hello,
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
from net.tensors import WireDtype, rows_nbytes

VERSION = 1
HEADER = struct.Struct(">IBB")
_LENGTH = struct.Struct(">I")

U16_MAX = 0xFFFF
U32_MAX = 0xFFFF_FFFF
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
TOKEN_MAX = 0x7FFF_FFFF
POS_MAX = 0x7FFF_FFFF
"""llama.cpp positions are int32: the last row of a step must stay below this."""
MIN_NONCE, MAX_NONCE = 16, 64
"""A challenge shorter than 128 bits could be guessed and its proof replayed."""


class FrameType(IntEnum):
    OPEN = 1
    STEP = 2
    TOKENS = 3
    CLOSE = 4
    ERROR = 5
    PING = 6
    PONG = 7
    HELLO = 8
    CHALLENGE = 9
    PROOF = 10
    WELCOME = 11


@dataclass(frozen=True)
class Limits:
    """Caps applied to every frame; a peer that exceeds one gets TOO_LARGE."""

    max_frame_bytes: int = 64 * 1024 * 1024
    """Whole frame, header included."""
    max_rows: int = 4096
    max_width: int = 65536
    max_tokens_per_frame: int = 4096
    max_drafts: int = 64
    max_string: int = 1024
    """UTF-8 bytes of any one string."""
    max_timings: int = 256
    max_proof_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not 0 < value <= U32_MAX:
                raise ValueError(f"{f.name} must be in 1..{U32_MAX}, got {value}")
        if self.max_frame_bytes < HEADER.size:
            raise ValueError(f"max_frame_bytes must be at least {HEADER.size}")
        if self.max_string > U16_MAX:
            raise ValueError(f"max_string must be at most {U16_MAX} (u16 length prefix)")


DEFAULT_LIMITS = Limits()


_E = TypeVar("_E", bound=IntEnum)


def truncate_utf8(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` of UTF-8 without splitting a character."""
    return text.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")


# --- validation -----------------------------------------------------------------------


def validate(frame: Frame, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise FrameError unless `frame` is one a peer may send; encode and decode both call it."""
    match frame:
        case Open():
            _check_open(frame, limits)
        case Step():
            _check_step(frame, limits)
        case Tokens():
            _check_tokens_frame(frame, limits)
        case Close():
            _check_session(frame.session, limits)
            _check_string("reason", frame.reason, limits)
        case Error():
            _check_string("session", frame.session, limits)
            _enum(ErrorCode, frame.code, ErrorCode.BAD_VALUE, "error code")
            _check_string("message", frame.message, limits)
        case Ping() | Pong():
            _check_int("nonce", frame.nonce, U64_MAX)
        case Hello():
            pass
        case Challenge():
            if len(frame.nonce) < MIN_NONCE:
                raise FrameError(ErrorCode.BAD_VALUE, f"nonce of {len(frame.nonce)} bytes")
            if len(frame.nonce) > MAX_NONCE:
                raise FrameError(ErrorCode.TOO_LARGE, f"nonce of {len(frame.nonce)} bytes")
        case Proof():
            if not frame.data:
                raise FrameError(ErrorCode.BAD_VALUE, "proof is empty")
            if len(frame.data) > limits.max_proof_bytes:
                raise FrameError(
                    ErrorCode.TOO_LARGE, f"proof of {len(frame.data)} B > {limits.max_proof_bytes}"
                )
        case Welcome():
            _check_string("node_id", frame.node_id, limits)
            if not frame.node_id:
                raise FrameError(ErrorCode.BAD_VALUE, "node_id is empty")
        case _:
            raise FrameError(ErrorCode.MALFORMED, f"not a frame: {type(frame).__name__}")


def _check_open(frame: Open, limits: Limits) -> None:
    _check_session(frame.session, limits)
    _check_string("model", frame.model, limits)
    if not frame.model:
        raise FrameError(ErrorCode.BAD_VALUE, "model is empty")
    _enum(WireDtype, frame.wire_dtype, ErrorCode.BAD_DTYPE, "wire dtype")
    _check_sampling(frame.sampling)
    _check_string("reply_to", frame.reply_to, limits)
    _check_int("max_tokens", frame.max_tokens, U32_MAX)
    _check_int("prompt_len", frame.prompt_len, U32_MAX)


def _check_sampling(s: SamplingSpec) -> None:
    # Mirrors SamplingParams; written so that NaN fails every comparison.
    if not (math.isfinite(s.temperature) and s.temperature >= 0):
        raise FrameError(ErrorCode.BAD_VALUE, "temperature must be finite and >= 0")
    if not 0.0 < s.top_p <= 1.0:
        raise FrameError(ErrorCode.BAD_VALUE, "top_p must be in (0, 1]")
    if not 0.0 <= s.min_p < 1.0:
        raise FrameError(ErrorCode.BAD_VALUE, "min_p must be in [0, 1)")
    if not (math.isfinite(s.repetition_penalty) and s.repetition_penalty > 0):
        raise FrameError(ErrorCode.BAD_VALUE, "repetition_penalty must be finite and > 0")
    _check_int("top_k", s.top_k, U32_MAX)
    _check_int("repetition_window", s.repetition_window, U32_MAX)
    _check_int("seed", s.seed, U64_MAX)


def _check_step(frame: Step, limits: Limits) -> None:
    _check_session(frame.session, limits)
    _check_int("step_id", frame.step_id, U64_MAX)
    dtype = _enum(WireDtype, frame.wire_dtype, ErrorCode.BAD_DTYPE, "wire dtype")
    _check_token_list("tokens", frame.tokens, limits.max_tokens_per_frame)
    _check_token_list("drafts", frame.drafts, limits.max_drafts)
    _check_rows(frame, dtype, limits)
    if frame.drafts and len(frame.drafts) >= frame.n_rows:
        # Drafts are verified after the accepted token before them, so they fill at most
        # all rows but the first.
        raise FrameError(
            ErrorCode.BAD_SHAPE, f"{len(frame.drafts)} drafts need more than {frame.n_rows} rows"
        )
    if not 0 <= frame.start <= POS_MAX - frame.n_rows:
        raise FrameError(ErrorCode.BAD_POSITIONS, f"rows from {frame.start} overflow int32")
    if frame.keep_until is not None and not 0 <= frame.keep_until <= frame.start:
        # The new rows are written from `start`: a rollback can reach back, never ahead.
        raise FrameError(
            ErrorCode.BAD_POSITIONS, f"keep_until {frame.keep_until} outside 0..{frame.start}"
        )
    _check_timings(frame.timings, limits)
    _check_int("sent_at_ns", frame.sent_at_ns, U64_MAX)


def _check_rows(frame: Step, dtype: WireDtype, limits: Limits) -> None:
    if frame.n_rows <= 0:
        raise FrameError(ErrorCode.BAD_SHAPE, f"a step needs rows, got n_rows={frame.n_rows}")
    if frame.n_rows > limits.max_rows:
        raise FrameError(ErrorCode.TOO_LARGE, f"{frame.n_rows} rows > {limits.max_rows}")
    if frame.hidden is None:
        if frame.width != 0:
            raise FrameError(ErrorCode.BAD_SHAPE, f"token rows have width 0, got {frame.width}")
        if len(frame.tokens) != frame.n_rows:
            raise FrameError(
                ErrorCode.BAD_SHAPE, f"{len(frame.tokens)} tokens for {frame.n_rows} token rows"
            )
        return
    if frame.width <= 0:
        raise FrameError(ErrorCode.BAD_SHAPE, f"hidden rows need width > 0, got {frame.width}")
    if frame.width > limits.max_width:
        raise FrameError(ErrorCode.TOO_LARGE, f"width {frame.width} > {limits.max_width}")
    expected = rows_nbytes(dtype, frame.n_rows, frame.width)
    if len(frame.hidden) != expected:
        raise FrameError(
            ErrorCode.BAD_SHAPE,
            f"hidden is {len(frame.hidden)} bytes, {frame.n_rows} x {frame.width} "
            f"{dtype.name} needs {expected}",
        )
    if frame.tokens and len(frame.tokens) != frame.n_rows:
        raise FrameError(
            ErrorCode.BAD_SHAPE, f"{len(frame.tokens)} tokens beside {frame.n_rows} hidden rows"
        )


def _check_tokens_frame(frame: Tokens, limits: Limits) -> None:
    _check_session(frame.session, limits)
    _check_int("step_id", frame.step_id, U64_MAX)
    _check_token_list("tokens", frame.tokens, limits.max_tokens_per_frame)
    _check_token_list("drafts", frame.drafts, limits.max_drafts)
    _check_int("n_accepted", frame.n_accepted, limits.max_drafts)
    _check_timings(frame.timings, limits)


def _check_session(session: str, limits: Limits) -> None:
    _check_string("session", session, limits)
    if not session:
        raise FrameError(ErrorCode.BAD_VALUE, "session is empty")


def _check_string(name: str, value: str, limits: Limits) -> None:
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates cannot travel as UTF-8
        raise FrameError(ErrorCode.MALFORMED, f"{name} is not encodable as UTF-8") from None
    if size > limits.max_string:
        raise FrameError(ErrorCode.TOO_LARGE, f"{name} is {size} bytes > {limits.max_string}")


def _check_int(name: str, value: int, maximum: int) -> None:
    if not 0 <= value <= maximum:
        raise FrameError(ErrorCode.BAD_VALUE, f"{name}={value} outside 0..{maximum}")


def _check_token_list(name: str, values: tuple[int, ...], cap: int) -> None:
    if len(values) > cap:
        raise FrameError(ErrorCode.TOO_LARGE, f"{len(values)} {name} > {cap}")
    bad = next((v for v in values if not 0 <= v <= TOKEN_MAX), None)
    if bad is not None:
        raise FrameError(ErrorCode.BAD_VALUE, f"{name} holds {bad}, outside 0..{TOKEN_MAX}")


def _check_timings(timings: tuple[StageTiming, ...], limits: Limits) -> None:
    if len(timings) > limits.max_timings:
        raise FrameError(ErrorCode.TOO_LARGE, f"{len(timings)} timings > {limits.max_timings}")
    for t in timings:
        _check_int("timing stage", t.stage, U32_MAX)
        for ms in (t.compute_ms, t.queue_ms, t.recv_to_send_ms):
            if not (math.isfinite(ms) and ms >= 0):
                raise FrameError(ErrorCode.BAD_VALUE, f"stage {t.stage} timing {ms} ms")


def _enum(kind: type[_E], value: int, code: ErrorCode, what: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        raise FrameError(code, f"unknown {what} {value}") from None


# --- bytes out ------------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def pack(self, fmt: str, *values: object) -> None:
        self.parts.append(struct.pack(fmt, *values))

    def string(self, value: str) -> None:
        raw = value.encode("utf-8")
        self.parts += (struct.pack(">H", len(raw)), raw)

    def ints(self, values: tuple[int, ...]) -> None:
        self.parts += (struct.pack(">I", len(values)), struct.pack(f"<{len(values)}i", *values))

    def blob(self, value: bytes) -> None:
        self.parts += (struct.pack(">I", len(value)), value)

    def timings(self, values: tuple[StageTiming, ...]) -> None:
        self.pack(">I", len(values))
        for t in values:
            self.pack(">Iddd", t.stage, t.compute_ms, t.queue_ms, t.recv_to_send_ms)


def encode(frame: Frame, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """One whole frame as bytes; refuses (FrameError) any frame `decode` would refuse."""
    validate(frame, limits)
    data = _pack(frame)
    if len(data) > limits.max_frame_bytes:
        raise FrameError(
            ErrorCode.TOO_LARGE, f"frame is {len(data)} bytes > {limits.max_frame_bytes}"
        )
    return data


def _pack(frame: Frame) -> bytes:
    """Bytes of `frame` without validation (tests use it to build refusable frames)."""
    w = _Writer()
    ftype = _pack_body(frame, w)
    length = sum(map(len, w.parts))
    return b"".join([HEADER.pack(length, VERSION, ftype), *w.parts])  # one copy of the rows


def _pack_body(frame: Frame, w: _Writer) -> FrameType:
    match frame:
        case Open():
            s = frame.sampling
            w.string(frame.session)
            w.string(frame.model)
            w.pack(">B", frame.wire_dtype)
            w.pack(">dIdddIQ", s.temperature, s.top_k, s.top_p, s.min_p,
                   s.repetition_penalty, s.repetition_window, s.seed)  # fmt: skip
            w.string(frame.reply_to)
            w.pack(">II", frame.max_tokens, frame.prompt_len)
            return FrameType.OPEN
        case Step():
            w.string(frame.session)
            w.pack(">QIBII", frame.step_id, frame.start, frame.wire_dtype, frame.n_rows,
                   frame.width)  # fmt: skip
            w.ints(frame.tokens)
            w.pack(">B", frame.hidden is not None)
            if frame.hidden is not None:
                w.blob(frame.hidden)
            w.ints(frame.drafts)
            w.pack(">B", frame.keep_until is not None)
            if frame.keep_until is not None:
                w.pack(">I", frame.keep_until)
            w.timings(frame.timings)
            w.pack(">Q", frame.sent_at_ns)
            return FrameType.STEP
        case Tokens():
            w.string(frame.session)
            w.pack(">Q", frame.step_id)
            w.ints(frame.tokens)
            w.ints(frame.drafts)
            w.pack(">IB", frame.n_accepted, frame.finished)
            w.timings(frame.timings)
            w.blob(frame.logits_sample)
            return FrameType.TOKENS
        case Close():
            w.string(frame.session)
            w.string(frame.reason)
            return FrameType.CLOSE
        case Error():
            w.string(frame.session)
            w.pack(">H", frame.code)
            w.string(frame.message)
            return FrameType.ERROR
        case Ping() | Pong():
            w.pack(">Q", frame.nonce)
            return FrameType.PING if isinstance(frame, Ping) else FrameType.PONG
        case Hello():
            return FrameType.HELLO
        case Challenge():
            w.blob(frame.nonce)
            return FrameType.CHALLENGE
        case Proof():
            w.blob(frame.data)
            return FrameType.PROOF
        case Welcome():
            w.string(frame.node_id)
            return FrameType.WELCOME


# --- bytes in -------------------------------------------------------------------------


class _Reader:
    """Reads a body; running short or leaving bytes behind is MALFORMED."""

    def __init__(self, body: memoryview) -> None:
        self.body = body  # a view: only `raw` copies, so hidden rows are copied once
        self.offset = 0

    def unpack(self, st: struct.Struct) -> tuple[int | float, ...]:
        self._need(st.size)
        values: tuple[int | float, ...] = st.unpack_from(self.body, self.offset)
        self.offset += st.size
        return values

    def u(self, st: struct.Struct) -> int:
        (value,) = self.unpack(st)
        assert isinstance(value, int)
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
        self._need(_TIMING.size * n)
        out = []
        for _ in range(n):
            stage, compute, queue, hop = self.unpack(_TIMING)
            out.append(StageTiming(int(stage), float(compute), float(queue), float(hop)))
        return tuple(out)

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


def _read_open(r: _Reader) -> Open:
    session, model = r.string(), r.string()
    dtype = _enum(WireDtype, r.u(_U8), ErrorCode.BAD_DTYPE, "wire dtype")
    temperature, top_k, top_p, min_p = r.f64(), r.u(_U32), r.f64(), r.f64()
    penalty, window, seed = r.f64(), r.u(_U32), r.u(_U64)
    sampling = SamplingSpec(temperature, top_k, top_p, min_p, penalty, window, seed)
    return Open(session, model, dtype, sampling, r.string(), r.u(_U32), r.u(_U32))


def _read_step(r: _Reader) -> Step:
    session, step_id, start = r.string(), r.u(_U64), r.u(_U32)
    dtype = _enum(WireDtype, r.u(_U8), ErrorCode.BAD_DTYPE, "wire dtype")
    n_rows, width, tokens = r.u(_U32), r.u(_U32), r.ints()
    hidden = r.blob() if r.flag("hidden") else None
    drafts = r.ints()
    keep_until = r.u(_U32) if r.flag("keep_until") else None
    timings, sent_at_ns = r.timings(), r.u(_U64)
    return Step(session, step_id, start, tokens, hidden, n_rows, width, dtype, drafts,
                keep_until, timings, sent_at_ns)  # fmt: skip


def _read_tokens(r: _Reader) -> Tokens:
    session, step_id, tokens, drafts = r.string(), r.u(_U64), r.ints(), r.ints()
    n_accepted, finished = r.u(_U32), r.flag("finished")
    return Tokens(session, step_id, tokens, drafts, n_accepted, finished, r.timings(), r.blob())


def _read_error(r: _Reader) -> Error:
    session = r.string()
    code = _enum(ErrorCode, r.u(_U16), ErrorCode.BAD_VALUE, "error code")
    return Error(session, code, r.string())


_READERS: dict[FrameType, Callable[[_Reader], Frame]] = {
    FrameType.OPEN: _read_open,
    FrameType.STEP: _read_step,
    FrameType.TOKENS: _read_tokens,
    FrameType.CLOSE: lambda r: Close(r.string(), r.string()),
    FrameType.ERROR: _read_error,
    FrameType.PING: lambda r: Ping(r.u(_U64)),
    FrameType.PONG: lambda r: Pong(r.u(_U64)),
    FrameType.HELLO: lambda r: Hello(),
    FrameType.CHALLENGE: lambda r: Challenge(r.blob()),
    FrameType.PROOF: lambda r: Proof(r.blob()),
    FrameType.WELCOME: lambda r: Welcome(r.string()),
}


def _check_length(length: int, limits: Limits) -> None:
    if HEADER.size + length > limits.max_frame_bytes:
        raise FrameError(
            ErrorCode.TOO_LARGE,
            f"frame of {HEADER.size + length} bytes > {limits.max_frame_bytes}",
        )


def _check_header(version: int, ftype: int) -> FrameType:
    if version != VERSION:
        raise FrameError(ErrorCode.UNSUPPORTED_VERSION, f"version {version}, we speak {VERSION}")
    return _enum(FrameType, ftype, ErrorCode.MALFORMED, "frame type")


def _parse_body(ftype: FrameType, body: memoryview, limits: Limits) -> Frame:
    reader = _Reader(body)
    frame = _READERS[ftype](reader)
    reader.finish()
    validate(frame, limits)
    return frame


def decode(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Frame:
    """Exactly one whole frame from `data`, validated; anything else is a FrameError."""
    if len(data) < HEADER.size:
        raise FrameError(ErrorCode.MALFORMED, f"{len(data)} bytes is shorter than a header")
    length, version, ftype = HEADER.unpack_from(data)
    _check_length(length, limits)
    if HEADER.size + length != len(data):
        raise FrameError(
            ErrorCode.MALFORMED, f"header says {length} body bytes, {len(data) - HEADER.size} given"
        )
    return _parse_body(_check_header(version, ftype), memoryview(data)[HEADER.size :], limits)


# --- incremental decoding ---------------------------------------------------------------


class _State(Enum):
    HEADER = "header"
    """Waiting for the 6 header bytes."""
    BODY = "body"
    """Header checked; waiting for `_body_length` body bytes."""
    FAILED = "failed"
    """A frame was refused; the stream cannot be trusted any more."""


class FrameDecoder:
    """Sans-IO reader for one stream: feed it bytes as they arrive, get whole frames back.

    A length prefix over `max_frame_bytes` is refused as soon as its 4 bytes arrive, so
    a peer cannot make us buffer a huge body. After any FrameError the decoder stays
    failed (every later `feed` raises again): the stream must be closed with that code.
    Frames before a bad one in the same `feed` are not returned: the stream is untrusted.
    """

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._buffer = bytearray()
        self._offset = 0
        """Start of the first unread byte: consumed frames are cut off once per feed."""
        self._state = _State.HEADER
        self._type = FrameType.PING
        self._body_length = 0
        self._error: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held back waiting for the rest of a frame."""
        return len(self._buffer) - self._offset

    def feed(self, data: bytes) -> list[Frame]:
        if self._error is not None:
            raise FrameError(self._error.code, f"stream already failed: {self._error.message}")
        self._buffer += data
        frames: list[Frame] = []
        try:
            while (frame := self._next()) is not None:
                frames.append(frame)
        except FrameError as exc:
            self._fail(exc)
            raise
        if self._offset:
            # One cut per feed (per frame would be quadratic in frames per chunk). A new
            # buffer, not a resize: a view of the old one may outlive a parse error.
            self._buffer = self._buffer[self._offset :]
            self._offset = 0
        return frames

    def end_of_stream(self) -> None:
        """The peer finished the stream: raise MALFORMED if it stopped inside a frame."""
        if self._error is not None:
            raise FrameError(self._error.code, f"stream already failed: {self._error.message}")
        if self.buffered:
            exc = FrameError(
                ErrorCode.MALFORMED, f"stream ended inside a frame ({self.buffered} B)"
            )
            self._fail(exc)
            raise exc

    def _next(self) -> Frame | None:
        start = self._offset
        if self._state is _State.HEADER:
            if self.buffered >= _LENGTH.size:
                # Checked before the rest of the header so a huge prefix is refused at once.
                _check_length(_LENGTH.unpack_from(self._buffer, start)[0], self.limits)
            if self.buffered < HEADER.size:
                return None
            length, version, ftype = HEADER.unpack_from(self._buffer, start)
            self._type = _check_header(version, ftype)
            self._body_length = length
            self._state = _State.BODY
        end = start + HEADER.size + self._body_length
        if len(self._buffer) < end:
            return None
        body = memoryview(self._buffer)[start + HEADER.size : end]
        self._offset = end
        self._state = _State.HEADER
        return _parse_body(self._type, body, self.limits)

    def _fail(self, exc: FrameError) -> None:
        self._state = _State.FAILED
        self._error = exc
        self._buffer = bytearray()
        self._offset = 0


__all__ = [
    "DEFAULT_LIMITS",
    "HEADER",
    "MAX_NONCE",
    "MIN_NONCE",
    "POS_MAX",
    "TOKEN_MAX",
    "U16_MAX",
    "U32_MAX",
    "U64_MAX",
    "VERSION",
    "Challenge",
    "Close",
    "Error",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "Hello",
    "Limits",
    "Open",
    "Ping",
    "Pong",
    "Proof",
    "SamplingSpec",
    "StageTiming",
    "Step",
    "Tokens",
    "Welcome",
    "decode",
    "encode",
    "truncate_utf8",
    "validate",
]
