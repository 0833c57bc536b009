"""The last stage's MTP guesses: feed the head after each trunk decode, and guess the
tokens after the one just chosen. Both run on the engine thread (the head shares
llama.cpp's model with the trunk); the worker only schedules them (app/serving/worker.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.errors import CoreError
from core.mtp_head import MtpGuesser
from core.stage import StepFailure, StepResult
from net import wire


def observe_results(
    mtp: MtpGuesser, steps: Sequence[wire.Step], results: Sequence[StepResult | StepFailure]
) -> None:
    """Feed the head's cache with every evaluated step whose tokens came with its rows
    (the first stage forwards them); a step without them leaves that session unguessed."""
    for step, result in zip(steps, results, strict=True):
        if isinstance(result, StepResult) and result.nextn is not None and step.tokens:
            # Guessed rows after a wrong guess are never evaluated (verify_rows): the
            # rows that were are a prefix of the step's tokens.
            n = result.nextn.shape[0]
            mtp.observe(step.session, step.start, step.tokens[:n], result.nextn)


def guess(
    mtp: MtpGuesser, session: str, pos: int, token: int, k: int, p_min: float
) -> tuple[int, ...]:
    """Up to k guesses after `token` at `pos`; none if the head cannot (a bad state must
    cost the guesses, never the answer)."""
    try:
        return mtp.guess(session, pos, token, k, p_min)
    except CoreError:
        return ()


def chosen_position(step: wire.Step, n_accepted: int) -> int:
    """Position of the token the last stage chose for `step`: after the step's real rows
    and the guesses it accepted."""
    return step.start + step.n_rows - len(step.guesses) + n_accepted


IGNORED_LIMIT = 2
"""Steps in a row that came back without the guesses offered before the stage stops
guessing for that session (a client with guesses off, or its adaptive policy resting)."""
PROBE_EVERY = 16
"""While stopped, guess again every this many steps: the client may want them again."""


@dataclass(frozen=True)
class GuessGate:
    """Whether a session's client uses the guesses it is sent; start with GuessGate()."""

    offered: bool = False
    """The latest reply carried guesses."""
    ignored: int = 0
    """Steps in a row that arrived without guesses although some had been offered."""
    steps: int = 0


def gate_step(gate: GuessGate, step_had_guesses: bool) -> GuessGate:
    """The gate after the session's next step arrived (pure)."""
    ignored = 0 if step_had_guesses else gate.ignored + (1 if gate.offered else 0)
    return GuessGate(gate.offered, ignored, gate.steps + 1)


def gate_open(gate: GuessGate) -> bool:
    """Guess for this step? Until a client twice ignored them, and then as a probe."""
    return gate.ignored < IGNORED_LIMIT or gate.steps % PROBE_EVERY == 0


def gate_offered(gate: GuessGate, guesses: Sequence[int]) -> GuessGate:
    return GuessGate(bool(guesses), gate.ignored, gate.steps)
