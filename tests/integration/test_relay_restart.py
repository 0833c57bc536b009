"""An answer survives the relay restarting: a real coturn (`sangama relay`'s config), a
coordinator handing out TURN credentials, two relay-only workers whose link between
them runs through coturn, and a joined client. coturn is killed with SIGKILL after the
5th of 24 greedy tokens and started again on the same port; the relayed link is dialled
again (a new ICE session, a new allocation) and the answer completes, equal to the
whole model's. The stall is printed. ~40 s (tiny model, two stages)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.cli.relay import RelayError
from app.client.connect import avoiding_source
from app.client.generation import answer_of
from app.client.recovering import RecoveringClient
from app.client.route import fetch_route
from app.identity import join_swarm
from app.lab.local_run import build_pipeline
from coordinator.server.store import Node, Store
from core.types import LayerRange
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.relay_proc import LoopbackRelay
from tests.support.spare_swarm import generate_killing, spawn_worker
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7]
N_TOKENS = 24
KILL_AFTER = 5
SECRET = "relay-restart-secret"


def test_coturn_killed_and_restarted_mid_answer_the_answer_completes(tmp_path: Path) -> None:
    try:
        relay = LoopbackRelay.start(tmp_path / "relay", SECRET)
    except RelayError as exc:
        pytest.skip(f"coturn cannot be used here: {exc}")
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    whole = build_pipeline([model], [LayerRange(0, 8)], 8, 512, 64, 1, True)
    expected = list(whole.generate(PROMPT, N_TOKENS).tokens)
    whole.shutdown()
    coord = CoordinatorProcess.start(
        tmp_path / "coordinator", model, min_stages=2, extra_args=relay.coordinator_args(tmp_path)
    )

    async def scenario() -> tuple[list[int], float, RecoveringClient, str]:
        workers = list(
            await asyncio.gather(
                *(spawn_worker(coord, tmp_path, n, extra=["--relay-only"]) for n in ("w0", "w1"))
            )
        )
        try:
            loop = asyncio.get_running_loop()
            code = coord.admin.create_invite("client")["code"]
            me = await loop.run_in_executor(None, join_swarm, code, tmp_path / "me")
            route, _ = await loop.run_in_executor(None, fetch_route, me)
            assert len(route.stages) == 2
            # The first worker reports its link onward: it must run through the relay.
            store = Store(f"sqlite:///{coord.data_dir / 'coordinator.db'}")
            deadline = time.monotonic() + 30
            path = ""
            while time.monotonic() < deadline and path != "relayed":
                async with RecoveringClient(me.credentials(), route, avoiding_source(me)) as c:
                    _ = await answer_of(c.generate(PROMPT, 2))
                await asyncio.sleep(4.5)  # two heartbeats
                with store.session() as s:
                    node = s.get(Node, route.stages[0].node_id)
                    path = "" if node is None else node.path
            store.close()

            def kill() -> None:
                relay.kill()
                # Down for a second, as a crashed relay under a supervisor is. On this
                # (the main) thread: see tests/support/relay_proc on coturn's parent-death
                # signal.
                loop.call_later(1.0, relay.restart)

            client = RecoveringClient(me.credentials(), route, avoiding_source(me))
            async with client:
                out, _, gap = await generate_killing(client, PROMPT, N_TOKENS, KILL_AFTER, kill)
            return out, gap, client, path
        finally:
            await asyncio.gather(*(w.stop() for w in workers))

    try:
        out, gap, client, path = asyncio.run(scenario())
    finally:
        coord.stop()
        relay.stop()
    assert path == "relayed"  # the link that was cut ran through coturn
    # coturn was killed and started again mid-answer
    assert len(relay.processes) == 2, relay.restart_errors
    assert out == expected  # every token, no error, equal to the whole model
    w0 = (tmp_path / "w0.log").read_text()
    how = "the link re-allocated" if not client.recoveries else "a replay on a new session"
    print(
        f"\ncoturn kill -9 + restart after token {KILL_AFTER}: next token after {gap:.2f} s "
        f"({how}; {len(client.recoveries)} client recoveries; "
        f"worker relinks logged: {w0.count('re-establishing')})"
    )
