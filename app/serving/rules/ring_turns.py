"""Where the last stage sends the next step itself (the ring, `Open.loop`): pure
decisions, no IO. `looped_step` is a plain ring's step; `RingGuesses` makes the guesses of
a ring that guesses, with the client's own `GuessTracker` on the session's tokens.
app.serving.rules.stage decides with them; app.serving.links.ring carries the steps.
"""

from __future__ import annotations

import time
from dataclasses import replace

from app.errors import ClientError
from app.serving.session_records import RingGuess, ServedSession
from app.session.guess_tracker import GuessTracker
from app.session.token_step import token_step
from core.guessing import GuessPolicy
from net import wire


def looped_step(open_: wire.Open, step: wire.Step, reply: wire.Tokens) -> wire.Step | None:
    """The step the client would send after `reply`, when the last stage may send it to
    the first stage instead (pure): None where the client keeps the turn."""
    if not may_go_round(open_, step, reply) or step.guesses or len(reply.tokens) != 1:
        return None
    # The chosen token's step, as the client would build it.
    return token_step(
        step.session,
        step.step_id + 1,
        step.start + step.n_rows,
        reply.tokens,
        sent_at_ns=time.time_ns(),
    )


class RingGuesses:
    """The guesses of the sessions that guess round the ring (no IO): per session the
    client's `GuessTracker` (its record's `ring_guess`), fed the last stage's answers.
    Where the answered step was not the ring's (the prompt's last chunk, a step of the
    client's after a pause), the tracker starts again from the tokens the stage holds."""

    def next_step(
        self, session: ServedSession, step: wire.Step, reply: wire.Tokens, now: float
    ) -> wire.Step | None:
        """The step after `reply`, with the guesses the tracker chooses; None where the
        client keeps the turn (`may_go_round`)."""
        loop = session.open.loop
        if loop is None or not loop.guesses or not may_go_round(session.open, step, reply):
            return None
        held = session.ring_guess
        if held is not None and held.sent_step == step.step_id:
            try:
                held.tracker.reply(reply.tokens, reply.n_accepted, (now - held.sent_at) * 1e3)
            except ClientError:  # an answer that does not fit the step: start again below
                held = None
        else:
            held = None
        if held is None:
            # The stage's tokens before this step's guesses, then the answer's tokens.
            known = session.history[: step.start + step.n_rows - len(step.guesses)]
            policy = GuessPolicy(max_guesses=loop.guesses, adaptive=loop.adaptive)
            tracker = GuessTracker(known, session.open.max_tokens, policy)
            tracker.produced = session.generated - len(reply.tokens)
            tracker.went_round(reply.tokens, len(step.guesses) - reply.n_accepted)
            held = session.ring_guess = RingGuess(tracker, -1, now)
        nxt = held.tracker.next_step()
        held.sent_step, held.sent_at = step.step_id + 1, now
        return token_step(
            step.session,
            step.step_id + 1,
            nxt.start,
            nxt.tokens,
            guesses=nxt.guesses,
            keep_until=nxt.keep_until,
            sent_at_ns=time.time_ns(),
        )

    @staticmethod
    def sent(session: ServedSession, step_id: int) -> bool:
        """The ring sent this step (with the guesses it carries)."""
        held = session.ring_guess
        return held is not None and held.sent_step == step_id


def may_go_round(open_: wire.Open, step: wire.Step, reply: wire.Tokens) -> bool:
    """Whether the last stage may send the step after `reply` itself (pure)."""
    if open_.loop is None or reply.finished or reply.guesses:
        return False
    if reply.step_id != step.step_id:
        return False
    return step.start + step.n_rows >= open_.prompt_len  # not a chunk before the last


def go_round(
    guesses: RingGuesses, session: ServedSession, step: wire.Step, reply: wire.Tokens, now: float
) -> tuple[wire.Tokens, wire.Step | None]:
    """The reply to `step` and the step the last stage sends round to the first stage
    after it (`looped_step`, or with guesses `guesses`), None where the client keeps the
    turn. The reply is marked `looped` when a step goes, and carries the answered step's
    guess count when the ring sent that step with guesses."""
    if step.guesses and guesses.sent(session, step.step_id):
        reply = replace(reply, guessed=len(step.guesses))
    if session.ring_node is None:
        return reply, None
    loop = session.open.loop
    if loop is not None and loop.guesses:
        onward = guesses.next_step(session, step, reply, now)
    else:
        onward = looped_step(session.open, step, reply)
    if onward is None:
        return reply, None
    return replace(reply, looped=True), onward
