"""Which queued rows go into the next engine step: a pure policy.

A stage is a scheduler, not a request handler (docs/architecture.md, "One token's
trip"): each engine step takes the ready rows of all sessions, decode rows first (they
hold a person waiting for the next token), then prompt chunks, in arrival order, up to
a row budget. A single item larger than the budget still goes alone, so nothing starves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Queued:
    rows: int
    is_prompt: bool
    """A prompt chunk (many rows) rather than a decode or verification step."""


def select_batch(queue: Sequence[Queued], row_budget: int) -> list[int]:
    """Indices of the queued items to run now, in the order they should be evaluated."""
    if row_budget < 1:
        raise ValueError("row_budget must be >= 1")
    order = sorted(range(len(queue)), key=lambda i: (queue[i].is_prompt, i))
    chosen: list[int] = []
    used = 0
    for i in order:
        if used + queue[i].rows <= row_budget or not chosen:
            chosen.append(i)
            used += queue[i].rows
    return chosen
