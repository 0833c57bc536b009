"""What a stage worker keeps: each served session's engine-side state, the steps queued
for the engine, and the counters its heartbeats and tests read. No IO."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from app.serving.steps.mtp_guesses import GuessGate
from core.stage import StepRequest
from core.types import SamplingParams
from net import wire


@dataclass
class ServedSession:
    """What the engine side keeps of a session; its links and ownership are in the rules."""

    open: wire.Open
    history: list[int] = field(default_factory=list)
    generated: int = 0
    rng: np.random.Generator | None = None
    params: SamplingParams | None = None
    """Last stage: the session's sampling settings, decoded once at OPEN."""
    expiry: asyncio.TimerHandle | None = None
    """While a link of the session is lost: drops it unless the link comes back in time."""
    guess_gate: GuessGate = field(default_factory=GuessGate)
    """Last stage with an MTP head: does the session's client use the guesses."""
    kept: int = 0
    """A replay that took a session's KV over: positions below this are held already
    and the replay's rows there are not computed (resume_rules)."""
    history_known: bool = True
    """Not the last stage: `history` names the tokens of every position its KV holds
    (a replay may take them over only then)."""
    last_active: float = field(default_factory=time.monotonic)
    """time.monotonic() when a step of the session was last taken or answered here: an
    idle session is closed (WorkerConfig.session_idle_s)."""


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
    rows_one_by_one: int = 0
    """A replay's rows evaluated one at a time, as first computed (replay_rows)."""
    last_compute_ms: float = 0.0
    last_queue_ms: float = 0.0
    """How long the rows of the last batch waited for the engine (the longest)."""


def guesses_of(future: asyncio.Future[tuple[int, ...]]) -> tuple[int, ...]:
    """The head's guesses, or none when guessing failed: the tokens still go out."""
    if future.cancelled() or future.exception() is not None:
        return ()
    return future.result()
