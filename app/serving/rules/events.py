"""What `app.serving.rules.sessions` takes and gives: events in, actions out, as frozen
dataclasses (generic over the link type `L`, which the rules only compare)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from net import wire
from net.errors import ErrorCode

L = TypeVar("L", bound=Hashable)
"""A link: opaque here, compared with ==."""


# ---------------------------------------------------------------- events (in)


@dataclass(frozen=True)
class FrameReceived(Generic[L]):
    """An OPEN, STEP or CLOSE from the upstream side (other frames change nothing here)."""

    link: L
    peer: str
    """The node id the link authenticated."""
    frame: wire.Frame
    role: str = ""
    """The role its certificate gives it ("worker", "client"; app.serving.rules.peers)."""


@dataclass(frozen=True)
class Refused(Generic[L]):
    """The worker refused a frame of `session` from `link` (a check of its own)."""

    link: L
    session: str
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class StepRejected(Generic[L]):
    """The stage refused the rows of a step of `session` from `link` before its engine
    saw them (app.serving.steps.row_checks): the session's KV is as it was, so it is
    kept for a replay to take over."""

    link: L
    session: str
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class LinkReady(Generic[L]):
    link: L
    peer: str


@dataclass(frozen=True)
class LinkClosed(Generic[L]):
    link: L
    reason: str


@dataclass(frozen=True)
class GraceExpired:
    session: str


@dataclass(frozen=True)
class Failed:
    """The session cannot go on (the engine, or an error from further down the chain)."""

    session: str
    code: ErrorCode
    message: str
    forward_close: bool = True
    """Tell the next stage to close it; False when the error came from there."""


@dataclass(frozen=True)
class TokensReady:
    """Last stage: the TOKENS of a step, to the client now or when it is back."""

    tokens: wire.Tokens


@dataclass(frozen=True)
class Drain:
    """Take no new sessions from now on."""


@dataclass(frozen=True)
class Shutdown:
    reason: str


Event = (
    FrameReceived[L]
    | Refused[L]
    | StepRejected[L]
    | LinkReady[L]
    | LinkClosed[L]
    | GraceExpired
    | Failed
    | TokensReady
    | Drain
    | Shutdown
)


# ---------------------------------------------------------------- actions (out)


@dataclass(frozen=True)
class Send(Generic[L]):
    link: L
    frame: wire.Frame


@dataclass(frozen=True)
class Release(Generic[L]):
    """The link is no longer the session's: its protocol state must forget the id."""

    link: L
    session: str


@dataclass(frozen=True)
class Begin:
    """A new session: open it on the stage and pass the OPEN down the chain."""

    open: wire.Open
    adopt: str = ""
    """The session whose KV this one takes over (gone from the table now)."""
    kept: int = 0
    """Positions of `adopt` kept; the replay's rows below this are not computed."""


@dataclass(frozen=True)
class Resumed:
    session: str
    owner: str


@dataclass(frozen=True)
class Take:
    """A step to compute (after the worker's own shape checks)."""

    step: wire.Step
    open: wire.Open


@dataclass(frozen=True)
class Looped:
    """First stage: the last stage joined the session's ring (its STEPs come from there)."""

    session: str
    last: str


@dataclass(frozen=True)
class Resent:
    """A step sent again after a resume; it was taken already and is dropped."""

    step: wire.Step


@dataclass(frozen=True)
class LinkLost:
    session: str
    reason: str
    arm_grace: bool
    """The session just became WAITING: start its grace timer (else one runs already)."""


@dataclass(frozen=True)
class CancelGrace:
    """The session has all its links again."""

    session: str


@dataclass(frozen=True)
class End:
    """The session is over here: free it on the stage, close or forget it downstream."""

    session: str
    forward_close: bool
    reason: str
    failed: bool = False


Action = (
    Send[L] | Release[L] | Begin | Resumed | Looped | Take | Resent | LinkLost | CancelGrace | End
)
