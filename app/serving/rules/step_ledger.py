"""What a stage keeps of its recent steps so that another node can check them (spot
checks, coordinator/spot_checks.py): per session, each step's positions, the rows it
took and digests of what it took and what it sent on. No IO.

Only a session's prefix from position 0 can be recomputed elsewhere (a step's output
depends on the session's KV cache at this stage), so a session is recorded from its
first step on or not at all: one whose KV came from elsewhere (a replay that adopted
it) is never recorded. Bounded by sessions, by steps per session and by bytes of rows
in all: the session heard of least recently is forgotten first; a session whose rows
reach the per-check cap keeps its prefix so far and records no more steps.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from coordinator.spot_checks import (
    HIDDEN,
    MAX_CHECK_ROW_BYTES,
    MAX_CHECK_STEPS,
    MAX_OFFERED_SESSIONS,
    TOKENS,
    CheckRecord,
    CheckStep,
    digest,
)
from net import wire


def token_rows(tokens: tuple[int, ...]) -> bytes:
    """A first stage's input rows as a check record holds them."""
    return np.asarray(tokens, dtype="<i4").tobytes()


def ledger_step(taken: wire.Step, sent: bytes, out_dtype: int) -> CheckStep:
    """The record of a step: `taken` as the stage received it (token rows to a first
    stage, hidden rows to a later one), `sent` the hidden rows it forwarded."""
    rows = token_rows(taken.tokens) if taken.hidden is None else taken.hidden
    return CheckStep(
        step_id=taken.step_id,
        start=taken.start,
        n_rows=taken.n_rows,
        keep_until=-1 if taken.keep_until is None else taken.keep_until,
        guesses=len(taken.guesses),
        one_by_one=taken.one_by_one,
        kind=TOKENS if taken.hidden is None else HIDDEN,
        wire_dtype=int(taken.wire_dtype),
        width=taken.width,
        out_dtype=out_dtype,
        rows=rows,
        input_digest=digest(rows),
        output_digest=digest(sent),
    )


@dataclass(frozen=True)
class LedgerLimits:
    sessions: int = 64
    bytes: int = 16 * MAX_CHECK_ROW_BYTES
    """Input rows kept in all."""
    steps_per_session: int = MAX_CHECK_STEPS
    bytes_per_session: int = MAX_CHECK_ROW_BYTES


@dataclass
class _Kept:
    steps: list[CheckStep]
    bytes: int = 0
    full: bool = False
    """No more steps are recorded: the next would pass a per-session cap."""


class StepLedger:
    """Recent sessions' steps on one stage, oldest session evicted first."""

    def __init__(self, limits: LedgerLimits = LedgerLimits()) -> None:
        self.limits = limits
        self._sessions: OrderedDict[str, _Kept] = OrderedDict()
        self._bytes = 0
        self._seen: OrderedDict[str, int] = OrderedDict()
        """A last stage's steps per session (`witness`)."""
        self._refused: set[str] = set()
        """Sessions that did not start at position 0 here: never recorded (bounded like
        the rest: cleared with the session's `forget`, and capped)."""

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._sessions)

    def record(self, session: str, step: CheckStep) -> None:
        """A step the stage computed and sent on."""
        kept = self._sessions.get(session)
        if kept is None:
            if step.start != 0 or session in self._refused:
                self._refuse(session)
                return
            kept = self._sessions[session] = _Kept([])
        self._sessions.move_to_end(session)
        size = len(step.rows)
        if (
            kept.full
            or len(kept.steps) >= self.limits.steps_per_session
            or kept.bytes + size > self.limits.bytes_per_session
        ):
            kept.full = True
            return
        kept.steps.append(step)
        kept.bytes += size
        self._bytes += size
        self._evict(keep=session)

    def refuse(self, session: str) -> None:
        """The session's cache here did not come from its own steps (adopted KV)."""
        self.forget(session)
        self._refuse(session)

    def forget(self, session: str) -> None:
        kept = self._sessions.pop(session, None)
        if kept is not None:
            self._bytes -= kept.bytes
        self._seen.pop(session, None)
        self._refused.discard(session)

    def witness(self, session: str, start: int) -> None:
        """A last stage computed a step of `session` (it sends no rows on, so it keeps no
        record): only the count, for the coordinator to sample the previous stage's
        sessions from (`witnessed`), not from what that stage chooses to offer."""
        if start == 0 and session not in self._seen:
            self._seen[session] = 0
        if session not in self._seen:
            return  # heard of from the middle: its prefix is not checkable anywhere
        self._seen[session] += 1
        self._seen.move_to_end(session)
        while len(self._seen) > self.limits.sessions:
            self._seen.popitem(last=False)

    def witnessed(self) -> tuple[tuple[str, int], ...]:
        """The sessions `witness` counted, newest first, with their steps (at most
        MAX_CHECK_STEPS: a check covers no more, and a heartbeat carries no more)."""
        newest = list(reversed(self._seen.items()))[:MAX_OFFERED_SESSIONS]
        return tuple((name, min(steps, MAX_CHECK_STEPS)) for name, steps in newest)

    def offered(self) -> tuple[tuple[str, int], ...]:
        """The sessions a check may ask for, newest first, with their steps recorded."""
        newest = reversed(self._sessions.items())
        found = [(name, len(k.steps)) for name, k in newest if k.steps]
        return tuple(found[:MAX_OFFERED_SESSIONS])

    def check_record(self, session: str, steps: int) -> CheckRecord | None:
        """The session's first `steps` steps; None when they are not all here."""
        kept = self._sessions.get(session)
        if kept is None or not 0 < steps <= len(kept.steps):
            return None
        return CheckRecord(session, tuple(kept.steps[:steps]))

    def _refuse(self, session: str) -> None:
        if len(self._refused) >= 4 * self.limits.sessions:
            self._refused.pop()
        self._refused.add(session)

    def _evict(self, keep: str) -> None:
        while len(self._sessions) > self.limits.sessions or self._bytes > self.limits.bytes:
            oldest = next(iter(self._sessions))
            if oldest == keep:
                break
            self.forget(oldest)
