"""The batch-selection policy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.scheduling import Queued, choose_row_budget, select_batch

pytestmark = pytest.mark.unit


def test_decode_rows_go_before_prompt_chunks() -> None:
    q = [Queued(64, True), Queued(1, False), Queued(64, True), Queued(1, False)]
    assert select_batch(q, 256) == [1, 3, 0, 2]


def test_budget_is_respected_and_later_small_items_fill_the_gap() -> None:
    q = [Queued(1, False), Queued(64, True), Queued(64, True), Queued(30, True)]
    assert select_batch(q, 100) == [0, 1, 3]


def test_an_oversized_item_still_runs_alone() -> None:
    assert select_batch([Queued(500, True), Queued(1, False)], 100) == [1]
    assert select_batch([Queued(500, True)], 100) == [0]


def test_empty_queue_and_bad_budget() -> None:
    assert select_batch([], 10) == []
    with pytest.raises(ValueError):
        select_batch([Queued(1, False)], 0)


@given(st.lists(st.tuples(st.integers(1, 300), st.booleans()), max_size=30), st.integers(1, 512))
def test_properties(items: list[tuple[int, bool]], budget: int) -> None:
    q = [Queued(r, p) for r, p in items]
    chosen = select_batch(q, budget)
    assert len(set(chosen)) == len(chosen)
    if q:
        assert chosen, "a non-empty queue always makes progress"
    if len(chosen) > 1:
        assert sum(q[i].rows for i in chosen) <= budget
    prompts_seen = False
    for i in chosen:  # no decode item after a prompt chunk
        prompts_seen |= q[i].is_prompt
        assert q[i].is_prompt or not prompts_seen


def test_a_prompt_chunk_passed_over_goes_with_the_next_step_anyway() -> None:
    # 256 sessions decoding fill every step; the waiting prompt chunk goes once overdue.
    q = [Queued(1, False) for _ in range(256)] + [Queued(64, True, waited=0)]
    assert 256 not in select_batch(q, 256)
    q[-1] = Queued(64, True, waited=2)
    chosen = select_batch(q, 256)
    assert chosen[-1] == 256 and len(chosen) == 257


def test_the_row_budget_is_the_knee_of_the_measured_throughput() -> None:
    # CPU-like: per-row cost falls until 16 rows, then stays flat.
    cpu = [(1, 2.0), (2, 2.2), (4, 2.6), (8, 3.4), (16, 5.0), (32, 9.8), (64, 19.5)]
    assert choose_row_budget(cpu, 256) == 16
    # GPU-like: a step of 256 rows costs hardly more than one row.
    gpu = [(1, 1.0), (16, 1.05), (64, 1.2), (256, 1.6)]
    assert choose_row_budget(gpu, 256) == 256
    assert choose_row_budget(gpu, 64) == 64, "never more than the batch holds"
    assert choose_row_budget([], 128) == 128
    with pytest.raises(ValueError):
        choose_row_budget(cpu, 0)


@given(
    st.lists(st.tuples(st.integers(1, 512), st.floats(0.01, 1000.0)), max_size=12),
    st.integers(1, 512),
)
def test_the_row_budget_stays_in_range(samples: list[tuple[int, float]], n_batch: int) -> None:
    assert 1 <= choose_row_budget(samples, n_batch) <= n_batch


def test_a_sessions_items_run_in_arrival_order() -> None:
    # Session a's prompt: 64 rows then a 10-row last chunk; b decodes. With room for 40
    # rows the short chunk would fit before the long one: it must wait its turn (seen
    # with 16 guessing sessions: "rows start at 64, the cache ends at 0").
    queue = [
        Queued(1, False, session="b"),
        Queued(64, True, session="a"),
        Queued(10, True, session="a"),
    ]
    assert select_batch(queue, 40) == [0]  # not the 10 rows that would fit
    overdue = [queue[0], Queued(64, True, waited=2, session="a"), queue[2]]
    assert select_batch(overdue, 40) == [0, 1]  # the overdue first chunk, not the tail
    one_row_tail = [Queued(64, True, session="a"), Queued(1, False, session="a")]
    assert select_batch(one_row_tail, 8) == [0]
    # Without sessions the old rule stands: what fits is taken.
    assert select_batch([Queued(64, True), Queued(10, True)], 40) == [0]
