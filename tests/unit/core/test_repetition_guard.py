"""The loop guard ends answers whose tail repeats, and leaves ordinary answers alone."""

from __future__ import annotations

import pytest

from core.repetition_guard import LoopGuard, looping_tail


def test_a_phrase_repeated_three_times_at_the_end_is_a_loop() -> None:
    phrase = [11, 12, 13, 14, 15, 16, 17, 18]  # 8 tokens: 3 copies cover the 24-token span
    tokens = [1, 2, 3, *phrase * 3]
    assert looping_tail(tokens) == 24


def test_two_copies_of_a_long_phrase_are_not_yet_a_loop() -> None:
    phrase = list(range(100, 112))
    assert looping_tail([1, 2, *phrase * 2]) == 0
    assert looping_tail([1, 2, *phrase * 3]) == 36


def test_a_short_ngram_must_cover_the_span_before_it_counts() -> None:
    # "1, 1, 1" can be meant: a single token needs min_span copies.
    assert looping_tail([5, 6, *[7] * 23]) == 0
    assert looping_tail([5, 6, *[7] * 24]) == 24
    assert looping_tail([5, *[8, 9] * 11]) == 0
    assert looping_tail([5, *[8, 9] * 12]) == 24


def test_the_loop_must_be_at_the_end() -> None:
    phrase = list(range(20, 30))
    assert looping_tail([*phrase * 4, 1, 2, 3]) == 0


def test_an_ordinary_answer_is_not_a_loop() -> None:
    answer = [9, 3, 4, 9, 5, 6, 9, 3, 4, 7, 8, 1, 2, 9, 3, 4, 10, 11, 12, 13, 9, 3, 4, 14] * 1
    assert looping_tail(answer) == 0
    assert looping_tail([]) == 0


def test_the_guard_can_be_tuned() -> None:
    guard = LoopGuard(max_ngram=4, min_repeats=2, min_span=4)
    assert looping_tail([1, 2, 3, 1, 2, 3], guard) == 6  # a 3-gram twice covers 6 >= 4
    assert looping_tail([0, 1, 2, 1, 2], guard) == 4
    assert looping_tail(list(range(10)) * 2, guard) == 0  # a 10-gram is beyond max_ngram


@pytest.mark.parametrize("kw", [{"max_ngram": 0}, {"min_repeats": 1}, {"min_span": 1}])
def test_nonsense_settings_are_refused(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        LoopGuard(**kw)
