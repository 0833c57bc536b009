"""An answer survives a stage dying: real coordinator and worker processes, a three-stage
chain and a warm spare. The middle worker declares the earliest end of availability
(`--available-until`), so the coordinator's spare policy has the spare pre-load the
middle stage; that worker is killed with SIGKILL after the 5th of 40 greedy tokens, and
the client still receives all 40, equal to the whole model's; the spare serves the stage
it had loaded, loading nothing again. ~40 s each."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import requests

from app.client.connect import avoiding_source
from app.client.generation import answer_of, apply_event
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.client.route import fetch_route
from app.identity import join_swarm
from app.lab.local_run import build_pipeline
from core.types import LayerRange
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.spare_swarm import (
    SpareSwarm,
    generate_killing,
    middle_leaves_first,
    node_id,
    spawn_worker,
)
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7]
N_TOKENS = 40
KILL_AFTER = 5


def test_middle_stage_killed_mid_answer_the_answer_completes(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    whole = build_pipeline([model], [LayerRange(0, 8)], 8, 512, 64, 1, True)
    expected = list(whole.generate(PROMPT, N_TOKENS).tokens)
    whole.shutdown()
    spare_said: list[str] = []

    async def scenario() -> tuple[list[int], RecoveringClient, float, str, list[str], str]:
        swarm = await SpareSwarm.start(tmp_path, model, chain_args=middle_leaves_first())
        try:
            preloaded = await swarm.until_spare_says("PRELOADED")
            me = await swarm.join_client()
            route = await swarm.route(me)
            chain = [s.node_id for s in route.stages]
            assert len(chain) == 3
            leaving = node_id(swarm.chain[1])  # the worker that declared its departure
            middle = route.stages[1]

            client = RecoveringClient(
                me.credentials(), route, avoiding_source(me), RecoveryPolicy(step_timeout_s=10.0)
            )
            victim = swarm.worker(middle.node_id)
            async with client:
                out, _, gap = await generate_killing(
                    client, PROMPT, N_TOKENS, KILL_AFTER, lambda: swarm.kill(victim)
                )
            warm = str(middle.layers)
            return out, client, gap, middle.node_id, [leaving, warm, preloaded], chain[1]
        finally:
            await swarm.stop()
            spare_said.extend(swarm.spare_lines())

    out, client, gap, victim, (leaving, warm, preloaded), middle = asyncio.run(scenario())
    # The victim is the middle stage (index 1 of 3), and the spare policy chose it: the
    # spare pre-loaded exactly its layers because its volunteer leaves first.
    assert victim == middle == leaving
    assert preloaded == f"PRELOADED {warm}"
    assert out == expected  # every token, equal to the uninterrupted whole model
    assert len(client.recoveries) >= 1
    first = client.recoveries[0]
    assert first.replayed >= len(PROMPT) + KILL_AFTER
    # The stage upstream of the killed one learnt its new next hop in time (it asks the
    # coordinator at once while its link is down): the first replay answered.
    assert first.replays == 1, first.failure
    assert victim in first.dead  # the probe found the killed stage
    assert victim not in {s.node_id for s in client.route.stages}
    # The spare took over the stage it had pre-loaded: one load in all, none at promotion.
    spare_id = next(x.split()[1] for x in spare_said if x.startswith("READY"))
    assert client.route.stages[1].node_id == spare_id
    assert sum(x.startswith("PRELOADED") for x in spare_said) == 1
    assert sum(x.startswith("LOADING") for x in spare_said) == 0, spare_said
    print(
        f"\nkill -9 of the middle stage ({victim}, warm spare): "
        f"token {KILL_AFTER} -> {KILL_AFTER + 1} took {gap:.2f} s"
    )
    for r in client.recoveries:
        print(f"  recovery: stall {r.stall_s:.2f} s, replayed {r.replayed}, {r.failure[:120]}")


def _logins_after(browser: requests.Session, coord: CoordinatorProcess) -> tuple[int, int]:
    """The swarm page's API as the signed-in browser, then with a made-up cookie."""
    url, ca = f"{coord.url}/api/v1/swarm", str(coord.ca_path)
    mine = browser.get(url, verify=ca, timeout=10).status_code
    made_up = {"sangama_session": "not-a-login"}
    return mine, requests.get(url, cookies=made_up, verify=ca, timeout=10).status_code


