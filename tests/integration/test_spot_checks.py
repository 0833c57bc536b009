"""Spot checks in a real swarm: a coordinator and six workers in three chains of two
stages (8 layers, 4 + 4), every step sampled (--spot-check-rate 1). One first stage
lies (SANGAMA_TEST_LIE=noise, app/serving/chaos_lies.py: small noise on every row it
sends on, which the next stage's row checks let through, as they would a plausible
lie). Answers go through every chain; the liar's record
of a session is recomputed by the other two first stages, which agree with each other
and not with it: it is marked faulty with the evidence, leaves the plan and every route,
and its certificate is not renewed until the operator clears it. The honest stages'
checks find them honest, and no one else is marked; in a swarm where no one lies, every
first stage is checked and found honest. ~30-60 s each (6 worker processes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.client.connect import avoiding_source
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.client.route import fetch_route
from app.config import Route
from app.identity import Identity, join_swarm
from app.lab.processes import Child
from coordinator.client.session import CoordinatorRefused
from coordinator.server.placement.costs import Costs
from coordinator.server.placement.model import ModelSpec
from coordinator.server.service import CoordinatorSettings
from core.manifest import Manifest
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.spare_swarm import node_id, spawn_worker
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

N_LAYER = 8
PROMPT = [46, 396, 89, 255, 13, 12, 429, 5]
N_TOKENS = 8
COORDINATOR_ARGS = [
    "--answer-probe-every",
    "0",  # its sessions would share the stages' decodes and add checks
    "--max-chains",
    "3",
    "--spot-check-rate",
    "1",
    "--stale-after",
    "10",
    "--dead-after",
    "30",
]
HONEST_ARGS = ["--vram-cap", "3G"]


def _liar_cap(coord: CoordinatorProcess) -> int:
    """Memory enough for the first stage's layers and not the last's (which also holds
    the output head): placement can only make the liar a first stage, whose rows go on
    to a next stage. Its layers split as the others' (the cut balances compute, and
    every node computes alike)."""
    (manifest_json,) = (coord.data_dir / "models").glob("*/manifest.json")
    spec = ModelSpec.from_facts(Manifest.load(manifest_json.parent).facts)
    defaults = CoordinatorSettings()
    costs = Costs.of(spec, defaults.sessions_per_stage, defaults.context_tokens)
    first, last = costs.need(0, N_LAYER // 2), costs.need(N_LAYER // 2, N_LAYER)
    assert first < last, "the last stage must need more than the first"
    return (first + last) // 2


async def _ready(child: Child, timeout: float = 300.0) -> str:
    """The node id in the child's READY line, once it serves."""
    assert child.process.stdout is not None
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = await asyncio.wait_for(child.process.stdout.readline(), end - time.monotonic())
        if line.startswith(b"READY"):
            child.ready_line = line.decode().strip()
            return node_id(child)
        if not line:
            break
    raise AssertionError(f"{child.name} never served; see {child.log_path}")


def _routes(me: Identity, n: int) -> dict[tuple[str, ...], Route]:
    """Distinct routes among `n` asked for (the coordinator hands them round the chains)."""
    found: dict[tuple[str, ...], Route] = {}
    for _ in range(n):
        route, _ = fetch_route(me)
        found[tuple(s.node_id for s in route.stages)] = route
    return found


def _until(what: str, check: Any, timeout: float = 120.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f} s")


async def _ask(me: Identity, route: Route) -> list[int]:
    client = RecoveringClient(
        me.credentials(), route, avoiding_source(me), RecoveryPolicy(step_timeout_s=20.0)
    )
    out: list[int] = []
    async with client:
        async for event in client.generate(PROMPT, N_TOKENS):
            out.extend(event.tokens)
    return out


@dataclass
class Swarm:
    coord: CoordinatorProcess
    me: Identity
    chains: dict[tuple[str, ...], Route]
    small: str
    """The node of the small worker (the liar, where it lies): a first stage."""
    others: set[str]


Scenario = Callable[[Swarm], Awaitable[None]]


