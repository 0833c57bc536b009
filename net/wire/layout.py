"""The wire's fixed layout: header, version, frame types, size caps; no frames, no IO.

Layout of every frame: a 6-byte header `>IBB` = body length (bytes after the header),
version (1), frame type; then the body. Body scalars are big-endian (network order);
strings are u16 byte length + UTF-8; integer arrays are u32 count + little-endian int32
(what numpy reads without a copy); blobs are u32 length + raw bytes; optional values are
a u8 flag (0 or 1) then the value; floats are f64 so Python floats round-trip exactly.
net.wire.writer and net.wire.reader follow it; net.wire.checks applies the caps.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from enum import IntEnum

VERSION = 1
"""The header's layout byte: every release reads and writes 1 (a peer refuses any other
value, so it never changes; what a peer understands is PROTOCOL_VERSION, negotiated)."""
PROTOCOL_VERSION = 2
"""What this release speaks, exchanged in HELLO and WELCOME (net.wire.versions): 1, peers that
announce nothing, reads the base frames only; 2 adds the announcement itself and the
optional tails of OPEN (resume, ring), STEP (one_by_one) and TOKENS (ring). A peer never
sends a tail the negotiated version lacks (net.wire.versions.TAILS)."""
MIN_PROTOCOL_VERSION = 1
"""The oldest protocol this release talks to: version 1 peers get base frames."""
HEADER = struct.Struct(">IBB")
LENGTH = struct.Struct(">I")
"""The header's first field alone: checked before the rest of the header arrives."""

U8_MAX = 0xFF
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
    max_guesses: int = 64
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


def truncate_utf8(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` of UTF-8 without splitting a character."""
    return text.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")
