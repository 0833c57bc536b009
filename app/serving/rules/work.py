"""What `app.serving.rules.stage` takes and gives beyond the session rules' own
events and actions (app.serving.rules.events): the engine's answers in, the engine's
work, the links onward and the timers out. Frozen dataclasses, no IO."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.serving.session_records import PendingStep
from app.serving.steps.batch import Checks
from core.guess_acceptance import Verdict
from core.stage import StepFailure, StepResult
from net import wire

# ---------------------------------------------------------------- events (in)


@dataclass(frozen=True)
class StageOpened:
    """The engine opened the session (`OpenOnStage`); `error` says why it could not."""

    session: str
    error: str = ""


@dataclass(frozen=True)
class StageAdopted:
    """The engine handed `old`'s KV to `session` (`AdoptOnStage`), or, with `error`,
    could not (`old` is as it was)."""

    old: str
    session: str
    kept: int
    error: str = ""


@dataclass(frozen=True)
class StepsComputed:
    """A batch (`StageCore.take_batch`) came back from the engine: one result or typed
    failure per item, the last stage's row-by-row verdicts by index, and the stage
    clock's times around the computation."""

    batch: Batch
    results: Sequence[StepResult | StepFailure]
    verdicts: dict[int, Verdict]
    started: float
    finished: float


@dataclass(frozen=True)
class Guessed:
    """The MTP head's guesses for `reply` (`Guess`), none when it could not guess."""

    reply: wire.Tokens
    guesses: tuple[int, ...]


@dataclass(frozen=True)
class DownstreamRefused:
    """The next stage sent an ERROR."""

    error: wire.Error


@dataclass(frozen=True)
class DownstreamLost:
    """The link to the next stage could not be re-established in time."""

    reason: str


@dataclass(frozen=True)
class RingRefused:
    """Last stage: the first stage `node` sent an ERROR on the ring link."""

    node: str
    error: wire.Error


@dataclass(frozen=True)
class RingLost:
    """Last stage: the ring link to the first stage `node` could not be re-established."""

    node: str
    reason: str


@dataclass(frozen=True)
class TimerFired:
    """The shell's one timer (`StageCore.next_deadline`) fired."""


@dataclass(frozen=True)
class SweepIdle:
    """Close the sessions that took no step for the stage's idle limit."""


# ---------------------------------------------------------------- actions (out)


@dataclass(frozen=True)
class OpenOnStage:
    """Open the session on the engine; answer with `StageOpened`."""

    session: str


@dataclass(frozen=True)
class AdoptOnStage:
    """Rename `old` to `session` on the engine, keeping `kept` positions; answer with
    `StageAdopted`."""

    old: str
    session: str
    kept: int


@dataclass(frozen=True)
class CloseOnStage:
    """Free a session's KV on the engine (one that is no longer in the table)."""

    session: str


@dataclass(frozen=True)
class Forward:
    """Send an OPEN or STEP to the next stage."""

    frame: wire.Open | wire.Step
    taken: wire.Step | None = None
    """A STEP's rows as this stage took them: what was sent is recorded beside them
    once it goes (`StageCore.sent`, for spot checks)."""


@dataclass(frozen=True)
class ForgetDownstream:
    """The next stage hears nothing more of the session (no CLOSE: it ends it itself)."""

    session: str


@dataclass(frozen=True)
class RingOpen:
    """Last stage: send the session's OPEN to the first stage its `loop` names."""

    open: wire.Open


@dataclass(frozen=True)
class RingSend:
    """Last stage: a token's step round to the first stage `node`."""

    node: str
    step: wire.Step


@dataclass(frozen=True)
class Wake:
    """Steps wait for the engine: run `StageCore.take_batch` until it gives none."""


@dataclass(frozen=True)
class Guess:
    """Last stage with an MTP head: guess up to `k` tokens after `token` at `position`
    on the engine thread; answer with `Guessed(reply, guesses)`."""

    reply: wire.Tokens
    position: int
    token: int
    k: int


@dataclass(frozen=True)
class Flush:
    """A batch's frames were sent: let them leave now."""


StageAction = (
    OpenOnStage
    | AdoptOnStage
    | CloseOnStage
    | Forward
    | ForgetDownstream
    | RingOpen
    | RingSend
    | Wake
    | Guess
    | Flush
)


@dataclass(frozen=True)
class Batch:
    """Steps for one engine call, and the last stage's verifiers of their guesses."""

    items: list[PendingStep]
    checks: Checks = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(p.request.n_rows for p in self.items)