def test_coordinator_killed_mid_answer_the_answer_completes_and_nobody_moves(
    tmp_path: Path,
) -> None:
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    whole = build_pipeline([model], [LayerRange(0, 8)], 8, 512, 64, 1, True)
    expected = list(whole.generate(PROMPT, N_TOKENS).tokens)
    whole.shutdown()
    data = tmp_path / "coordinator"
    args = ["--stale-after", "4", "--dead-after", "8"]
    coords = [CoordinatorProcess.start(data, model, min_stages=3, extra_args=args)]
    port = int(coords[0].url.rsplit(":", 1)[1].split("/")[0])
    # An operator signed in on the page before the crash (the browser keeps the cookie).
    browser = requests.Session()
    login = browser.post(
        f"{coords[0].url}/api/v1/login",
        json={"password": coords[0].password},
        verify=str(coords[0].ca_path),
        timeout=10,
    )
    assert login.ok and browser.cookies

    async def scenario() -> tuple[
        list[int], list[int], list[str], list[str], float, float, list[str], tuple[int, int]
    ]:
        workers = list(
            await asyncio.gather(*(spawn_worker(coords[0], tmp_path, f"w{i}") for i in range(3)))
        )
        try:
            loop = asyncio.get_running_loop()
            me = await loop.run_in_executor(
                None, join_swarm, coords[0].admin.create_invite("client")["code"], tmp_path / "me"
            )
            route, _ = await loop.run_in_executor(None, fetch_route, me)

            out: list[int] = []
            restarted: asyncio.Future[CoordinatorProcess] | None = None
            down_at = 0.0
            gaps: list[float] = []
            last_t = loop.time()
            async with RecoveringClient(me.credentials(), route, avoiding_source(me)) as client:
                async for event in client.generate(PROMPT, N_TOKENS):
                    apply_event(out, event)
                    gaps.append(loop.time() - last_t)
                    last_t = loop.time()
                    if len(out) == KILL_AFTER:
                        coords[0].proc.kill()  # SIGKILL: no clean shutdown
                        coords[0].proc.wait()
                        down_at = loop.time()
                        restarted = loop.run_in_executor(
                            None,
                            lambda: CoordinatorProcess.start(
                                data, model, min_stages=3, port=port, extra_args=args
                            ),
                        )
                assert not client.recoveries  # nothing broke: no replay was needed
                assert restarted is not None
                coords.append(await restarted)
                logins = await loop.run_in_executor(None, _logins_after, browser, coords[-1])
                back_after = loop.time() - down_at
                # A later answer, on the route the restarted coordinator hands out.
                after_route, _ = await loop.run_in_executor(None, fetch_route, me)
                later = await answer_of(client.generate(PROMPT, 8))
            # Before the workers stop (then the chain shrinks and they are re-planned).
            logs = [(tmp_path / f"w{i}.log").read_text() for i in range(3)]
            return (
                out,
                later,
                [s.node_id for s in route.stages],
                [s.node_id for s in after_route.stages],
                back_after,
                max(gaps[KILL_AFTER:]),
                logs,
                logins,
            )
        finally:
            await asyncio.gather(*(w.stop() for w in workers))

    try:
        out, later, chain, chain_after, back_after, worst, logs, logins = asyncio.run(scenario())
    finally:
        for c in coords:
            c.stop()
    assert logins == (200, 401)  # the operator's login survived the kill -9 and restart
    assert out == expected  # the running answer never needed the coordinator
    assert later == expected[:8]
    assert chain_after == chain  # assignments unchanged: no re-plan storm
    for log_text in logs:  # no worker rebuilt its stage after the restart
        assert "rebuilding" not in log_text
    print(
        f"\ncoordinator kill -9 mid-answer: back (READY) after {back_after:.2f} s; "
        f"longest gap between tokens after the kill {worst * 1e3:.0f} ms"
    )
