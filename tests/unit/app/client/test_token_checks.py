"""app.client.token_checks, and a Generation refusing TOKENS that cannot answer its step."""

from __future__ import annotations

import numpy as np
import pytest

from app.client.generation import Generation, Refused, TokenEvent
from app.client.recovery import accused
from app.client.token_checks import Asked, tokens_problem
from app.errors import BadTokens, RowsRefused, StageFailed, stage_error
from app.session.rows_refusal import RowsRefusal, rows_refused_message
from core.types import SamplingParams
from net import wire
from net.errors import ErrorCode

pytestmark = pytest.mark.unit

GREEDY = SamplingParams()
WALL = 1_700_000_000_000_000_000


def reply(
    *toks: int, n_accepted: int | None = None, guessed: int = 0, logits: bytes = b""
) -> wire.Tokens:
    accepted = len(toks) - 1 if n_accepted is None else n_accepted
    return wire.Tokens("s", 0, toks, (), accepted, False, (), logits, guessed=guessed)


def test_a_reply_that_fits_its_step_passes() -> None:
    asked = Asked(carried=2, room=5, sampling=GREEDY, vocab_size=100)
    assert tokens_problem(reply(4, 5, 9), asked) is None
    ring = Asked(carried=2, room=5, sampling=GREEDY, round_the_ring=True, vocab_size=100)
    assert tokens_problem(reply(4, 9, guessed=2), ring) is None


@pytest.mark.parametrize(
    ("frame", "asked", "problem"),
    [
        (reply(), Asked(0, 5, GREEDY), "no token"),
        (reply(1, 2, 3, guessed=1), Asked(1, 5, GREEDY, True), "3 tokens for a step of 1 guesses"),
        (reply(1, 2, n_accepted=0, guessed=2), Asked(2, 5, GREEDY, True), "0 guesses accepted"),
        (reply(1, 2), Asked(1, 1, GREEDY), "where 1 were left of max_tokens"),
        (reply(100), Asked(0, 5, GREEDY, vocab_size=100), "outside the vocabulary of 100"),
    ],
)
def test_a_reply_that_cannot_answer_its_step_says_why(
    frame: wire.Tokens, asked: Asked, problem: str
) -> None:
    found = tokens_problem(frame, asked)
    assert found is not None and problem in found


def test_the_logits_row_holds_a_greedy_or_top_k_choice_to_it() -> None:
    row = np.array([0.1, 3.0, 2.0, -1.0], dtype=np.float32)
    assert tokens_problem(reply(1), Asked(0, 5, GREEDY), row) is None
    found = tokens_problem(reply(2), Asked(0, 5, GREEDY), row)
    assert found is not None and "not the greedy choice 1" in found
    top2 = SamplingParams(temperature=0.8, top_k=2)
    assert tokens_problem(reply(2), Asked(0, 5, top2), row) is None
    found = tokens_problem(reply(0), Asked(0, 5, top2), row)
    assert found is not None and "not among the top 2" in found
    # A repetition penalty changes the logits before the choice: nothing to hold it to.
    penalised = SamplingParams(repetition_penalty=1.3)
    assert tokens_problem(reply(2), Asked(0, 5, penalised), row) is None


def test_a_generation_takes_none_of_tokens_outside_the_vocabulary() -> None:
    gen = Generation("s", "m", "client", (1, 2, 3), 8, vocab_size=50)
    gen.opening(0.0, WALL)
    (event,) = gen.receive(wire.Tokens("s", 0, (50,), (), 0, False, ()), 0.0)
    assert isinstance(event, Refused) and isinstance(event.error, BadTokens)
    assert "token 50 outside the vocabulary" in str(event.error) and gen.over
    honest = Generation("s", "m", "client", (1, 2, 3), 8, vocab_size=50)
    honest.opening(0.0, WALL)
    (event,) = honest.receive(wire.Tokens("s", 0, (49,), (), 0, False, ()), 0.0)
    assert isinstance(event, TokenEvent) and event.tokens == (49,)


def test_a_greedy_token_that_is_not_the_argmax_of_its_logits_is_refused() -> None:
    gen = Generation("s", "m", "client", (1, 2, 3), 8)
    gen.opening(0.0, WALL)
    logits = np.array([0.0, 5.0, 1.0], dtype=np.float32).tobytes()
    (event,) = gen.receive(wire.Tokens("s", 0, (2,), (), 0, False, (), logits), 0.0)
    assert isinstance(event, Refused) and isinstance(event.error, BadTokens)


def test_a_rows_refusal_reads_as_its_typed_error() -> None:
    message = rows_refused_message(RowsRefusal("not-finite", 8), "step 4: row 0 holds NaN")
    error = stage_error(ErrorCode.STAGE_ERROR, message)
    assert isinstance(error, RowsRefused) and error.error_code is ErrorCode.STAGE_ERROR
    assert (error.check, error.from_layer) == ("not-finite", 8)
    assert "not-finite" in str(error) and "row 0 holds NaN" in str(error)
    # Another code with the same text is read as plain text.
    assert type(stage_error(ErrorCode.BAD_VALUE, message)) is StageFailed


def test_the_sender_of_refused_rows_or_the_last_stage_of_bad_tokens_is_accused() -> None:
    stages = [("a", 0, 8), ("b", 8, 16), ("c", 16, 24)]
    assert accused(RowsRefused("x", "zero-row", 16), stages) == ("b",)
    assert accused(RowsRefused("x", "zero-row", 8), stages) == ("a",)
    assert accused(BadTokens("token 99 outside"), stages) == ("c",)
    assert accused(StageFailed(ErrorCode.STAGE_ERROR, "gone"), stages) == ()
