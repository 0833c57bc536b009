"""Spot checks' messages, written once for both ends: a stage's record of one session's
steps (what it took in, digests of what it gave out), the coordinator's asks, and a
checker's digests of the same steps recomputed on its own engine.

A stage's output for a step depends on the step's rows and on everything the session
fed that stage before (its KV cache), so what a checker can recompute exactly is a
session's prefix: every step from position 0 up to the sampled one. Reproducible
workers make each session's rows meet nobody else's in a decode, so an honest stage and
an honest checker agree bit for bit.

Standard library only, every field bounded as it is read: a record comes from another
volunteer's PC.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Any

from coordinator.errors import MalformedAnswer

DIGEST_CHARS = 64
"""blake2b with a 32-byte digest, in hex."""
MAX_CHECK_STEPS = 256
"""Steps of one session's prefix a check carries at most."""
MAX_CHECK_ROW_BYTES = 640 * 1024
"""Input rows one check record carries at most (all its steps together): base64 and the
JSON around them stay under the coordinator's 1 MiB request body."""
MAX_ROWS_PER_STEP = 1 << 16
MAX_WIDTH = 1 << 20
MAX_POSITION = 1 << 24
MAX_SESSION_CHARS = 128
MAX_CHECK_ID_CHARS = 64
MAX_ASKS = 8
"""Asks one heartbeat answer carries at most."""
MAX_OFFERED_SESSIONS = 16
"""Sessions a stage offers for checks in one heartbeat at most."""

TOKENS = "tokens"
"""A first stage's input: token ids, int32 little endian."""
HIDDEN = "hidden"
"""A later stage's input: hidden rows as the wire carried them (net.wire.tensors)."""

RECORD = "record"
"""Ask: hand over your record of the session's first `steps` steps."""
RECOMPUTE = "recompute"
"""Ask: fetch the check's inputs and recompute them on your engine."""


