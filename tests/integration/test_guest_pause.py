"""A paused worker leaves the route at once and comes back by itself: a real coordinator
process, a real worker process for the other stage, and one worker run in this process
whose battery probe the test flips (the only fake: this machine has no battery).

The coordinator's dead-node timeout is set far beyond the test, so only the worker's
own "paused" heartbeat can take it out of the route."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import pytest

from app.client.route import fetch_route
from app.client.swarm_client import SwarmClient
from app.identity import join_swarm
from app.lab.processes import spawn_sangama
from app.node_status import NodeStatus, ServeState
from app.serving.coordinated import CoordinatedOptions
from app.serving.guest.loop import serve_as_guest
from app.serving.guest.policy import ON_BATTERY, GuestSettings
from app.serving.guest.probes import GpuUse, Probes
from coordinator.errors import CoordinatorError
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7]


def test_a_worker_on_battery_leaves_the_route_and_returns_when_plugged_in(
    tmp_path: Path,
) -> None:
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=8)
    coord = CoordinatorProcess.start(
        tmp_path / "coordinator",
        model,
        min_stages=2,
        extra_args=["--stale-after", "300", "--dead-after", "600"],
    )
    unplugged = [False]
    probes = Probes(
        gpu=lambda: GpuUse(None, 0),
        on_battery=lambda: unplugged[0],
        local_time=lambda: dt.time(12, 0),
    )
    settings = GuestSettings(sample_every_s=0.5, resume_after_s=0)
    seen: list[NodeStatus] = []

    async def scenario() -> tuple[list[str], list[str], list[NodeStatus]]:
        loop = asyncio.get_running_loop()
        me = await loop.run_in_executor(
            None, join_swarm, coord.admin.create_invite("worker")["code"], tmp_path / "guest"
        )
        client = await loop.run_in_executor(
            None, join_swarm, coord.admin.create_invite("client")["code"], tmp_path / "client"
        )
        other = await spawn_sangama(
            "other",
            [
                "worker",
                "--join",
                coord.admin.create_invite("worker")["code"],
                "--identity-dir",
                str(tmp_path / "other"),
            ],
            tmp_path / "other.log",
            180,
            wait_ready=False,
        )
        stop = asyncio.Event()
        guest = loop.create_task(
            serve_as_guest(
                CoordinatedOptions(identity_dir=tmp_path / "guest", drain_s=2),
                settings,
                stop,
                seen.append,
                probes,
            )
        )

        async def chain() -> list[str]:
            """The route's node ids, once a route exists and answers; [] while none."""
            try:
                route, _ = await loop.run_in_executor(None, fetch_route, client)
            except CoordinatorError:
                return []
            async with SwarmClient(client.credentials(), route) as swarm:
                out = [t async for ev in swarm.generate(PROMPT, 4) for t in ev.tokens]
            assert len(out) == 4
            return [s.node_id for s in route.stages]

        async def until(check: object, what: str) -> list[str]:
            for _ in range(240):
                try:
                    ids = await chain()
                except Exception:  # stages are being rebuilt: ask again
                    ids = None
                if ids is not None and check(ids):  # type: ignore[operator]
                    return ids
                await asyncio.sleep(0.5)
            raise AssertionError(f"never {what}; guest states: {[s.state for s in seen[-5:]]}")

        try:
            first = await until(lambda ids: me.node_id in ids, "served with the guest in the route")
            unplugged[0] = True
            await until(lambda ids: me.node_id not in ids, "left the route")
            node = next(n for n in coord.admin.swarm()["nodes"] if n["node_id"] == me.node_id)
            # Still heard from (not gone), out of the plan because it said why.
            assert (node["health"], node["paused"], node["layers"]) == ("healthy", ON_BATTERY, None)
            # The coordinator hears "paused" before the drain ends; the status says so
            # once the running sessions finished (drain_s): wait for it, then plug in.
            for _ in range(240):
                paused = [s for s in seen if s.state is ServeState.PAUSED]
                if paused:
                    break
                await asyncio.sleep(0.5)
            unplugged[0] = False
            back = await until(lambda ids: me.node_id in ids, "came back into the route")
            return first, back, paused
        finally:
            stop.set()
            await asyncio.wait_for(guest, 30)
            await other.stop()

    try:
        first, back, paused = asyncio.run(scenario())
    finally:
        coord.stop()
    assert len(first) == 2 and len(back) == 2
    assert paused and all(s.paused_reason == ON_BATTERY for s in paused)
    assert paused[0].summary == f"Sangama: paused ({ON_BATTERY})"
    states = [s.state for s in seen]
    first_pause = states.index(ServeState.PAUSED)
    assert ServeState.PAUSING in states[:first_pause]  # it drained first, it did not drop
    assert ServeState.SERVING in states[first_pause:]  # and it served again by itself
