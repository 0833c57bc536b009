"""A client whose route names a stage that died before it connected (the volunteer left
between the route and the dial) connects along a route avoiding it: real coordinator and
worker processes, a three-stage chain and a spare; the answer equals the whole model's."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.client.route import fetch_route, route_avoiding
from app.config import Route
from app.identity import join_swarm
from app.lab.local_run import build_pipeline
from core.types import LayerRange
from tests.integration.test_answer_survives import PROMPT, _worker
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

N_TOKENS = 12


def test_connecting_with_a_dead_stage_on_the_route_goes_around_it(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    whole = build_pipeline([model], [LayerRange(0, 8)], 8, 512, 64, 1, True)
    expected = list(whole.generate(PROMPT, N_TOKENS).tokens)
    whole.shutdown()
    coord = CoordinatorProcess.start(
        tmp_path / "coordinator",
        model,
        min_stages=3,
        extra_args=["--spares", "1", "--stale-after", "2", "--dead-after", "4"],
    )

    async def scenario() -> tuple[list[int], RecoveringClient, str]:
        chain_workers = list(
            await asyncio.gather(*(_worker(coord, tmp_path, f"w{i}", True) for i in range(3)))
        )
        spare = await _worker(coord, tmp_path, "spare", False)
        try:
            loop = asyncio.get_running_loop()
            me = await loop.run_in_executor(
                None, join_swarm, coord.admin.create_invite("client")["code"], tmp_path / "me"
            )
            route, _ = await loop.run_in_executor(None, fetch_route, me)
            chain = [s.node_id for s in route.stages]
            first = next(w for w in chain_workers if w.ready_line.split()[1] == chain[0])
            # The first stage is the one a client dials on connect: its death is seen there.
            os.kill(first.process.pid, signal.SIGKILL)
            await first.process.wait()

            async def avoiding(avoid: tuple[str, ...]) -> Route:
                return await loop.run_in_executor(None, route_avoiding, me, avoid)

            client = RecoveringClient(
                me.credentials(), route, avoiding, RecoveryPolicy(step_timeout_s=10.0)
            )
            out: list[int] = []
            async with client:  # connects: the stale route's first stage is gone
                async for event in client.generate(PROMPT, N_TOKENS):
                    out.extend(event.tokens)
            return out, client, chain[0]
        finally:
            await asyncio.gather(*(w.stop() for w in [*chain_workers, spare]))

    try:
        out, client, victim = asyncio.run(scenario())
    finally:
        coord.stop()
    assert out == expected
    assert victim not in {s.node_id for s in client.route.stages}