def digest(data: bytes) -> str:
    """The digest a record and a checker compare: blake2b-256, hex."""
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def _int(value: Any, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise MalformedAnswer(f"{what} must be an integer in [{low}, {high}]")
    return value


def _text(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise MalformedAnswer(f"{what} must be a text of 1 to {limit} characters")
    return value


def _digest(value: Any, what: str) -> str:
    text = _text(value, what, DIGEST_CHARS)
    if len(text) != DIGEST_CHARS or any(c not in "0123456789abcdef" for c in text):
        raise MalformedAnswer(f"{what} must be {DIGEST_CHARS} lowercase hex digits")
    return text


def _list(value: Any, what: str, limit: int) -> list[Any]:
    if not isinstance(value, list) or len(value) > limit:
        raise MalformedAnswer(f"{what} must be a list of at most {limit} items")
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedAnswer(f"{what} must be a JSON object")
    return value


@dataclass(frozen=True)
class CheckStep:
    """One step a stage computed for a session, as it took it and as it answered."""

    step_id: int
    start: int
    """The position of its first row."""
    n_rows: int
    keep_until: int
    """Positions at and after this were cut before the step (-1: nothing cut)."""
    guesses: int
    """Guessed rows at its end (a stage before the last computes each alone)."""
    one_by_one: bool
    """A replay's rows, each computed alone."""
    kind: str
    """TOKENS or HIDDEN."""
    wire_dtype: int
    """HIDDEN: the encoding of the rows it took (net.wire.tensors.WireDtype)."""
    width: int
    """HIDDEN: the rows' width."""
    out_dtype: int
    """The encoding of the rows it sent on, which `output_digest` hashes."""
    rows: bytes
    """The input rows: token ids (int32 LE) or hidden rows as the wire carried them."""
    input_digest: str
    output_digest: str

    def to_json(self, with_rows: bool = True) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "start": self.start,
            "n_rows": self.n_rows,
            "keep_until": self.keep_until,
            "guesses": self.guesses,
            "one_by_one": self.one_by_one,
            "kind": self.kind,
            "wire_dtype": self.wire_dtype,
            "width": self.width,
            "out_dtype": self.out_dtype,
            "rows": base64.b64encode(self.rows).decode() if with_rows else "",
            "input_digest": self.input_digest,
            "output_digest": self.output_digest,
        }

    @staticmethod
    def from_json(doc: Any, budget: int) -> CheckStep:
        """One step, its rows at most `budget` bytes (MalformedAnswer beyond)."""
        d = _object(doc, "a check step")
        encoded = d.get("rows")
        if not isinstance(encoded, str) or len(encoded) > (budget + 2) // 3 * 4:
            raise MalformedAnswer(f"a check step's rows must be base64 of at most {budget} bytes")
        try:
            rows = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise MalformedAnswer(f"a check step's rows are not base64: {exc}") from exc
        if len(rows) > budget:
            raise MalformedAnswer(f"a check's rows exceed {MAX_CHECK_ROW_BYTES} bytes in all")
        kind = d.get("kind")
        if kind not in (TOKENS, HIDDEN):
            raise MalformedAnswer(f"a check step's kind must be {TOKENS} or {HIDDEN}")
        return CheckStep(
            step_id=_int(d.get("step_id"), "step_id", 0, 2**62),
            start=_int(d.get("start"), "start", 0, MAX_POSITION),
            n_rows=_int(d.get("n_rows"), "n_rows", 1, MAX_ROWS_PER_STEP),
            keep_until=_int(d.get("keep_until"), "keep_until", -1, MAX_POSITION),
            guesses=_int(d.get("guesses"), "guesses", 0, MAX_ROWS_PER_STEP),
            one_by_one=d.get("one_by_one") is True,
            kind=kind,
            wire_dtype=_int(d.get("wire_dtype"), "wire_dtype", 0, 255),
            width=_int(d.get("width"), "width", 0, MAX_WIDTH),
            out_dtype=_int(d.get("out_dtype"), "out_dtype", 0, 255),
            rows=rows,
            input_digest=_digest(d.get("input_digest"), "input_digest"),
            output_digest=_digest(d.get("output_digest"), "output_digest"),
        )


@dataclass(frozen=True)
class CheckRecord:
    """A stage's record of one session's steps, from its first (position 0) on."""

    session: str
    steps: tuple[CheckStep, ...]

    def to_json(self) -> dict[str, Any]:
        return {"session": self.session, "steps": [s.to_json() for s in self.steps]}

    @staticmethod
    def from_json(doc: Any) -> CheckRecord:
        d = _object(doc, "a check record")
        budget = MAX_CHECK_ROW_BYTES
        steps = []
        for item in _list(d.get("steps"), "a check record's steps", MAX_CHECK_STEPS):
            step = CheckStep.from_json(item, budget)
            budget -= len(step.rows)
            steps.append(step)
        return CheckRecord(_text(d.get("session"), "session", MAX_SESSION_CHARS), tuple(steps))

    def lies_about_itself(self) -> str:
        """Why the record does not hash to its own claims ("" when it does): each
        step's rows against its input digest, and rows of the size its shape says."""
        for s in self.steps:
            if digest(s.rows) != s.input_digest:
                return f"step {s.step_id}: its rows do not hash to its input digest"
            if s.kind == TOKENS and len(s.rows) != 4 * s.n_rows:
                return f"step {s.step_id}: {len(s.rows)} bytes for {s.n_rows} tokens"
        return ""


@dataclass(frozen=True)
class CheckAsk:
    """What the coordinator asks of a node in a heartbeat answer."""

    check_id: str
    kind: str
    """RECORD (the checked stage) or RECOMPUTE (a checker)."""
    session: str
    steps: int
    """The prefix: the session's first `steps` steps."""

    def to_json(self) -> dict[str, Any]:
        return {
            "check_id": self.check_id,
            "kind": self.kind,
            "session": self.session,
            "steps": self.steps,
        }

    @staticmethod
    def from_json(doc: Any) -> CheckAsk:
        d = _object(doc, "a check ask")
        kind = d.get("kind")
        if kind not in (RECORD, RECOMPUTE):
            raise MalformedAnswer(f"a check ask's kind must be {RECORD} or {RECOMPUTE}")
        return CheckAsk(
            _text(d.get("check_id"), "check_id", MAX_CHECK_ID_CHARS),
            kind,
            _text(d.get("session"), "session", MAX_SESSION_CHARS),
            _int(d.get("steps"), "steps", 1, MAX_CHECK_STEPS),
        )


def read_asks(value: Any) -> tuple[CheckAsk, ...]:
    """A heartbeat answer's asks (none from a coordinator that does not check)."""
    if value is None:
        return ()
    return tuple(CheckAsk.from_json(a) for a in _list(value, "check asks", MAX_ASKS))


@dataclass(frozen=True)
class CheckDigests:
    """What a node answers to an ask: its output digest of each step of the prefix in
    order, or why it could not (`refused`: no record, no free slot, a step its engine
    refused)."""

    digests: tuple[str, ...] = ()
    refused: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"digests": list(self.digests), "refused": self.refused[:300]}

    @staticmethod
    def from_json(doc: Any) -> CheckDigests:
        d = _object(doc, "check digests")
        items = _list(d.get("digests"), "digests", MAX_CHECK_STEPS)
        refused = d.get("refused", "")
        if not isinstance(refused, str) or len(refused) > 300:
            raise MalformedAnswer("refused must be a text of at most 300 characters")
        return CheckDigests(tuple(_digest(x, "a digest") for x in items), refused)
