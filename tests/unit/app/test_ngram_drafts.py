"""The client's drafting bookkeeping: positions, keep_until and guesses per step."""

from __future__ import annotations

import pytest

from app.draft_tracker import DraftTracker
from core.drafting import GuessPolicy

pytestmark = pytest.mark.unit


def test_positions_and_keep_until_follow_accepts_and_rejects() -> None:
    prompt = [1, 2, 3, 4, 1, 2]
    t = DraftTracker(prompt, max_tokens=20, policy=GuessPolicy.fixed(3))
    t.reply([3], 0, 100.0)  # the prompt's answer: 3
    step = t.next_step()
    # After "... 1 2 3" the text guesses "4 1 2"; rows start at the new token's position.
    assert step == type(step)(6, (3, 4, 1, 2), (4, 1, 2), None)
    t.reply([4, 1, 9], 2, 100.0)  # 4 and 1 stood, 2 was wrong; the model said 9
    step = t.next_step()
    assert step.start == 9 and step.keep_until == 9  # rows 9 (the rejected 2) dropped
    assert step.tokens[0] == 9
    assert t.proposed == 3 and t.accepted == 2
    t.reply([*step.drafts, 7], len(step.drafts), 100.0)  # everything stood
    after = t.next_step()
    assert after.keep_until is None and after.start == 10 + len(step.drafts)


def test_no_guesses_past_max_tokens_and_none_without_a_match() -> None:
    t = DraftTracker([1, 2, 1, 2], max_tokens=3, policy=GuessPolicy.fixed(4))
    t.reply([1], 0, 1.0)
    assert len(t.next_step().drafts) == 1  # 3 - 1 produced - the bonus token
    plain = DraftTracker([1, 2, 3], max_tokens=10, policy=GuessPolicy.fixed(4))
    plain.reply([4], 0, 1.0)
    assert plain.next_step().drafts == ()
