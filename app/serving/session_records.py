"""What a stage keeps: one record per session, the steps queued for the engine, and the
counters its heartbeats and tests read. No IO.

A session's record is the stage's only table of it (the engine's KV slots in core.stage
aside): its links and ownership, decided by app.serving.rules.sessions, and what its
steps need (tokens held, sampling, guesses, replay skips, timers as deadlines), decided
by app.serving.rules.stage. The asyncio shell keeps nothing per session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic

import numpy as np

from app.serving.rules.events import L
from app.serving.steps.mtp_guesses import GuessGate
from app.session.guess_tracker import GuessTracker
from core.stage import StepRequest
from core.types import SamplingParams
from net import wire


@dataclass
class RingGuess:
    """A last stage's guesses for a session round the ring (app.serving.rules.ring_turns)."""

    tracker: GuessTracker
    sent_step: int
    """The step id of the last step the ring sent."""
    sent_at: float
    """time.perf_counter() when it went: its answer's trip."""


class LinkState(Enum):
    LINKED = "linked"
    """Every link the session needs is there."""
    WAITING = "waiting"
    """A link was lost; the session waits `resume_grace` for it to come back."""


@dataclass
class SessionRecord(Generic[L]):
    """Everything a stage keeps of one session; `L` is the shell's link type."""

    open: wire.Open
    # ---- links and ownership (app.serving.rules.sessions)
    owner_id: str = ""
    """The upstream node: only it may resume the session over a new link."""
    owner: L | None = None
    """The link the session's frames come from; None while the upstream redials."""
    reply: L | None = None
    """Last stage: the client's own link, for TOKENS (None while the client redials)."""
    loop: L | None = None
    """First stage: the last stage's link, its STEPs of the session's ring (`Open.loop`)."""
    replies: list[wire.Tokens] = field(default_factory=list)
    """Last stage: the TOKENS the client may not have, sent again when its link is
    replaced: the latest, and those of the ring since the client's last turn (a
    TOKENS not `looped`, which the client answered with the step that came next)."""
    last_step_id: int = -1
    """Highest step taken."""
    state: LinkState = LinkState.LINKED
    grace_reason: str = ""
    """Why the session became WAITING, for the End that follows if no resume comes."""
    grace_until: float | None = None
    """While WAITING: the stage clock's time at which the session ends unless resumed."""
    # ---- its steps (app.serving.rules.stage)
    history: list[int] = field(default_factory=list)
    generated: int = 0
    rng: np.random.Generator | None = None
    params: SamplingParams | None = None
    """Last stage: the session's sampling settings, decoded once at OPEN."""
    guess_gate: GuessGate = field(default_factory=GuessGate)
    """Last stage with an MTP head: does the session's client use the guesses."""
    kept: int = 0
    """A replay that took a session's KV over: positions below this are held already
    and the replay's rows there are not computed (resume_rules)."""
    history_known: bool = True
    """Not the last stage: `history` names the tokens of every position its KV holds
    (a replay may take them over only then)."""
    last_active: float = 0.0
    """The stage clock's time when a step of the session was last taken or answered
    here: an idle session is closed (WorkerConfig.session_idle_s)."""
    ring_guess: RingGuess | None = None
    """Last stage, a ring that guesses: the session's guess tracker (ring_turns)."""
    ring_node: str | None = None
    """Last stage: the first stage the session's steps go round to, while its ring
    link carries them (`Open.loop`)."""


ServedSession = SessionRecord[Any]
"""A session's record where its links do not matter (the steps, the ring's guesses)."""


@dataclass
class PendingStep:
    step: wire.Step
    request: StepRequest
    arrived: float
    waited: int = 0
    """Engine steps that passed this item over (core.scheduling ages prompt chunks)."""


@dataclass
class WorkerStats:
    steps: int = 0
    batches: int = 0
    rows: int = 0
    errors: int = 0
    sessions_opened: int = 0
    sessions_resumed: int = 0
    """Sessions an upstream worker resumed over a new link after its path died."""
    resent_steps: int = 0
    """Steps received twice after a resume (already handled, dropped)."""
    tokens: int = 0
    """Tokens sampled here (last stage only)."""
    sessions_adopted: int = 0
    """Replays that took over the KV of the session they continue."""
    rows_reused: int = 0
    """Positions adopted sessions held: the replay's rows there were not computed here
    (nor, past a middle stage, sent on)."""
    sessions_idle_closed: int = 0
    """Sessions closed for taking no step for WorkerConfig.session_idle_s."""
    rows_refused: int = 0
    """Steps whose rows failed the per-step checks (app.serving.steps.row_checks)."""
    rows_one_by_one: int = 0
    """A replay's rows evaluated one at a time, as first computed (replay_rows)."""
    hidden_bytes_sent: int = 0
    """Hidden-state rows sent on to the next stage, as the wire encodes them."""
    rows_recomputed: int = 0
    """Rows of another stage's record recomputed here for spot checks."""
    check_bytes: int = 0
    """Rows of spot-check records this stage sent (its own) or read (another's, to
    recompute), as the wire encodes them: what the checks move, against
    `hidden_bytes_sent`."""
    last_compute_ms: float = 0.0
    last_queue_ms: float = 0.0
    """How long the rows of the last batch waited for the engine (the longest)."""
