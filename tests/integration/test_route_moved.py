"""A client whose route is not the chain any more (a first stage's next hop moved after
the coordinator handed the route out) is told so with a typed error and answers on the
route the coordinator hands out now: real coordinator and worker processes, three
chains of two stages (tests/support/spot_swarm.py), no liar, checks off.

The stale route is made by crossing two chains: the first stage of one with the last
stage of another. The first stage forwards the OPEN down its own chain, whose last
stage either has no link from the client (it refuses ROUTE_MOVED) or, where another
answer of the same client keeps a link there, goes round the ring to a first stage that
expected the route's last stage (which refuses ROUTE_MOVED). Both answers equal the
honest chain's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.client.generation import apply_event
from app.config import Route
from tests.support.spot_swarm import PROMPT, Swarm, ask, recovering_client, run_spot_swarm
from tests.support.spot_swarm import coordinator_args as spot_args

pytestmark = pytest.mark.integration

N_TOKENS = 10


def _crossed(a: Route, b: Route) -> Route:
    """`a`'s first stage with `b`'s last: no chain the swarm runs."""
    return dataclasses.replace(a, stages=(a.stages[0], b.stages[1]))


async def _answer(swarm: Swarm, route: Route) -> tuple[list[int], list[str]]:
    out: list[int] = []
    async with recovering_client(swarm.me, route) as client:
        async for event in client.generate(PROMPT, N_TOKENS):
            apply_event(out, event)
        failures = [r.failure for r in client.recoveries]
    return out, failures


@pytest.mark.parametrize("other_answer_linked", [False, True])
def test_an_answer_on_a_moved_route_is_told_and_goes_on_the_route_of_now(
    tmp_path: Path, other_answer_linked: bool
) -> None:
    async def scenario(swarm: Swarm) -> None:
        (a, b, _c) = list(swarm.chains.values())
        expected = await ask(swarm.me, a, N_TOKENS)
        assert expected == await ask(swarm.me, b, N_TOKENS)  # the chains agree
        crossed = _crossed(b, a)  # b's first stage forwards to b's last, not a's
        if not other_answer_linked:
            out, failures = await _answer(swarm, crossed)
        else:
            # Another answer of the same client holds a link at b's last stage: the
            # OPEN finds the client's node there and goes round the ring.
            async with recovering_client(swarm.me, b) as other:
                async for _ in other.generate(PROMPT, 2):
                    pass
                out, failures = await _answer(swarm, crossed)
        assert out == expected
        assert len(failures) == 1 and "ROUTE_MOVED" in failures[0], failures

    run_spot_swarm(tmp_path, None, scenario, coordinator=spot_args(0.0))
