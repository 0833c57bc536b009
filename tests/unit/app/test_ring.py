"""app.serving.ring.looped_step: the last stage sends the next step itself exactly where
the client would have sent that step, and nowhere else (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from app.client.ngram_drafts import DraftTracker
from app.serving.ring import looped_step
from core.drafting import GuessPolicy
from net import wire
from net.tensors import WireDtype

pytestmark = pytest.mark.unit

LOOP = wire.Loop("first", "10.0.0.1:7000", "last")
OPEN = wire.Open("s1", "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 5, loop=LOOP)


def rows(step_id: int, start: int, n: int, drafts: tuple[int, ...] = ()) -> wire.Step:
    return wire.Step("s1", step_id, start, (0,) * n, b"\0" * 16 * n, n, 4, WireDtype.F32, drafts)


def reply(step_id: int, tokens: tuple[int, ...] = (42,), **changes: object) -> wire.Tokens:
    base = wire.Tokens("s1", step_id, tokens, (), 0, False, ())
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_looped_steps_are_the_ones_the_client_would_send() -> None:
    """Prompt in two chunks, then three tokens: each step the ring sends equals the
    step the client's own tracker builds from the same replies."""
    tracker = DraftTracker([1, 2, 3, 4, 5], max_tokens=8, policy=GuessPolicy.fixed(0))
    step = rows(1, 3, 2)  # the prompt's last chunk
    for token in (11, 12, 13):
        answer = reply(step.step_id, (token,))
        onward = looped_step(OPEN, step, answer)
        tracker.reply(answer.tokens, 0, 1.0)
        own = tracker.next_step()
        assert onward is not None and onward.step_id == step.step_id + 1
        assert (onward.start, onward.tokens, onward.drafts) == (own.start, own.tokens, ())
        assert onward.hidden is None and onward.n_rows == 1 and onward.keep_until is None
        step = rows(onward.step_id, onward.start, 1)


@pytest.mark.parametrize(
    ("open_", "step", "answer"),
    [
        (dataclasses.replace(OPEN, loop=None), rows(1, 3, 2), reply(1)),  # not asked for
        (OPEN, rows(1, 3, 2), reply(1, finished=True)),  # the last token
        (OPEN, rows(1, 3, 2), reply(1, drafts=(7, 8))),  # the MTP head's guesses ride back
        (OPEN, rows(2, 5, 3, drafts=(7, 8)), reply(2, (7, 8, 9), n_accepted=2)),  # verified
        (OPEN, rows(0, 0, 3), reply(0)),  # a chunk before the prompt's end
        (OPEN, rows(1, 3, 2), reply(0)),  # the reply of another step
    ],
)
def test_the_client_keeps_the_turn_everywhere_else(
    open_: wire.Open, step: wire.Step, answer: wire.Tokens
) -> None:
    assert looped_step(open_, step, answer) is None
