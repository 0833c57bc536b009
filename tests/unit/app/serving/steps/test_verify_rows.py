"""The last stage's row-by-row verification: the head only for rows that still matter."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest

from app.serving.steps.verify_rows import step_guesses_alone, step_verifying
from core.guess_acceptance import RowByRow
from core.sampling import make_rng
from core.stage import Stage, StepRequest, StepResult
from core.types import SamplingParams

pytestmark = pytest.mark.unit

V = 16


class _Head:
    """Stands in for a last stage: the logits of a row say 'next is token id + 1'
    (the row's token id is its hidden state's first value); records every evaluation."""

    def __init__(self) -> None:
        self.evaluated: list[tuple[str, int, int, int | None]] = []

    def step(self, requests: list[StepRequest]) -> list[StepResult]:
        out = []
        for r in requests:
            assert r.hidden is not None and not r.all_logits
            self.evaluated.append((r.session, r.start, r.n_rows, r.keep_until))
            logits = np.zeros((1, V), dtype=np.float32)
            logits[0, (int(r.hidden[-1, 0]) + 1) % V] = 9.0
            out.append(StepResult(r.session, r.start, logits=logits))
        return out


def _req(session: str, start: int, ids: list[int], keep: int | None = None) -> StepRequest:
    hidden = np.zeros((len(ids), 4), dtype=np.float32)
    hidden[:, 0] = ids
    return StepRequest(session, start, hidden=hidden, all_logits=len(ids) > 1, keep_until=keep)


def test_rows_after_the_first_wrong_guess_are_never_evaluated() -> None:
    head = _Head()
    greedy = SamplingParams()
    # "a": newest token 3, guesses 4 5 9 6: 4 and 5 stand, 9 is wrong (6 expected).
    # "b": no guesses, in the same batch.
    reqs = [_req("a", 10, [3, 4, 5, 9, 6], keep=10), _req("b", 7, [1])]
    checks = {0: (4, RowByRow((4, 5, 9, 6), greedy, make_rng(greedy)))}
    results, verdicts = step_verifying(cast(Stage, cast(Any, head)), reqs, checks)
    assert verdicts[0].tokens == (4, 5, 6) and verdicts[0].n_accepted == 2
    # One batch (a's newest token with its cut, and b), then a's guessed rows one by one
    # while they stood: rows 11 and 12; rows 13 and 14 never reach the head.
    assert head.evaluated == [("a", 10, 1, 10), ("b", 7, 1, None), ("a", 11, 1, None),
                              ("a", 12, 1, None)]  # fmt: skip
    first = results[0]
    assert isinstance(first, StepResult) and first.logits is not None
    assert first.logits.shape == (3, V)
    assert 1 not in verdicts


def test_all_guesses_standing_evaluates_every_row_once() -> None:
    head = _Head()
    greedy = SamplingParams()
    checks = {0: (2, RowByRow((4, 5), greedy, make_rng(greedy)))}
    _, verdicts = step_verifying(cast(Stage, cast(Any, head)), [_req("a", 0, [3, 4, 5])], checks)
    assert verdicts[0].tokens == (4, 5, 6)
    assert [e[1] for e in head.evaluated] == [0, 1, 2]


class _Trunk:
    """Stands in for a stage before the last: a row's output is its input times 2, one
    step call per list of requests recorded with every request's rows."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int, int, int | None]]] = []

    def step(self, requests: list[StepRequest]) -> list[StepResult]:
        self.calls.append([(r.session, r.start, r.n_rows, r.keep_until) for r in requests])
        out = []
        for r in requests:
            assert r.hidden is not None
            out.append(StepResult(r.session, r.start, hidden=r.hidden * 2))
        return out


def test_earlier_stages_evaluate_each_guessed_row_alone_and_send_all_rows_on() -> None:
    trunk = _Trunk()
    reqs = [_req("a", 10, [3, 4, 5, 9], keep=10), _req("b", 7, [1])]
    results = step_guesses_alone(cast(Stage, cast(Any, trunk)), reqs, {0: 3})
    # a's newest row (with its cut) batched with b, then each guess in a decode of its own.
    assert trunk.calls == [[("a", 10, 1, 10), ("b", 7, 1, None)], [("a", 11, 1, None)],
                           [("a", 12, 1, None)], [("a", 13, 1, None)]]  # fmt: skip
    a, b = results
    assert isinstance(a, StepResult) and a.hidden is not None and a.start == 10
    assert a.hidden[:, 0].tolist() == [6, 8, 10, 18]  # every row, in order
    assert isinstance(b, StepResult) and b.hidden is not None and b.hidden[0, 0] == 2
