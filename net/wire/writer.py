"""Frames to bytes: validated first, then packed in the layout of net.wire.layout."""

from __future__ import annotations

import struct

from net.errors import ErrorCode, FrameError
from net.wire.checks import validate
from net.wire.frames import (
    Challenge,
    Close,
    Error,
    Frame,
    Hello,
    Open,
    Ping,
    Pong,
    Proof,
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
from net.wire.versions import downgrade


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
        # One pack for the whole block: a STEP at stage k carries k timings, on every hop.
        flat = [v for t in values for v in (t.stage, t.compute_ms, t.queue_ms, t.recv_to_send_ms)]
        self.pack(f">I{'Iddd' * len(values)}", len(values), *flat)


def encode(frame: Frame, limits: Limits = DEFAULT_LIMITS, version: int = PROTOCOL_VERSION) -> bytes:
    """One whole frame as bytes; refuses (FrameError) any frame `decode` would refuse.

    `version` is the protocol negotiated with the peer: tails it lacks are left out
    (net.wire.versions.downgrade), so an older peer gets a frame it reads."""
    if version < PROTOCOL_VERSION:
        frame = downgrade(frame, version)
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
            if frame.resumes or frame.loop is not None:  # optional tails, in order
                w.string(frame.resumes)
                w.pack(">I", frame.resume_held)
                w.blob(frame.resume_digest)
                if frame.loop is not None:  # the slot is there; U32_MAX: no layer named
                    layer = frame.resume_from_layer
                    w.pack(">I", U32_MAX if layer is None else layer)
                    w.string(frame.loop.first_node)
                    w.string(frame.loop.first_address)
                    w.string(frame.loop.last_node)
                    w.pack(">BB", frame.loop.guesses, frame.loop.adaptive)
                elif frame.resume_from_layer is not None:
                    w.pack(">I", frame.resume_from_layer)
            return FrameType.OPEN
        case Step():
            w.string(frame.session)
            w.pack(">QIBII", frame.step_id, frame.start, frame.wire_dtype, frame.n_rows,
                   frame.width)  # fmt: skip
            w.ints(frame.tokens)
            w.pack(">B", frame.hidden is not None)
            if frame.hidden is not None:
                w.blob(frame.hidden)
            w.ints(frame.guesses)
            w.pack(">B", frame.keep_until is not None)
            if frame.keep_until is not None:
                w.pack(">I", frame.keep_until)
            w.timings(frame.timings)
            w.pack(">Q", frame.sent_at_ns)
            if frame.one_by_one:  # the optional tail: absent, the STEP is as before
                w.pack(">B", 1)
            return FrameType.STEP
        case Tokens():
            w.string(frame.session)
            w.pack(">Q", frame.step_id)
            w.ints(frame.tokens)
            w.ints(frame.guesses)
            w.pack(">IB", frame.n_accepted, frame.finished)
            w.timings(frame.timings)
            w.blob(frame.logits_sample)
            if frame.looped or frame.guessed:  # the optional tail: absent, as before
                w.pack(">BB", frame.looped, frame.guessed)
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
            if frame.protocol > 1:  # the optional tail: absent, the HELLO of protocol 1
                w.pack(">H", frame.protocol)
                w.string(frame.release)
            return FrameType.HELLO
        case Challenge():
            w.blob(frame.nonce)
            return FrameType.CHALLENGE
        case Proof():
            w.blob(frame.data)
            return FrameType.PROOF
        case Welcome():
            w.string(frame.node_id)
            if frame.protocol > 1:  # the optional tail, as HELLO's
                w.pack(">H", frame.protocol)
                w.string(frame.release)
            return FrameType.WELCOME
