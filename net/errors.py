"""Typed errors of the `net` package; callers catch `NetError` or a precise subclass."""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Why a frame or a session was refused. Travels in `Error` frames, so values are fixed."""

    MALFORMED = 1
    """The bytes do not parse: truncated, trailing bytes, bad UTF-8, unknown frame type."""
    UNSUPPORTED_VERSION = 2
    TOO_LARGE = 3
    """A size is over a `Limits` cap (frame, rows, width, tokens, guesses, strings, timings)."""
    BAD_DTYPE = 4
    BAD_SHAPE = 5
    """Row counts, widths and byte counts disagree with each other."""
    BAD_POSITIONS = 6
    BAD_VALUE = 7
    """A well-formed field holds a value out of its range (negative token, NaN, empty id)."""
    UNKNOWN_SESSION = 8
    NOT_OWNER = 9
    STAGE_ERROR = 10
    OVERLOADED = 11
    UNAUTHENTICATED = 12
    INTERNAL = 13
    MISSING_POSITIONS = 14
    """A stage was sent rows that do not continue its cache (it restarted and lost its KV,
    or rows were skipped): the sender must replay the session, never get garbage."""
    ROUTE_MOVED = 15
    """The client's route is not the chain its OPEN went down: a stage's next hop moved
    since the coordinator handed the route out. The client fetches a route again and
    replays the session on it."""


class NetError(Exception):
    """Base of every error raised on purpose by `net`."""


class FrameError(NetError):
    """A frame was refused, on encode or on decode; `code` says why, for the peer too."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[FrameError], tuple[ErrorCode, str]]:
        # Keeps the error picklable across process pools despite the two-argument init.
        return (FrameError, (self.code, self.message))
