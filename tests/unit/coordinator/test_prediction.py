"""The fleet prediction against figures worked out by hand."""

from __future__ import annotations

import pytest

from coordinator.server.prediction import (
    MAX_LEVELS,
    FleetFacts,
    PredictionError,
    StageFacts,
    default_levels,
    predict,
)

THREE = (
    StageFacts("a", ((1, 10.0), (16, 40.0))),
    StageFacts("b", ((1, 20.0), (16, 50.0))),
    StageFacts("c", ((1, 30.0), (16, 90.0))),
)


def fleet(stages: tuple[StageFacts, ...] = THREE, **kw: object) -> FleetFacts:
    links = kw.pop("links_ms", (1.0, 2.0, 3.0))
    return FleetFacts(stages, links, hop_ms=0.5, row_hop_ms=0.2, **kw)  # type: ignore[arg-type]


def test_one_request_is_one_over_the_trip_round_the_ring() -> None:
    p = predict(fleet(), levels=(1,))
    # 10 + 20 + 30 of steps, 1 + 2 + 3 of links, 3 hops of 0.5 + one row's 0.2
    assert p.trip_ms == pytest.approx(68.1)
    assert p.one_request_tokens_per_s == pytest.approx(1000 / 68.1)
    assert (p.compute_ms, p.links_ms, p.hops_ms) == pytest.approx((60.0, 6.0, 2.1))
    assert p.slowest_stage == 2
    assert p.levels[0].bound == "latency"


def test_requests_together_step_together_at_the_measured_time_for_their_rows() -> None:
    (lv,) = predict(fleet(), levels=(16,)).levels
    # steps at 16 rows 40 + 50 + 90, links 6, 3 hops of 0.5 + 16 x 0.2
    assert lv.round_ms == pytest.approx(197.1)
    assert lv.tokens_per_s == pytest.approx(16_000 / 197.1)
    assert lv.per_request_tokens_per_s == pytest.approx(1000 / 197.1)
    assert (lv.rows_per_step, lv.groups) == (16, 1)


def test_step_times_between_measured_rows_are_interpolated() -> None:
    (lv,) = predict(fleet(), levels=(8,)).levels
    # at 8 rows: 10 + 30 x 7/15 = 24, 20 + 30 x 7/15 = 34, 30 + 60 x 7/15 = 58
    assert lv.round_ms == pytest.approx(24 + 34 + 58 + 6 + 3 * (0.5 + 8 * 0.2))


def test_a_row_budget_splits_the_requests_into_groups_that_pipeline() -> None:
    stages = (*THREE[:2], StageFacts("c", THREE[2].step_ms, row_budget=8))
    (lv,) = predict(fleet(stages), levels=(16,)).levels
    # two groups of 8: a group's trip is 128.3 ms, stage c busy 2 x (58 + 1.6) = 119.2
    assert (lv.rows_per_step, lv.groups) == (8, 2)
    assert lv.round_ms == pytest.approx(128.3)
    assert lv.bound == "latency"
    assert lv.tokens_per_s == pytest.approx(16_000 / 128.3)


def test_a_busy_stage_bounds_the_total_once_the_trip_is_shorter_than_its_work() -> None:
    stages = (
        StageFacts("a", ((1, 5.0),)),
        StageFacts("b", ((1, 5.0),)),
        StageFacts("c", ((1, 100.0), (4, 130.0)), row_budget=4),
    )
    facts = FleetFacts(stages, (0.0, 0.0, 0.0), hop_ms=0.0, row_hop_ms=0.0)
    (lv,) = predict(facts, levels=(16,)).levels
    # four groups of 4 rows; stage c steps 4 x 130 ms a round, the trip is 140 ms
    assert (lv.groups, lv.rows_per_step) == (4, 4)
    assert lv.bound == "stage 2"
    assert lv.round_ms == pytest.approx(520.0)
    assert lv.tokens_per_s == pytest.approx(16_000 / 520)


def test_step_time_outside_the_measured_rows() -> None:
    two = StageFacts("x", ((1, 10.0), (2, 12.0)))
    assert two.step_at(5) == pytest.approx(18.0)  # the last slope, 2 ms a row
    assert StageFacts("x", ((4, 20.0),)).step_at(1) == 20.0  # never cheaper than measured
    assert StageFacts("x", ((4, 20.0),)).step_at(64) == 20.0  # one point: a fixed cost
    falling = StageFacts("x", ((1, 10.0), (2, 9.0)))
    assert falling.step_at(10) == 9.0  # a falling slope is not extrapolated


def test_levels_stop_at_the_admission_limit() -> None:
    stages = (StageFacts("a", ((1, 10.0),), max_sessions=8), *THREE[1:])
    p = predict(fleet(stages))
    assert p.admission_limit == 8
    assert [lv.requests for lv in p.levels] == [1, 2, 4, 8]
    assert [lv.requests for lv in predict(fleet(stages), levels=(1, 16, 32)).levels] == [1, 8]
    kv = predict(fleet(admission_limit=5))
    assert kv.admission_limit == 5 and kv.levels[-1].requests == 5


def test_the_peak_is_the_best_total() -> None:
    p = predict(fleet(), levels=(1, 4, 16))
    assert p.peak.requests == 16
    assert p.peak.tokens_per_s == max(lv.tokens_per_s for lv in p.levels)


def test_default_levels_and_their_bound() -> None:
    assert default_levels(1) == (1,)
    assert default_levels(12) == (1, 2, 4, 8, 12)
    assert default_levels(256)[-1] == 256
    assert len(predict(fleet(), levels=tuple(range(1, 100))).levels) == MAX_LEVELS


@pytest.mark.parametrize(
    "make",
    [
        lambda: StageFacts("x", ()),
        lambda: StageFacts("x", ((0, 1.0),)),
        lambda: StageFacts("x", ((2, 1.0), (2, 3.0))),
        lambda: StageFacts("x", ((1, float("nan")),)),
        lambda: StageFacts("x", ((1, -1.0),)),
        lambda: FleetFacts(THREE, (1.0, 2.0)),
        lambda: FleetFacts(THREE, (1.0, 2.0, float("inf"))),
        lambda: FleetFacts(THREE, (1.0, 2.0, 3.0), hop_ms=-1.0),
        lambda: FleetFacts((), ()),
        lambda: predict(fleet(), levels=(0,)),
    ],
)
def test_facts_that_cannot_be_predicted_from_are_refused(make: object) -> None:
    with pytest.raises(PredictionError):
        make()  # type: ignore[operator]


def test_nothing_measured_takes_time_is_refused() -> None:
    zero = FleetFacts((StageFacts("x", ((1, 0.0),)),), (0.0,), hop_ms=0.0, row_hop_ms=0.0)
    with pytest.raises(PredictionError):
        predict(zero)
