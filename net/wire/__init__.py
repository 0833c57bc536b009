"""Frames between peers, their validation and their bytes: the one module callers import.

Each job lives in its own module, readers and writers apart: net.wire.frames (what the frames
mean), net.wire.layout (header, frame types, size caps), net.wire.checks (`validate`,
which encode and decode both call, so nothing invalid ever leaves or enters),
net.wire.writer (`encode`), net.wire.reader (`decode`, one whole frame) and
net.wire.decoder (`FrameDecoder`, frames cut out of a stream). None does IO; every
refusal is a `FrameError`. Every public name is re-exported here.
"""

from __future__ import annotations

from net.wire.checks import validate
from net.wire.decoder import FrameDecoder
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
    MAX_NONCE,
    MIN_NONCE,
    MIN_PROTOCOL_VERSION,
    POS_MAX,
    PROTOCOL_VERSION,
    TOKEN_MAX,
    U16_MAX,
    U32_MAX,
    U64_MAX,
    VERSION,
    FrameType,
    Limits,
    truncate_utf8,
)
from net.wire.reader import decode
from net.wire.writer import _pack as _pack  # bytes unvalidated: tests build refusable frames
from net.wire.writer import encode

__all__ = [
    "DEFAULT_LIMITS",
    "HEADER",
    "MAX_NONCE",
    "MIN_NONCE",
    "MIN_PROTOCOL_VERSION",
    "POS_MAX",
    "PROTOCOL_VERSION",
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
    "Loop",
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