def _run(tmp_path: Path, lie: bool, scenario: Scenario) -> None:
    """Start the swarm (the small worker lying or not), ask each chain for an answer,
    then run `scenario`."""
    model = write_tiny_model(tmp_path / "tiny8.gguf", n_layer=N_LAYER)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        coord = await loop.run_in_executor(
            None,
            lambda: CoordinatorProcess.start(
                tmp_path / "coordinator", model, min_stages=2, extra_args=COORDINATOR_ARGS
            ),
        )
        workers: list[Child] = []
        try:
            small_args = ["--vram-cap", str(_liar_cap(coord))]
            lies = {"SANGAMA_TEST_LIE": "noise"} if lie else None
            small = await spawn_worker(coord, tmp_path, "liar", False, small_args, env=lies)
            workers.append(small)
            honest = await asyncio.gather(
                *(spawn_worker(coord, tmp_path, f"w{i}", True, HONEST_ARGS) for i in range(5))
            )
            workers += honest
            small_id = await _ready(small)
            code = coord.admin.create_invite("client")["code"]
            me = await loop.run_in_executor(None, join_swarm, code, tmp_path / "me")

            def three_chains() -> dict[tuple[str, ...], Route] | None:
                found = _routes(me, 6)
                return found if len(found) == 3 else None

            chains = await loop.run_in_executor(None, _until, "three chains", three_chains)
            assert small_id in {c[0] for c in chains}, f"not a first stage: {list(chains)}"
            layers = {tuple(s.layers for s in r.stages) for r in chains.values()}
            assert len(layers) == 1, f"the chains split the layers differently: {layers}"
            for route in chains.values():
                assert len(await _ask(me, route)) == N_TOKENS
            await scenario(Swarm(coord, me, chains, small_id, {node_id(w) for w in honest}))
        finally:
            await asyncio.gather(*(w.stop() for w in workers))
            coord.stop()

    asyncio.run(run())


def _faults(coord: CoordinatorProcess) -> dict[str, Any]:
    found: dict[str, Any] = coord.admin.get("/api/v1/faults")
    return found


def test_a_stage_that_lies_is_caught_and_leaves_the_routes(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> None:
        loop = asyncio.get_running_loop()
        coord, liar_id = swarm.coord, swarm.small
        firsts = {c[0] for c in swarm.chains}

        def caught() -> dict[str, Any] | None:
            faults = _faults(coord)
            return faults if liar_id in faults["faulty"] else None

        faults = await loop.run_in_executor(None, _until, "the liar caught", caught)
        evidence = faults["faulty"][liar_id]
        assert evidence["verdict"] == "faulty" and evidence["node"] == liar_id
        assert {evidence["checker"], evidence["third"]} == firsts - {liar_id}
        assert evidence["checker_digest"] == evidence["third_digest"] != evidence["claimed"]
        start, stop = evidence["positions"]
        assert 0 <= start < stop and evidence["session"]
        assert set(faults["faulty"]) == {liar_id}  # no honest stage marked

        # Out of the plan and of every route at once; its certificate is held.
        routes = await loop.run_in_executor(None, _routes, swarm.me, 6)
        assert routes and all(liar_id not in c for c in routes)
        events = coord.admin.get("/api/v1/events")
        assert any(e["kind"] == "faulty" and e["node_id"] == liar_id for e in events)
        liar_identity = Identity.load(coord.data_dir.parent / "liar")
        with pytest.raises(CoordinatorRefused, match="faulty"):
            await loop.run_in_executor(
                None, liar_identity.client().renew, liar_identity.certified.private_key
            )

        # The honest first stages' own checks came out honest.
        def honest_checked() -> list[dict[str, Any]] | None:
            found = [r for r in _faults(coord)["recent"] if r["node"] in swarm.others]
            return found or None

        recent = await loop.run_in_executor(None, _until, "an honest check", honest_checked)
        assert all(r["verdict"] == "honest" for r in recent)

        # The operator clears it: placed again.
        coord.admin.delete(f"/api/v1/faults/{liar_id}")
        assert liar_id not in _faults(coord)["faulty"]

    _run(tmp_path, True, scenario)


def test_an_honest_swarm_marks_nobody(tmp_path: Path) -> None:
    async def scenario(swarm: Swarm) -> None:
        loop = asyncio.get_running_loop()
        firsts = {c[0] for c in swarm.chains}

        def all_checked() -> list[dict[str, Any]] | None:
            recent = _faults(swarm.coord)["recent"]
            return recent if {r["node"] for r in recent} >= firsts else None

        recent = await loop.run_in_executor(None, _until, "every first stage checked", all_checked)
        assert {r["verdict"] for r in recent} == {"honest"}
        assert all(r["checker"] in firsts - {r["node"]} for r in recent)
        assert _faults(swarm.coord)["faulty"] == {}
        assert len(await loop.run_in_executor(None, _routes, swarm.me, 6)) == 3

    _run(tmp_path, False, scenario)
