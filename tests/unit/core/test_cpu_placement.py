"""core.cpu_placement: CPU lists as taskset writes them, and where a stage's compute
threads go (pure)."""

from __future__ import annotations

import pytest

from core.cpu_placement import (
    CpuListError,
    format_cpu_list,
    parse_cpu_list,
    place_compute_threads,
    spread_for_stage,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", ()),
        ("  ", ()),
        ("3", (3,)),
        ("0-3", (0, 1, 2, 3)),
        ("0-1,4,6-7", (0, 1, 4, 6, 7)),
        ("1,0", (1, 0)),  # the order given: the first CPU is the leader's
        ("2,0-3", (2, 0, 1, 3)),  # each CPU once
        (" 0 - 1 ".replace(" ", ""), (0, 1)),
    ],
)
def test_cpu_lists_parse_in_the_order_given(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "0,,1", "1.5", "0-1-2"])
def test_malformed_cpu_lists_say_what_is_expected(text: str) -> None:
    with pytest.raises(CpuListError):
        parse_cpu_list(text)


@pytest.mark.parametrize("cpus", [(), (0,), (0, 1, 2, 5), (1, 0), (4, 5, 6, 0, 2)])
def test_formatting_is_parsing_undone(cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus
    assert format_cpu_list((0, 1, 2, 5)) == "0-2,5"


def test_leaders_share_the_first_cpu_and_each_team_spreads_over_the_rest() -> None:
    # Engine thread 10 built a team (21, 22, 23); another thread 5 that ran a graph,
    # a second one (31, 32, 33): each team's helpers on 1, 2, 3, never two on one CPU.
    placed = place_compute_threads((0, 1, 2, 3), [10, 5], [21, 22, 23, 31, 32, 33])
    assert placed[10] == placed[5] == 0
    assert [placed[t] for t in (21, 22, 23)] == [1, 2, 3]
    assert [placed[t] for t in (31, 32, 33)] == [1, 2, 3]


def test_a_leader_listed_as_helper_stays_a_leader_and_one_cpu_takes_everything() -> None:
    assert place_compute_threads((4, 6), [7], [7, 8]) == {7: 4, 8: 6}
    assert place_compute_threads((2,), [1], [3]) == {1: 2, 3: 2}
    assert place_compute_threads((), [1], [2]) == {}


def test_stages_on_one_machine_start_where_the_previous_stage_ended() -> None:
    two = (0, 1)
    assert [spread_for_stage(two, s, 2) for s in range(3)] == [(0, 1)] * 3
    assert [spread_for_stage(two, s, 1) for s in range(3)] == [(0,), (1,), (0,)]
    eight = tuple(range(8))
    assert spread_for_stage(eight, 1, 3) == (3, 4, 5)
    assert spread_for_stage(eight, 2, 3) == (6, 7, 0)
    assert spread_for_stage(two, 0, 3) == ()  # more threads than CPUs: no pinning
    assert spread_for_stage(two, 0, 0) == ()
