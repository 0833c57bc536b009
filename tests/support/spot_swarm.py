"""A coordinated swarm for spot checks, as processes: a coordinator and six workers in
three chains of two stages (8 layers, 4 + 4), the small worker placed as a first stage
and lying where asked (app/serving/chaos_lies.py). The set-up of
tests/integration/test_spot_checks.py and of bench/trust.py.

    await run_spot_swarm(root, {"SANGAMA_TEST_LIE": "noise"}, scenario)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.client.connect import avoiding_source
from app.client.generation import apply_event
from app.client.recovering import RecoveringClient
from app.client.recovery import RecoveryPolicy
from app.client.route import fetch_route
from app.config import Route
from app.identity import Identity, join_swarm
from app.lab.processes import Child
from coordinator.server.placement.costs import Costs
from coordinator.server.placement.model import ModelSpec
from coordinator.server.service import CoordinatorSettings
from core.manifest import Manifest
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.spare_swarm import node_id, spawn_worker
from tests.support.tiny_models import write_tiny_model

N_LAYER = 8
PROMPT = [46, 396, 89, 255, 13, 12, 429, 5]
N_TOKENS = 8
HONEST_ARGS = ["--vram-cap", "3G"]


def coordinator_args(rate: float) -> list[str]:
    """Three chains, spot checks at `rate`; the answer probe off (its sessions would share
    the stages' decodes and add checks)."""
    return [
        "--answer-probe-every",
        "0",
        "--max-chains",
        "3",
        "--spot-check-rate",
        str(rate),
        "--stale-after",
        "10",
        "--dead-after",
        "30",
    ]


def liar_cap(coord: CoordinatorProcess) -> int:
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


async def ready(child: Child, timeout: float = 300.0) -> str:
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


def routes(me: Identity, n: int) -> dict[tuple[str, ...], Route]:
    """Distinct routes among `n` asked for (the coordinator hands them round the chains)."""
    found: dict[tuple[str, ...], Route] = {}
    for _ in range(n):
        route, _ = fetch_route(me)
        found[tuple(s.node_id for s in route.stages)] = route
    return found


def until(what: str, check: Any, timeout: float = 120.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f} s")


def recovering_client(me: Identity, route: Route, faulty_poll_s: float = 5.0) -> RecoveringClient:
    """A client that replays a broken answer on a route avoiding the suspects."""
    policy = RecoveryPolicy(step_timeout_s=20.0, faulty_poll_s=faulty_poll_s)
    return RecoveringClient(me.credentials(), route, avoiding_source(me), policy)


async def ask(me: Identity, route: Route, n: int = N_TOKENS) -> list[int]:
    out: list[int] = []
    async with recovering_client(me, route) as client:
        async for event in client.generate(PROMPT, n):
            apply_event(out, event)
    return out


def faults(coord: CoordinatorProcess) -> dict[str, Any]:
    found: dict[str, Any] = coord.admin.get("/api/v1/faults")
    return found


@dataclass
class Swarm:
    coord: CoordinatorProcess
    me: Identity
    chains: dict[tuple[str, ...], Route]
    small: str
    """The node of the small worker (the liar, where it lies): a first stage."""
    others: set[str]
    model: Path


Scenario = Callable[[Swarm], Awaitable[None]]


def run_spot_swarm(
    root: Path,
    lie: Mapping[str, str] | None,
    scenario: Scenario,
    coordinator: Sequence[str] | None = None,
) -> None:
    """Start the swarm (the small worker with `lie` in its environment), ask each chain
    for an answer, then run `scenario`; everything is stopped after it."""
    model = write_tiny_model(root / "tiny8.gguf", n_layer=N_LAYER)
    extra = list(coordinator_args(1.0) if coordinator is None else coordinator)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        coord = await loop.run_in_executor(
            None,
            lambda: CoordinatorProcess.start(
                root / "coordinator", model, min_stages=2, extra_args=extra
            ),
        )
        workers: list[Child] = []
        try:
            small_args = ["--vram-cap", str(liar_cap(coord))]
            small = await spawn_worker(coord, root, "liar", False, small_args, env=lie)
            workers.append(small)
            honest = await asyncio.gather(
                *(spawn_worker(coord, root, f"w{i}", True, HONEST_ARGS) for i in range(5))
            )
            workers += honest
            small_id = await ready(small)
            code = coord.admin.create_invite("client")["code"]
            me = await loop.run_in_executor(None, join_swarm, code, root / "me")

            def three_chains() -> dict[tuple[str, ...], Route] | None:
                found = routes(me, 6)
                return found if len(found) == 3 else None

            chains = await loop.run_in_executor(None, until, "three chains", three_chains)
            assert small_id in {c[0] for c in chains}, f"not a first stage: {list(chains)}"
            layers = {tuple(s.layers for s in r.stages) for r in chains.values()}
            assert len(layers) == 1, f"the chains split the layers differently: {layers}"
            for route in chains.values():
                assert len(await ask(me, route)) == N_TOKENS
            others = {node_id(w) for w in honest}
            await scenario(Swarm(coord, me, chains, small_id, others, model))
        finally:
            await asyncio.gather(*(w.stop() for w in workers))
            coord.stop()

    asyncio.run(run())
