"""Typed errors of the `app` package (worker, client, configuration)."""

from __future__ import annotations

from app.session.rows_refusal import rows_refusal
from net.errors import ErrorCode
from net.protocol import overload_hint


class AppError(Exception):
    """Base of errors raised on purpose by `app`."""


class ConfigError(AppError):
    """A configuration file, route or command-line value is unusable."""


class NotJoined(ConfigError):
    """No identity in the folder asked for: this PC has not joined a swarm (there)."""


class IdentityTaken(ConfigError):
    """The identity folder holds a node joined with another invite; joining again there
    would orphan that node, so the message says how to restart it or where to join."""


class PiecesError(AppError):
    """The pieces cache cannot do what was asked (a model it does not hold, a clear that
    needs confirming)."""


class PiecesCacheFull(PiecesError):
    """A stage's pieces do not fit under the volunteer's cap on the pieces cache, even
    with every file of other stages evicted; the message says how much is needed, the
    cap, and how to raise it."""

    def __init__(self, message: str, needed_bytes: int, cap_bytes: int) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        """Bytes the stage takes in the cache: its pieces and the stage file built from them."""
        self.cap_bytes = cap_bytes

    def __reduce__(self) -> tuple[type[PiecesCacheFull], tuple[str, int, int]]:
        return (PiecesCacheFull, (str(self), self.needed_bytes, self.cap_bytes))


class ClientError(AppError):
    """A chat session could not run to the end."""


class RouteUnavailable(ClientError):
    """A stage of the route could not be reached or refused us."""


class StageFailed(ClientError):
    """A stage reported an error for our session (code and message from the wire)."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(f"{error_code.name}: {message}")
        self.error_code = error_code
        """The wire's code, for decisions (reroute on STAGE_ERROR, ...)."""
        self.message = message

    @property
    def code(self) -> str:
        """The code's name ("OVERLOADED"), for logs and callers that match on text."""
        return self.error_code.name

    def __reduce__(self) -> tuple[type[StageFailed], tuple[ErrorCode, str]]:
        # Picklable despite the two-argument init (the default would pass only the text).
        return (StageFailed, (self.error_code, self.message))


class RowsRefused(StageFailed):
    """A stage refused the hidden-state rows it was sent (app.serving.steps.row_checks):
    `check` names the check that failed, `from_layer` the refusing stage's first layer,
    so the stage whose layers end there sent them."""

    def __init__(self, message: str, check: str, from_layer: int) -> None:
        super().__init__(ErrorCode.STAGE_ERROR, message)
        self.check = check
        self.from_layer = from_layer

    def __reduce__(self) -> tuple[type[RowsRefused], tuple[str, str, int]]:  # type: ignore[override]
        return (RowsRefused, (self.message, self.check, self.from_layer))


class BadTokens(ClientError):
    """TOKENS from the last stage that cannot answer the step asked (a count, a
    position, a token id or a greedy choice that does not fit): the last stage is
    suspect, and the answer is replayed as for a failed stage."""


class AnswerWithdrawn(ClientError):
    """Part of an answer already streamed was computed through a stage a spot check then
    found faulty: what was sent cannot be taken back, so the stream ends; asked again,
    the answer comes from a chain without that stage."""


class StageTimeout(ClientError):
    """No answer from the route within the step deadline."""


class Overloaded(StageFailed):
    """A stage refused a new session: its sessions or KV memory are full (OVERLOADED).
    Nothing ran; the client may retry after `retry_after_ms` (0: never on this route),
    or ask the coordinator for another route when `try_another_route`."""

    def __init__(self, message: str, retry_after_ms: int, try_another_route: bool) -> None:
        super().__init__(ErrorCode.OVERLOADED, message)
        self.retry_after_ms = retry_after_ms
        self.try_another_route = try_another_route

    def __reduce__(self) -> tuple[type[Overloaded], tuple[str, int, bool]]:  # type: ignore[override]
        return (Overloaded, (self.message, self.retry_after_ms, self.try_another_route))


def stage_error(code: ErrorCode, message: str) -> StageFailed:
    """The typed error for an ERROR frame: `Overloaded` (with its hint) or `StageFailed`."""
    hint, text = overload_hint(code, message)
    if hint is not None:
        return Overloaded(text, hint.retry_after_ms, hint.try_another_route)
    if code is ErrorCode.OVERLOADED:  # from a peer that sends no hint: retry in a second
        return Overloaded(message, 1000, True)
    refusal, why = rows_refusal(message) if code is ErrorCode.STAGE_ERROR else (None, message)
    if refusal is not None:
        text = f"rows refused at layer {refusal.from_layer} ({refusal.check}): {why}"
        return RowsRefused(text, refusal.check, refusal.from_layer)
    return StageFailed(code, message)
