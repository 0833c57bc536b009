"""Verifying guesses: greedy = longest agreeing prefix + 1; sampled keeps the target law."""

from __future__ import annotations

import numpy as np
import pytest

from core.guess_acceptance import RowByRow, accept_guesses, target_probs
from core.sampling import make_rng, sample
from core.types import SamplingParams

pytestmark = pytest.mark.unit

V = 8


def _rows(*argmaxes: int) -> np.ndarray:
    rows = np.zeros((len(argmaxes), V), dtype=np.float32)
    for i, a in enumerate(argmaxes):
        rows[i, a] = 5.0
    return rows


def test_greedy_accepts_the_agreeing_prefix_plus_one() -> None:
    rng = make_rng(SamplingParams())
    greedy = SamplingParams()
    assert accept_guesses(_rows(3, 4, 5, 6), (3, 4, 5), greedy, rng).tokens == (3, 4, 5, 6)
    v = accept_guesses(_rows(3, 4, 5, 6), (3, 1, 5), greedy, rng)
    assert v.tokens == (3, 4) and v.n_accepted == 1
    v = accept_guesses(_rows(2, 4, 5, 6), (3, 4, 5), greedy, rng)
    assert v.tokens == (2,) and v.n_accepted == 0
    assert accept_guesses(_rows(7), (), greedy, rng).tokens == (7,)


def test_greedy_matches_plain_sampling_with_a_repetition_penalty() -> None:
    params = SamplingParams(repetition_penalty=3.0)
    rows = np.array([[0, 4, 3, 0], [0, 4, 3.5, 0]], dtype=np.float32)
    # Row 0 picks 1; the penalty on the now-seen 1 makes row 1 pick 2.
    v = accept_guesses(rows, (1,), params, make_rng(params), history=[0])
    expected = [sample(rows[0], params, make_rng(params), [0])]
    expected.append(sample(rows[1], params, make_rng(params), [0, expected[0]]))
    assert list(v.tokens) == expected == [1, 2]


def test_rows_must_match_the_guesses() -> None:
    with pytest.raises(ValueError, match="need 3 logit rows"):
        accept_guesses(_rows(1, 2), (1, 2), SamplingParams(), make_rng(SamplingParams()))


def test_sampled_verification_keeps_the_target_distribution() -> None:
    # Whatever the guess, the first token out must follow p (speculative sampling).
    params = SamplingParams(temperature=1.0, seed=3)
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05, 1e-9, 1e-9, 1e-9, 1e-9], dtype=np.float32))
    rows = np.stack([logits, logits])
    p = target_probs(logits, params, [])
    rng = make_rng(params)
    n = 8000
    for guess in (0, 3):
        counts = np.zeros(V)
        accepted = 0
        for _ in range(n):
            v = accept_guesses(rows, (guess,), params, rng)
            counts[v.tokens[0]] += 1
            accepted += v.n_accepted
        assert np.abs(counts / n - p).max() < 0.02, guess
        assert abs(accepted / n - p[guess]) < 0.02  # accepted with probability p(guess)


def test_sampled_verification_with_a_guess_distribution() -> None:
    params = SamplingParams(temperature=1.0, seed=5)
    logits = np.log(np.array([0.6, 0.3, 0.1] + [1e-9] * 5, dtype=np.float32))
    q = np.array([0.2, 0.7, 0.1] + [0.0] * 5)
    rng = make_rng(params)
    guess_rng = np.random.default_rng(9)
    counts = np.zeros(V)
    n = 8000
    for _ in range(n):
        guess = int(guess_rng.choice(V, p=q))
        v = accept_guesses(np.stack([logits, logits]), (guess,), params, rng, guess_probs=[q])
        counts[v.tokens[0]] += 1
    assert np.abs(counts / n - target_probs(logits, params, [])).max() < 0.02


def test_sampled_verification_replays_with_the_same_seed() -> None:
    params = SamplingParams(temperature=0.9, seed=42)
    rows = np.random.default_rng(0).normal(size=(4, V)).astype(np.float32)
    a = [accept_guesses(rows, (1, 2, 3), params, make_rng(params)).tokens for _ in range(3)]
    assert a[0] == a[1] == a[2]


def test_row_by_row_stops_at_the_first_reject_and_equals_all_rows() -> None:
    greedy = SamplingParams()
    rows = _rows(3, 4, 5, 6)
    check = RowByRow((3, 1, 5), greedy, make_rng(greedy))
    assert check.feed(rows[0]) is None  # guess 3 stood: row 1 decides next
    verdict = check.feed(rows[1])  # guess 1 is wrong: rows 2 and 3 are never needed
    assert verdict == accept_guesses(rows, (3, 1, 5), greedy, make_rng(greedy))
    assert verdict is not None and verdict.tokens == (3, 4) and check.rows_fed == 2
    done = RowByRow((3,), greedy, make_rng(greedy))
    assert done.feed(rows[0]) is None and done.feed(rows[1]) is not None
    with pytest.raises(ValueError, match="rows"):
        done.feed(rows[2])


def test_row_by_row_sampled_draws_like_all_rows() -> None:
    params = SamplingParams(temperature=0.9, seed=5)
    logits = np.random.default_rng(1).normal(0, 2, (5, V)).astype(np.float32)
    for guesses in [(0, 1, 2, 3), (int(np.argmax(logits[0])), 2, 2, 2), (7, 7, 7, 7)]:
        want = accept_guesses(logits, guesses, params, make_rng(params), history=[1])
        check = RowByRow(guesses, params, make_rng(params), history=[1])
        got = None
        for row in logits:
            got = check.feed(row)
            if got is not None:
                break
        assert got == want and check.rows_fed == want.n_accepted + 1
