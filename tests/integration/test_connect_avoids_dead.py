"""A client whose route names a stage that died before it connected (the volunteer left
between the route and the dial) connects along a route avoiding it: real coordinator and
worker processes, a three-stage chain and a spare; the answer equals the whole model's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.client.connect import avoiding_source
from app.client.generation import apply_event
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.lab.local_run import build_pipeline
from core.types import LayerRange
from tests.integration.test_answer_survives import PROMPT
from tests.support.spare_swarm import SpareSwarm
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

N_TOKENS = 12


def test_connecting_with_a_dead_stage_on_the_route_goes_around_it(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    whole = build_pipeline([model], [LayerRange(0, 8)], 8, 512, 64, 1, True)
    expected = list(whole.generate(PROMPT, N_TOKENS).tokens)
    whole.shutdown()

    async def scenario() -> tuple[list[int], RecoveringClient, str]:
        swarm = await SpareSwarm.start(tmp_path, model)
        try:
            me = await swarm.join_client()
            route = await swarm.route(me)
            chain = [s.node_id for s in route.stages]
            first = swarm.worker(chain[0])
            # The first stage is the one a client dials on connect: its death is seen there.
            swarm.kill(first)
            await first.process.wait()

            client = RecoveringClient(
                me.credentials(), route, avoiding_source(me), RecoveryPolicy(step_timeout_s=10.0)
            )
            out: list[int] = []
            async with client:  # connects: the stale route's first stage is gone
                async for event in client.generate(PROMPT, N_TOKENS):
                    apply_event(out, event)
            return out, client, chain[0]
        finally:
            await swarm.stop()

    out, client, victim = asyncio.run(scenario())
    assert out == expected
    assert victim not in {s.node_id for s in client.route.stages}
