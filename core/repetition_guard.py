"""Ending an answer that loops: a pure test over the tokens generated so far.

A small model can fall into a loop ("la femme au roi, la femme au roi, ...") and would
spend the whole token budget on it. Clients (the chat window, `sangama chat`, the API)
stop such an answer once its tail is one n-gram repeated over and over.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LoopGuard", "looping_tail"]


@dataclass(frozen=True)
class LoopGuard:
    """When a repeated tail counts as a loop.

    A tail of k copies of an n-gram (1 <= n <= max_ngram) is a loop when it covers at least
    `min_span` tokens and k >= `min_repeats`: a short n-gram must repeat many times ("1, 1,
    1" or a run of dashes can be meant), a long one three times (nobody means a 20-token
    sentence three times in a row).
    """

    max_ngram: int = 32
    min_repeats: int = 3
    min_span: int = 24

    def __post_init__(self) -> None:
        if self.max_ngram < 1 or self.min_repeats < 2 or self.min_span < 2:
            raise ValueError("max_ngram >= 1, min_repeats >= 2 and min_span >= 2")

    def repeats_needed(self, n: int) -> int:
        return max(self.min_repeats, math.ceil(self.min_span / n))


def looping_tail(tokens: Sequence[int], guard: LoopGuard = LoopGuard()) -> int:
    """How many trailing tokens are one n-gram repeated often enough to count as a loop
    (the shortest such n-gram's run), or 0 when the answer does not loop."""
    size = len(tokens)
    for n in range(1, min(guard.max_ngram, size // guard.min_repeats) + 1):
        k = guard.repeats_needed(n)
        span = n * k
        if span > size:
            continue
        tail = tokens[size - span :]
        gram = tail[-n:]
        if all(tail[i] == gram[i % n] for i in range(span)):
            return span
    return 0
