"""Which cached files go to make room for a stage (pure), and the default cap on the cache."""

from __future__ import annotations

import pytest

from app.pieces_eviction import CachedFile, default_pieces_cap, plan_eviction

pytestmark = pytest.mark.unit

GIB = 1 << 30


def f(model: str, path: str, size: int, last_used: float) -> CachedFile:
    return CachedFile(model, path, size, last_used)


OLD = f("old", "blk.000.gguf", 40, 100.0)
OLDER = f("old", "blk.001.gguf", 30, 50.0)
MINE = f("now", "blk.000.gguf", 20, 10.0)
"""The current stage's piece: the oldest stamp of all, and still never evicted."""
KEEP = frozenset({MINE.key})


def test_nothing_goes_when_the_stage_fits() -> None:
    plan = plan_eviction([OLD, OLDER, MINE], KEEP, cap_bytes=100, needed_bytes=10)
    assert plan.fits and plan.evict == ()
    assert plan.used_after == 100 and plan.short_by == 0 and plan.kept_bytes == 20


def test_least_recently_used_goes_first_and_no_more_than_needed() -> None:
    plan = plan_eviction([OLD, OLDER, MINE], KEEP, cap_bytes=100, needed_bytes=30)
    assert plan.fits and plan.evict == (OLDER,)
    assert plan.used_after == 90 - 30 + 30


def test_several_go_until_it_fits() -> None:
    plan = plan_eviction([OLD, OLDER, MINE], KEEP, cap_bytes=60, needed_bytes=30)
    assert plan.evict == (OLDER, OLD) and plan.used_after == 50


def test_the_current_stage_is_never_evicted_however_old() -> None:
    plan = plan_eviction([OLD, OLDER, MINE], KEEP, cap_bytes=50, needed_bytes=30)
    assert plan.fits and MINE not in plan.evict and plan.used_after == 50


def test_a_stage_that_cannot_fit_deletes_nothing_and_says_by_how_much() -> None:
    plan = plan_eviction([OLD, OLDER, MINE], KEEP, cap_bytes=45, needed_bytes=30)
    assert not plan.fits and plan.evict == ()
    assert plan.used_after == 50  # its own 20 bytes and the 30 still to come
    assert plan.short_by == 5


def test_a_stage_larger_than_the_cap_on_an_empty_cache_does_not_fit() -> None:
    plan = plan_eviction([], frozenset(), cap_bytes=10, needed_bytes=11)
    assert not plan.fits and plan.short_by == 1


def test_ties_go_larger_first_then_by_name_so_the_plan_is_stable() -> None:
    a = f("a", "x.gguf", 10, 5.0)
    b = f("b", "x.gguf", 10, 5.0)
    big = f("c", "x.gguf", 30, 5.0)
    for order in ([a, b, big], [big, b, a]):
        assert plan_eviction(order, frozenset(), 20, 0).evict == (big,)
        assert plan_eviction(order, frozenset(), 5, 0).evict == (big, a, b)


def test_a_file_of_the_same_model_but_another_stage_may_go() -> None:
    other_layers = f("now", "blk.009.gguf", 20, 1.0)
    stage_file = f("now", "stages/now.0-1.gguf", 20, 2.0)
    plan = plan_eviction([other_layers, stage_file, MINE], KEEP, 30, 0)
    assert plan.evict == (other_layers, stage_file)


def test_default_cap_is_half_of_free_plus_the_cache_itself() -> None:
    assert default_pieces_cap(free_bytes=400 * GIB, total_bytes=1000 * GIB) == 200 * GIB
    # Its own files count as room: filling the cache does not shrink its cap.
    assert (
        default_pieces_cap(free_bytes=300 * GIB, total_bytes=1000 * GIB, cache_bytes=100 * GIB)
        == 200 * GIB
    )


def test_default_cap_leaves_a_tenth_of_the_disk_free() -> None:
    assert default_pieces_cap(free_bytes=150 * GIB, total_bytes=1000 * GIB) == 50 * GIB
    assert default_pieces_cap(free_bytes=50 * GIB, total_bytes=1000 * GIB) == 0


@pytest.mark.parametrize(("free", "total", "cache"), [(0, 0, 0), (-5, 10, 0), (10, -1, -3)])
def test_default_cap_is_never_negative(free: int, total: int, cache: int) -> None:
    assert default_pieces_cap(free, total, cache) >= 0
