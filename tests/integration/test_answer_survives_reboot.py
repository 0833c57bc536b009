"""An answer survives its middle stage rebooting: real coordinator and three worker
processes, no spare. The middle worker is killed with SIGKILL after the 5th of 40 greedy
tokens and started again at once (same identity, same port, no KV), well inside the
coordinator's stale window, so the coordinator keeps it in the plan and will not route
around it. The client must not wait for a route avoiding it (there is none): it finds
the stage serving again and replays there; all 40 tokens equal the whole model's.
~40 s."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.client.generation import apply_event
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.client.route import route_avoiding
from app.config import Route
from bench.soak import references
from bench.soak_swarm import SoakSwarm
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7]
N_TOKENS = 40
KILL_AFTER = 5


def test_a_stage_that_reboots_mid_answer_is_replayed_on(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    (expected,) = references(model, [PROMPT], N_TOKENS)
    # Stale only after 60 s: the rebooted worker never leaves the plan.
    swarm = SoakSwarm(tmp_path, model, n_workers=3, stages=3, stale_after_s=60)

    async def scenario() -> tuple[list[int], RecoveringClient, str]:
        await swarm.start()
        try:
            loop = asyncio.get_running_loop()
            me = await loop.run_in_executor(None, swarm.join_client, "me")
            route = await loop.run_in_executor(None, route_avoiding, me, ())
            by_node = {w.node_id: w.name for w in swarm.workers.values()}
            victim = by_node[route.stages[1].node_id]

            async def avoiding(avoid: tuple[str, ...]) -> Route:
                return await loop.run_in_executor(None, route_avoiding, me, avoid)

            # route_wait_s well under the stale window: only finding the stage back works.
            policy = RecoveryPolicy(route_wait_s=45.0, step_timeout_s=20.0)
            client = RecoveringClient(me.credentials(), route, avoiding, policy)
            out: list[int] = []
            async with client:
                async for event in client.generate(PROMPT, N_TOKENS):
                    apply_event(out, event)
                    if len(out) == KILL_AFTER:
                        swarm.kill_worker(victim)
                        await swarm.restart_worker(victim)
            return out, client, route.stages[1].node_id
        finally:
            await swarm.stop()

    out, client, middle = asyncio.run(scenario())
    assert out == expected
    assert len(client.recoveries) >= 1
    assert middle in {s.node_id for s in client.route.stages}  # the same stage, rebooted
    print(f"\nreboot of the middle stage: stalls {[round(s, 2) for s in client.stalls]} s")
