"""Sans-IO incremental decoding: bytes of one stream in, whole validated frames out."""

from __future__ import annotations

from enum import Enum

from net.errors import ErrorCode, FrameError
from net.wire.frames import Frame
from net.wire.layout import DEFAULT_LIMITS, HEADER, LENGTH, PROTOCOL_VERSION, FrameType, Limits
from net.wire.reader import check_header, check_length, parse_body


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

    def __init__(self, limits: Limits = DEFAULT_LIMITS, version: int = PROTOCOL_VERSION) -> None:
        self.limits = limits
        self.version = version
        """The newest protocol whose optional tails it reads (net.wire.reader.parse_body)."""
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

    def feed(self, data: bytes, max_frames: int | None = None) -> list[Frame]:
        """The whole frames buffered so far, at most `max_frames` of them: the rest stay
        buffered, unchecked, for a later `feed` (maybe under other `limits`: a peer's
        first frames are read with smaller caps than those after its authentication)."""
        if self._error is not None:
            raise FrameError(self._error.code, f"stream already failed: {self._error.message}")
        self._buffer += data
        frames: list[Frame] = []
        try:
            while max_frames is None or len(frames) < max_frames:
                frame = self._next()
                if frame is None:
                    break
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
            if self.buffered >= LENGTH.size:
                # Checked before the rest of the header so a huge prefix is refused at once.
                check_length(LENGTH.unpack_from(self._buffer, start)[0], self.limits)
            if self.buffered < HEADER.size:
                return None
            length, version, ftype = HEADER.unpack_from(self._buffer, start)
            self._type = check_header(version, ftype)
            self._body_length = length
            self._state = _State.BODY
        end = start + HEADER.size + self._body_length
        if len(self._buffer) < end:
            return None
        body = memoryview(self._buffer)[start + HEADER.size : end]
        self._offset = end
        self._state = _State.HEADER
        return parse_body(self._type, body, self.limits, self.version)

    def _fail(self, exc: FrameError) -> None:
        self._state = _State.FAILED
        self._error = exc
        self._buffer = bytearray()
        self._offset = 0
