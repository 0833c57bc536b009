"""The client's guessing bookkeeping: positions, keep_until and guesses per step."""

from __future__ import annotations

import pytest

from app.session.guess_tracker import GuessTracker
from core.guessing import GuessPolicy

pytestmark = pytest.mark.unit


def test_positions_and_keep_until_follow_accepts_and_rejects() -> None:
    prompt = [1, 2, 3, 4, 1, 2]
    t = GuessTracker(prompt, max_tokens=20, policy=GuessPolicy.fixed(3))
    t.reply([3], 0, 100.0)  # the prompt's answer: 3
    step = t.next_step()
    # After "... 1 2 3" the text guesses "4 1 2"; rows start at the new token's position.
    assert step == type(step)(6, (3, 4, 1, 2), (4, 1, 2), None)
    t.reply([4, 1, 9], 2, 100.0)  # 4 and 1 stood, 2 was wrong; the model said 9
    step = t.next_step()
    assert step.start == 9 and step.keep_until == 9  # rows 9 (the rejected 2) dropped
    assert step.tokens[0] == 9
    assert t.proposed == 3 and t.accepted == 2
    t.reply([*step.guesses, 7], len(step.guesses), 100.0)  # everything stood
    after = t.next_step()
    assert after.keep_until is None and after.start == 10 + len(step.guesses)


def test_no_guesses_past_max_tokens_and_none_without_a_match() -> None:
    t = GuessTracker([1, 2, 1, 2], max_tokens=3, policy=GuessPolicy.fixed(4))
    t.reply([1], 0, 1.0)
    assert len(t.next_step().guesses) == 1  # 3 - 1 produced - the bonus token
    plain = GuessTracker([1, 2, 3], max_tokens=10, policy=GuessPolicy.fixed(4))
    plain.reply([4], 0, 1.0)
    assert plain.next_step().guesses == ()


def test_after_steps_that_went_round_the_client_builds_the_step_a_tracker_would() -> None:
    """The ring guessed the last steps (their guesses unknown here, only how many were
    rejected): when the turn comes back, the client's step starts at the newest token
    and cuts the rejected guesses, as a tracker that guessed them would."""
    prompt = [1, 2, 3, 4, 1, 2]
    own = GuessTracker(prompt, max_tokens=20, policy=GuessPolicy.fixed(3))
    told = GuessTracker(prompt, max_tokens=20, policy=GuessPolicy.fixed(3))
    own.reply([3], 0, 1.0)
    told.went_round([3])  # the prompt's answer, its next step sent round the ring
    own.next_step()  # (3, 4, 1, 2): the ring's step, with guesses 4 1 2
    own.reply([4, 1, 9], 2, 1.0)
    told.went_round([4, 1, 9], rejected=1)  # the ring's step carried 3, 2 stood
    assert told.next_step() == own.next_step()
    assert told.produced == own.produced == 4
    clean = GuessTracker(prompt, max_tokens=20, policy=GuessPolicy.fixed(3))
    clean.went_round([3])
    assert clean.next_step().keep_until is None  # nothing rejected: nothing to cut
