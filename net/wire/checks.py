"""Frame validation: the one `validate` that encode and decode both call; no IO.

A frame is validated by the same `validate` before it is encoded and after it is
decoded, so nothing invalid ever leaves or enters; every refusal is a `FrameError`.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import TypeVar

from net.errors import ErrorCode, FrameError
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
    MAX_NONCE,
    MIN_NONCE,
    POS_MAX,
    TOKEN_MAX,
    U8_MAX,
    U16_MAX,
    U32_MAX,
    U64_MAX,
    Limits,
)
from net.wire.tensors import WireDtype, rows_nbytes

_E = TypeVar("_E", bound=IntEnum)


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
            as_enum(ErrorCode, frame.code, ErrorCode.BAD_VALUE, "error code")
            _check_string("message", frame.message, limits)
        case Ping() | Pong():
            _check_int("nonce", frame.nonce, U64_MAX)
        case Hello():
            _check_announced(frame.protocol, frame.release, limits)
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
            _check_announced(frame.protocol, frame.release, limits)
        case _:
            raise FrameError(ErrorCode.MALFORMED, f"not a frame: {type(frame).__name__}")


def _check_announced(protocol: int, release: str, limits: Limits) -> None:
    """HELLO's and WELCOME's version tail: a protocol (1: no tail, so no release)."""
    _check_int("protocol", protocol, U16_MAX)
    if protocol < 1:
        raise FrameError(ErrorCode.BAD_VALUE, f"protocol {protocol}")
    _check_string("release", release, limits)
    if protocol == 1 and release:
        raise FrameError(ErrorCode.BAD_VALUE, "a release without a protocol (1 sends neither)")


def _check_open(frame: Open, limits: Limits) -> None:
    _check_session(frame.session, limits)
    _check_string("model", frame.model, limits)
    if not frame.model:
        raise FrameError(ErrorCode.BAD_VALUE, "model is empty")
    as_enum(WireDtype, frame.wire_dtype, ErrorCode.BAD_DTYPE, "wire dtype")
    _check_sampling(frame.sampling)
    _check_string("reply_to", frame.reply_to, limits)
    _check_int("max_tokens", frame.max_tokens, U32_MAX)
    _check_int("prompt_len", frame.prompt_len, U32_MAX)
    _check_resume(frame, limits)
    if frame.loop is not None:
        _check_loop(frame.loop, limits)


MAX_RING_GUESSES = 32
"""Guesses a step round the ring may carry (a client guesses 6 at most by default)."""


def _check_loop(loop: Loop, limits: Limits) -> None:
    for name in ("first_node", "first_address", "last_node"):
        value = getattr(loop, name)
        _check_string(name, value, limits)
        if not value:
            raise FrameError(ErrorCode.BAD_VALUE, f"loop {name} is empty")
    if not 0 <= loop.guesses <= MAX_RING_GUESSES:
        raise FrameError(ErrorCode.BAD_VALUE, f"loop guesses {loop.guesses} outside "
                         f"0..{MAX_RING_GUESSES}")  # fmt: skip
    if loop.first_node == loop.last_node:
        raise FrameError(ErrorCode.BAD_VALUE, "a loop needs two stages (first is last)")
    host, _, port = loop.first_address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= U16_MAX:
        raise FrameError(ErrorCode.BAD_VALUE, f"loop first_address {loop.first_address!r} "
                         "is not host:port")  # fmt: skip


RESUME_DIGEST_BYTES = 32
"""A SHA-256 (app.serving.rules.resume)."""


def _check_resume(frame: Open, limits: Limits) -> None:
    if not frame.resumes:
        if frame.resume_held or frame.resume_digest or frame.resume_from_layer is not None:
            raise FrameError(ErrorCode.BAD_VALUE, "resume fields without resumes")
        return
    if frame.resume_from_layer is not None:  # U32_MAX stands for None on the wire
        _check_int("resume_from_layer", frame.resume_from_layer, U32_MAX - 1)
    _check_string("resumes", frame.resumes, limits)
    if frame.resumes == frame.session:
        raise FrameError(ErrorCode.BAD_VALUE, "a session cannot resume itself")
    _check_int("resume_held", frame.resume_held, U32_MAX)
    if not 0 < frame.resume_held < frame.prompt_len:
        # The last stage computes at least the final row (its logits are the answer).
        raise FrameError(
            ErrorCode.BAD_POSITIONS,
            f"resume_held {frame.resume_held} outside 1..{frame.prompt_len - 1}",
        )
    if len(frame.resume_digest) != RESUME_DIGEST_BYTES:
        raise FrameError(ErrorCode.BAD_VALUE, f"resume_digest must be {RESUME_DIGEST_BYTES} bytes")


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
    dtype = as_enum(WireDtype, frame.wire_dtype, ErrorCode.BAD_DTYPE, "wire dtype")
    _check_token_list("tokens", frame.tokens, limits.max_tokens_per_frame)
    _check_token_list("guesses", frame.guesses, limits.max_guesses)
    _check_rows(frame, dtype, limits)
    if frame.guesses and len(frame.guesses) >= frame.n_rows:
        # Guesses are verified after the accepted token before them, so they fill at most
        # all rows but the first.
        raise FrameError(
            ErrorCode.BAD_SHAPE, f"{len(frame.guesses)} guesses need more than {frame.n_rows} rows"
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
    if frame.one_by_one and frame.guesses:
        # Guessed rows have their own row-by-row rules (app.serving.steps.verify_rows).
        raise FrameError(ErrorCode.BAD_SHAPE, "rows one at a time carry no guesses")


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
    _check_token_list("guesses", frame.guesses, limits.max_guesses)
    _check_int("n_accepted", frame.n_accepted, limits.max_guesses)
    _check_int("guessed", frame.guessed, min(limits.max_guesses, U8_MAX))
    if frame.n_accepted > frame.guessed and frame.guessed:
        raise FrameError(ErrorCode.BAD_VALUE, "more guesses accepted than the step carried")
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


_INF = math.inf


def _check_timings(timings: tuple[StageTiming, ...], limits: Limits) -> None:
    if len(timings) > limits.max_timings:
        raise FrameError(ErrorCode.TOO_LARGE, f"{len(timings)} timings > {limits.max_timings}")
    # Every hop checks every earlier stage's timings: one comparison chain each when all
    # hold (0 <= x < inf is False for NaN too); the loop below names the bad one.
    if all(
        0 <= t.stage <= U32_MAX
        and 0.0 <= t.compute_ms < _INF
        and 0.0 <= t.queue_ms < _INF
        and 0.0 <= t.recv_to_send_ms < _INF
        for t in timings
    ):
        return
    for t in timings:
        _check_int("timing stage", t.stage, U32_MAX)
        for ms in (t.compute_ms, t.queue_ms, t.recv_to_send_ms):
            if not (math.isfinite(ms) and ms >= 0):
                raise FrameError(ErrorCode.BAD_VALUE, f"stage {t.stage} timing {ms} ms")


def as_enum(kind: type[_E], value: int, code: ErrorCode, what: str) -> _E:
    """`value` as a member of `kind`; an unknown value is a FrameError with `code`."""
    try:
        return kind(value)
    except ValueError:
        raise FrameError(code, f"unknown {what} {value}") from None
