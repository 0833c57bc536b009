"""bench/load.py's WAN chains: the 5-stage chain keeps the 20-stage one's total delay."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.load import _split, wan20

pytestmark = pytest.mark.unit


def test_split_keeps_order_and_sizes_differ_by_at_most_one() -> None:
    groups = _split(list(range(21)), 6)
    assert [x for g in groups for x in g] == list(range(21))
    assert [len(g) for g in groups] == [4, 4, 4, 3, 3, 3]


def test_five_stages_carry_the_twenty_stage_chains_delay_over_fewer_links() -> None:
    model = Path("tiny20.gguf")  # not opened: only the plan is built
    twenty = wan20([1, 64], 16, model)
    five = wan20([1, 64], 16, model, stages=5)
    assert twenty.cuts == list(range(21)) and len(twenty.link_delays_ms or ()) == 21
    assert five.cuts == [0, 4, 8, 12, 16, 20]
    assert len(five.link_delays_ms or ()) == 6  # client->0, 4 between stages, last->client
    assert sum(five.link_delays_ms or ()) == sum(twenty.link_delays_ms or ())
    d = twenty.link_delays_ms or []
    assert (five.link_delays_ms or [])[0] == sum(d[:4])  # consecutive links summed
    assert five.proxy_processes == twenty.proxy_processes == 1
    assert wan20([1], 16, model, proxy_processes=0).proxy_processes == 0
