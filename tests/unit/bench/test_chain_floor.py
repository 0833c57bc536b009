"""bench/chain_floor.py's figures (no llama.cpp): the floor as a swarm_vs_mono."""

from __future__ import annotations

import pytest

from bench.chain_floor import SWARM_GOAL, floor_figures

pytestmark = pytest.mark.unit


def test_floor_is_the_inverse_of_the_chains_excess_and_the_swarm_is_measured_against_it() -> None:
    f = floor_figures(chain_vs_whole=1.25, swarm_vs_mono=0.72)
    assert f["chain_floor_vs_mono"] == pytest.approx(0.8)
    assert f["swarm_vs_floor"] == pytest.approx(0.9)
    assert f["goal"] == SWARM_GOAL
    assert f["goal_within_floor"] is False  # 0.80 < 0.90: no transport reaches the goal here


def test_a_floor_at_or_above_the_goal_leaves_it_within_reach() -> None:
    assert floor_figures(1.0, 0.85)["goal_within_floor"] is True
    assert floor_figures(1.2, 0.5, goal=0.8)["goal_within_floor"] is True


@pytest.mark.parametrize(("chain", "swarm"), [(0.0, 0.8), (-1.0, 0.8), (1.1, 0.0)])
def test_ratios_that_cannot_be_measured_are_refused(chain: float, swarm: float) -> None:
    with pytest.raises(ValueError):
        floor_figures(chain, swarm)
