"""The order llama.cpp computes a batch's rows in, with a KV stream per sequence
(split_equal, sequential): the captured hidden states are put back with it."""

from __future__ import annotations

import pytest

from core.ubatch_order import ubatch_order

pytestmark = pytest.mark.unit


def test_one_row_per_sequence_in_slot_order_stays_in_order() -> None:
    assert ubatch_order([0, 1, 2, 3], 8) == [0, 1, 2, 3]


def test_a_run_takes_one_row_of_each_then_the_rest_sequence_by_sequence() -> None:
    # Sequences 0 and 1 both have a row: one micro-batch of one row each; then the three
    # rows left of sequence 0 in one of their own.
    assert ubatch_order([0, 0, 0, 0, 1], 8) == [0, 4, 1, 2, 3]


def test_equal_rows_per_sequence_are_laid_out_sequence_by_sequence() -> None:
    assert ubatch_order([0, 1, 0, 1], 8) == [0, 2, 1, 3]


def test_a_gap_in_the_slots_starts_another_micro_batch() -> None:
    # 3 then 5: not consecutive, so 5 waits; 4 joins 3's run.
    assert ubatch_order([3, 3, 5, 4], 8) == [0, 3, 1, 2]


def test_descending_slots_each_run_alone() -> None:
    assert ubatch_order([2, 1, 0], 8) == [0, 1, 2]


def test_the_micro_batch_size_caps_the_rows_taken_per_run() -> None:
    # Two sequences of 4 rows, micro-batches of 4: two rows of each at a time.
    assert ubatch_order([0, 0, 0, 0, 1, 1, 1, 1], 4) == [0, 1, 4, 5, 2, 3, 6, 7]


def test_every_row_appears_once() -> None:
    seqs = [5, 2, 2, 7, 6, 6, 6, 0, 1, 1, 3]
    order = ubatch_order(seqs, 4)
    assert sorted(order) == list(range(len(seqs)))


def test_no_rows_no_order() -> None:
    assert ubatch_order([], 8) == []
    with pytest.raises(ValueError):
        ubatch_order([0], 0)
