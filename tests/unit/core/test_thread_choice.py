"""core.scheduling.choose_threads / thread_candidates: how many threads a stage keeps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.scheduling import choose_threads, thread_candidates

pytestmark = pytest.mark.unit


def test_a_second_thread_that_halves_the_step_is_kept() -> None:
    assert choose_threads([(1, 44.0), (2, 22.5)]) == 2


def test_a_thread_that_only_ties_is_not_taken() -> None:
    # The integrator's first two stages: 7.39 ms at 1 thread, 7.17 at 2 (3% faster).
    assert choose_threads([(1, 7.39), (2, 7.17)]) == 1


def test_more_threads_that_collapse_lose_to_fewer() -> None:
    # A busy PC: the third thread waits for the scheduler at every barrier.
    assert choose_threads([(1, 40.0), (2, 21.0), (3, 95.0), (4, 120.0)]) == 2


def test_the_fewest_within_the_share_of_the_fastest() -> None:
    samples = [(1, 40.0), (2, 21.0), (3, 20.0), (4, 19.5)]
    assert choose_threads(samples) == 2  # 19.5 / 21.0 = 0.93 >= 0.9
    assert choose_threads(samples, share=1.0) == 4


def test_unusable_samples_give_one_thread_and_bad_share_is_refused() -> None:
    assert choose_threads([]) == 1
    assert choose_threads([(0, 5.0), (2, 0.0), (3, -1.0)]) == 1
    with pytest.raises(ValueError):
        choose_threads([(1, 1.0)], share=0.0)


def test_candidates_run_from_one_to_the_cpus_capped() -> None:
    assert thread_candidates(1) == [1]
    assert thread_candidates(2) == [1, 2]
    assert thread_candidates(64) == list(range(1, 9))
    assert thread_candidates(6, cap=4) == [1, 2, 3, 4]
    with pytest.raises(ValueError):
        thread_candidates(0)


@given(
    st.lists(st.tuples(st.integers(1, 16), st.floats(0.01, 1000.0)), min_size=1, max_size=16),
    st.floats(0.05, 1.0),
)
def test_the_choice_is_measured_and_within_the_share(
    samples: list[tuple[int, float]], share: float
) -> None:
    chosen = choose_threads(samples, share)
    assert chosen in {n for n, _ in samples}
    fastest = min(ms for _, ms in samples)
    best_of_chosen = min(ms for n, ms in samples if n == chosen)
    assert fastest / best_of_chosen >= share - 1e-12
    # Nothing with fewer threads would have done.
    assert all(fastest / ms < share for n, ms in samples if n < chosen)
