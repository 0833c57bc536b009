"""Which queued rows go into the next engine step, and how many rows a step may take.

A stage is a scheduler, not a request handler (docs/architecture.md, "One token's
trip"): each engine step takes the ready rows of all sessions, decode rows first (they
hold a person waiting for the next token), then prompt chunks, in arrival order, up to
a row budget. A single item larger than the budget still goes alone, so nothing starves;
and a prompt chunk passed over `max_wait` steps in a row (decode rows of many sessions
filling every step) goes with the next step regardless, so a long prompt never waits for
everyone else's answers to end, and never holds back more than one step of theirs.

The budget comes from a measurement (`choose_row_budget`): the step time of a few batch
sizes on the stage's own engine, taken when the worker starts. Rows beyond the point
where throughput stops growing only make every step slower for the people waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CALIBRATION_SIZES",
    "Queued",
    "choose_row_budget",
    "choose_threads",
    "select_batch",
    "thread_candidates",
]

CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Batch sizes the worker times at start-up (those up to its n_batch)."""


@dataclass(frozen=True)
class Queued:
    rows: int
    is_prompt: bool
    """A prompt chunk (many rows) rather than a decode or verification step."""
    waited: int = 0
    """Steps this item has been passed over already."""
    session: str = ""
    """Whose rows: a session's items run in arrival order (a prompt's short last chunk
    must not overtake its first one that did not fit the budget); "" = no constraint."""


def select_batch(queue: Sequence[Queued], row_budget: int, max_wait: int = 2) -> list[int]:
    """Indices of the queued items to run now, in the order they should be evaluated."""
    if row_budget < 1:
        raise ValueError("row_budget must be >= 1")
    if max_wait < 0:
        raise ValueError("max_wait must be >= 0")
    order = sorted(range(len(queue)), key=lambda i: (queue[i].is_prompt, i))
    chosen: list[int] = []
    taken: set[int] = set()
    earlier: dict[str, list[int]] = {}
    for i, q in enumerate(queue):
        if q.session:
            earlier.setdefault(q.session, []).append(i)

    def in_turn(i: int) -> bool:
        """Every earlier item of the same session is already chosen."""
        s = queue[i].session
        return not s or all(j in taken for j in earlier[s] if j < i)

    used = 0
    for i in order:
        if in_turn(i) and (used + queue[i].rows <= row_budget or not chosen):
            chosen.append(i)
            taken.add(i)
            used += queue[i].rows
    if not any(queue[i].is_prompt for i in chosen):
        overdue = [
            i
            for i in order
            if queue[i].is_prompt and queue[i].waited >= max_wait and i not in taken and in_turn(i)
        ]
        if overdue:
            chosen.append(overdue[0])  # the oldest: one chunk per step at most
    return chosen


def choose_row_budget(
    samples: Sequence[tuple[int, float]], n_batch: int, share: float = 0.9
) -> int:
    """The row budget from measured (rows, step ms) pairs: the fewest rows that reach
    `share` of the best measured throughput (rows per ms), at most `n_batch`.

    On a GPU step time hardly grows with rows, so the budget is the largest size tried;
    on a CPU throughput flattens once the matrix kernels are saturated, and more rows
    per step would only lengthen every decode without serving more tokens.
    """
    if n_batch < 1:
        raise ValueError("n_batch must be >= 1")
    if not 0 < share <= 1:
        raise ValueError("share must be in (0, 1]")
    usable = sorted((r, ms) for r, ms in samples if 1 <= r <= n_batch and ms > 0)
    if not usable:
        return n_batch
    best = max(r / ms for r, ms in usable)
    for rows, ms in usable:
        if rows / ms >= share * best:
            return rows
    return n_batch  # not reached: the best sample itself qualifies


def thread_candidates(cpus: int, cap: int = 8) -> list[int]:
    """Thread counts a worker with `threads` unset times at start: 1 up to the CPUs it
    may use, at most `cap` (a one-row step of a stage has little work to split)."""
    if cpus < 1 or cap < 1:
        raise ValueError("cpus and cap must be >= 1")
    return list(range(1, min(cpus, cap) + 1))


def choose_threads(samples: Sequence[tuple[int, float]], share: float = 0.9) -> int:
    """The thread count from measured (threads, one-row step ms) pairs: the fewest
    threads whose speed is at least `share` of the fastest measured.

    Fewest, because every thread a stage keeps is a core the volunteer's own programs
    lose, and because on a PC in use each extra thread is one more that an OpenMP
    barrier waits for when the scheduler runs something else: a count that only ties
    on a quiet start-up is the one that collapses first later. No usable sample: 1.
    """
    if not 0 < share <= 1:
        raise ValueError("share must be in (0, 1]")
    usable = sorted((n, ms) for n, ms in samples if n >= 1 and ms > 0)
    if not usable:
        return 1
    fastest = min(ms for _, ms in usable)
    for threads, ms in usable:
        if fastest / ms >= share:
            return threads
    return usable[0][0]  # not reached: the fastest sample itself qualifies
