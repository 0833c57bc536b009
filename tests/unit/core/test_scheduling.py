"""The batch-selection policy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.scheduling import Queued, select_batch

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
