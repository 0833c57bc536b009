"""Verifying guessed tokens on the last stage: which guesses stand, and the next token.

A verified step evaluates the last real token followed by k guesses, so its k+1 logit
rows predict positions start+1 .. start+k+1. `accept_guesses` walks them in order:

- **greedy** (temperature 0): a guess stands while it equals the row's argmax; the
  first row that disagrees gives its own argmax instead, and after k agreeing guesses
  the last row gives one more. So the output is the longest agreeing prefix plus one,
  exactly the tokens plain greedy decoding would have produced.
- **sampled**: speculative sampling's rule, which keeps the target distribution. For a
  guess d drawn from a guess distribution q, accept with probability
  min(1, p(d) / q(d)); on a reject draw from the residual max(0, p - q), renormalised.
  An n-gram guess (or an argmax MTP guess) is a point mass, q(d) = 1, so this is
  "accept with probability p(d), otherwise draw from p without d". `p` is the filtered
  distribution `core.sampling.sample` draws from (penalty, top-k, top-p, min-p,
  temperature), and the draws come from the request's seeded RNG, so a request
  replays identically.

Pure: logits, guesses, settings and the RNG in; tokens out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from core.sampling import (
    apply_repetition_penalty,
    greedy,
    min_p_filter,
    softmax,
    top_k_filter,
    top_p_filter,
)
from core.types import SamplingParams

Probs = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Verdict:
    tokens: tuple[int, ...]
    """The accepted guesses followed by one token of the target's own."""
    n_accepted: int


def target_probs(logits: npt.ArrayLike, params: SamplingParams, history: Sequence[int]) -> Probs:
    """The distribution `core.sampling.sample` draws from, as probabilities."""
    x = np.asarray(logits, dtype=np.float32)
    x = apply_repetition_penalty(x, history, params.repetition_penalty, params.repetition_window)
    x = min_p_filter(top_p_filter(top_k_filter(x, params.top_k), params.top_p), params.min_p)
    return softmax(x, params.temperature)


def _draw(p: Probs, rng: np.random.Generator) -> int:
    cumulative = np.cumsum(p)
    u = rng.random() * cumulative[-1]
    return min(int(np.searchsorted(cumulative, u, side="right")), p.size - 1)


class RowByRow:
    """`accept_guesses` one logit row at a time, so a last stage computes the head only for
    rows that can still matter: `feed(row j)` gives the verdict, or None when guess j
    stood and row j+1 decides next. The head over a large vocabulary is most of a
    verified trip's cost (Gemma 3: ~30 ms of CPU per row), and every row after the first
    rejected guess would be thrown away; the draws from `rng` are the same as the
    all-rows form's, so a seeded request replays identically either way."""

    def __init__(
        self,
        guesses: Sequence[int],
        params: SamplingParams,
        rng: np.random.Generator,
        history: Sequence[int] = (),
        guess_probs: Sequence[Probs | None] | None = None,
    ) -> None:
        self.guesses = tuple(int(d) for d in guesses)
        self.params = params
        self.rng = rng
        self.guess_probs = guess_probs
        self._seen = list(history)
        self._chosen: list[int] = []

    @property
    def rows_fed(self) -> int:
        return len(self._chosen)

    def _done(self, tok: int) -> Verdict:
        self._chosen.append(tok)
        return Verdict(tuple(self._chosen), len(self._chosen) - 1)

    def feed(self, row: npt.ArrayLike) -> Verdict | None:
        j, k, params = len(self._chosen), len(self.guesses), self.params
        if j > k:
            raise ValueError(f"{k} guesses are decided by {k + 1} rows; row {j + 1} was fed")
        if params.greedy:
            x = apply_repetition_penalty(
                np.asarray(row, dtype=np.float32),
                self._seen,
                params.repetition_penalty,
                params.repetition_window,
            )
            tok = greedy(x)
            if j < k and tok == self.guesses[j]:
                self._chosen.append(tok)
                self._seen.append(tok)
                return None
            return self._done(tok)
        p = target_probs(row, params, self._seen)
        if j == k:
            return self._done(_draw(p, self.rng))
        d = self.guesses[j]
        q = None if self.guess_probs is None else self.guess_probs[j]
        q_d = 1.0 if q is None else float(q[d])
        if q_d > 0 and self.rng.random() < min(1.0, float(p[d]) / q_d):
            self._chosen.append(d)
            self._seen.append(d)
            return None
        if q is None:
            residual = p.copy()
            residual[d] = 0.0
        else:
            residual = np.maximum(p - np.asarray(q, dtype=np.float64), 0.0)
        if residual.sum() <= 0.0:  # p was the point mass itself: the guess was certain
            residual = p
        return self._done(_draw(residual / residual.sum(), self.rng))


def accept_guesses(
    rows: npt.NDArray[np.float32],
    guesses: Sequence[int],
    params: SamplingParams,
    rng: np.random.Generator,
    history: Sequence[int] = (),
    guess_probs: Sequence[Probs | None] | None = None,
) -> Verdict:
    """Check `guesses` against the k+1 logit `rows` (row j predicts what follows the
    j-th evaluated token); `history` is every token up to and including the first
    evaluated one. `guess_probs[j]`, when given, is the guess distribution q of guess j;
    None (or omitted) means a point mass on the guess."""
    k = len(guesses)
    if rows.ndim != 2 or rows.shape[0] != k + 1:
        raise ValueError(f"{k} guesses need {k + 1} logit rows, got shape {rows.shape}")
    check = RowByRow(guesses, params, rng, history, guess_probs)
    for j in range(k + 1):
        verdict = check.feed(rows[j])
        if verdict is not None:
            return verdict
    raise AssertionError("row k always decides")  # pragma: no cover
