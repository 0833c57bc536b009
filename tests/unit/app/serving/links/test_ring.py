"""app.serving.rules.ring_turns: the last stage sends the next step itself exactly where
the client would have sent that step, and nowhere else; with guesses, the ones the client
would have guessed (no IO)."""

from __future__ import annotations

import dataclasses

import pytest

from app.serving.rules.ring_turns import RingGuesses, looped_step
from app.serving.session_records import ServedSession
from app.session.guess_tracker import GuessTracker
from core.guessing import GuessPolicy
from net import wire
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

LOOP = wire.Loop("first", "10.0.0.1:7000", "last")
OPEN = wire.Open("s1", "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 5, loop=LOOP)


def rows(step_id: int, start: int, n: int, guesses: tuple[int, ...] = ()) -> wire.Step:
    return wire.Step("s1", step_id, start, (0,) * n, b"\0" * 16 * n, n, 4, WireDtype.F32, guesses)


def reply(step_id: int, tokens: tuple[int, ...] = (42,), **changes: object) -> wire.Tokens:
    base = wire.Tokens("s1", step_id, tokens, (), 0, False, ())
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_looped_steps_are_the_ones_the_client_would_send() -> None:
    """Prompt in two chunks, then three tokens: each step the ring sends equals the
    step the client's own tracker builds from the same replies."""
    tracker = GuessTracker([1, 2, 3, 4, 5], max_tokens=8, policy=GuessPolicy.fixed(0))
    step = rows(1, 3, 2)  # the prompt's last chunk
    for token in (11, 12, 13):
        answer = reply(step.step_id, (token,))
        onward = looped_step(OPEN, step, answer)
        tracker.reply(answer.tokens, 0, 1.0)
        own = tracker.next_step()
        assert onward is not None and onward.step_id == step.step_id + 1
        assert (onward.start, onward.tokens, onward.guesses) == (own.start, own.tokens, ())
        assert onward.hidden is None and onward.n_rows == 1 and onward.keep_until is None
        step = rows(onward.step_id, onward.start, 1)


@pytest.mark.parametrize(
    ("open_", "step", "answer"),
    [
        (dataclasses.replace(OPEN, loop=None), rows(1, 3, 2), reply(1)),  # not asked for
        (OPEN, rows(1, 3, 2), reply(1, finished=True)),  # the last token
        (OPEN, rows(1, 3, 2), reply(1, guesses=(7, 8))),  # the MTP head's guesses ride back
        (OPEN, rows(2, 5, 3, guesses=(7, 8)), reply(2, (7, 8, 9), n_accepted=2)),  # verified
        (OPEN, rows(0, 0, 3), reply(0)),  # a chunk before the prompt's end
        (OPEN, rows(1, 3, 2), reply(0)),  # the reply of another step
    ],
)
def test_the_client_keeps_the_turn_everywhere_else(
    open_: wire.Open, step: wire.Step, answer: wire.Tokens
) -> None:
    assert looped_step(open_, step, answer) is None


# ---------------------------------------------------------------- guesses round the ring

TEXT = [5, 6, 7, 8, 9] * 6
"""What the model says, token by token: repetitive, so n-gram guesses find it."""


def _answer(history: list[int], step: wire.Step, truth: list[int]) -> tuple[int, ...]:
    """The model's tokens for `step` (accepted guesses, then its own), as the last stage's
    verification gives them when the model's next tokens are `truth`."""
    kept = 0
    for guess, token in zip(step.guesses, truth, strict=False):
        if guess != token:
            break
        kept += 1
    return tuple(truth[: kept + 1])


def _last_stage_takes(session: ServedSession, step: wire.Step) -> None:
    """What choose_tokens does with a step's rows before choosing."""
    if step.keep_until is not None:
        del session.history[step.keep_until :]
    session.history.extend(step.tokens)


@pytest.mark.parametrize("adaptive", [False, True])
def test_guessed_steps_round_the_ring_are_the_clients_own(adaptive: bool) -> None:
    """The ring guesses with the client's tracker: each step it sends equals the step a
    client tracker fed the same answers builds, and the answer is the model's text."""
    prompt = TEXT[:10]
    truth = TEXT[10:]
    loop = wire.Loop("first", "10.0.0.1:7000", "last", guesses=3, adaptive=adaptive)
    open_ = dataclasses.replace(OPEN, loop=loop, prompt_len=len(prompt), max_tokens=len(truth))
    session = ServedSession(open_)
    client = GuessTracker(prompt, len(truth), GuessPolicy(max_guesses=3, adaptive=adaptive))
    guesses = RingGuesses()
    step = wire.Step("s1", 0, 0, tuple(prompt), None, len(prompt), 0, WireDtype.F32)
    said: list[int] = []
    guessed = 0
    for trip in range(40):
        _last_stage_takes(session, step)
        chosen = _answer(session.history, step, truth[len(said) :])
        session.generated += len(chosen)
        said += chosen
        finished = session.generated >= len(truth)
        answer = reply(step.step_id, chosen, n_accepted=len(chosen) - 1, finished=finished)
        assert guesses.sent(session, step.step_id) == (trip > 0)
        onward = guesses.next_step(session, step, answer, now=float(trip))
        client.reply(chosen, len(chosen) - 1, 1.0)
        if finished:
            assert onward is None
            break
        own = client.next_step()
        assert onward is not None
        assert (onward.start, onward.tokens, onward.guesses) == (own.start, own.tokens, own.guesses)
        assert onward.keep_until == own.keep_until
        guessed += len(onward.guesses)
        step = onward
    assert said == truth
    assert guessed > 0


def test_a_step_the_ring_did_not_send_starts_the_tracker_again() -> None:
    """After the client's own step (a pause, a relink) the ring guesses on from the
    tokens the stage holds, and cuts the cache past them first."""
    prompt = TEXT[:10]
    loop = wire.Loop("first", "10.0.0.1:7000", "last", guesses=2, adaptive=False)
    open_ = dataclasses.replace(OPEN, loop=loop, prompt_len=len(prompt), max_tokens=20)
    session = ServedSession(open_, history=[*prompt, 5, 6], generated=3)
    # The client's step: token 7 at position 12 and two guesses; the model took one.
    step = wire.Step("s1", 4, 12, (7, 8, 1), None, 3, 0, WireDtype.F32, guesses=(8, 1))
    _last_stage_takes(session, step)
    answer = reply(4, (8, 9), n_accepted=1)
    session.generated += 2
    onward = RingGuesses().next_step(session, step, answer, now=0.0)
    assert onward is not None and onward.step_id == 5
    assert onward.start == 14 and onward.tokens[0] == 9  # 7 and 8 held, 9 is new
    assert onward.keep_until == 14  # the rejected guess at 14 goes first
    assert onward.guesses == (5, 6)  # ...9 was followed by 5, 6 in the prompt
