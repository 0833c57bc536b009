"""The coordinator's two-token probe (coordinator/server/answer_prober.probe_chain)
against real workers on loopback (app.lab.local_swarm, the tiny model): a one-stage and
a two-stage chain answer; with every datagram between the two stages dropped (the links
to the client untouched), the probe says no token came back, and that every stage
still accepts links, so the link between them is what fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.config import format_address
from app.lab.local_swarm import LocalSwarm
from coordinator.server.answer_probe import Chain, Failure, ProbeFailure, ProbePolicy, describe
from coordinator.server.answer_prober import probe_chain
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

POLICY = ProbePolicy(timeout_s=8.0, dial_timeout_s=3.0)


def _chain(swarm: LocalSwarm) -> Chain:
    assert swarm.route is not None
    return tuple((s.node_id, format_address(s.address)) for s in swarm.route.stages)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny8.gguf", n_layer=8)


def test_a_one_stage_chain_answers_the_probe(model: Path) -> None:
    async def scenario() -> Failure | None:
        async with LocalSwarm(model=str(model), cuts=[0, 8]) as swarm:
            assert swarm.client_credentials is not None
            return await probe_chain(_chain(swarm), "tiny8", swarm.client_credentials, POLICY)

    assert asyncio.run(scenario()) is None


def test_a_link_between_stages_that_carries_nothing_fails_the_probe(model: Path) -> None:
    async def scenario() -> tuple[Failure | None, Failure | None, Chain]:
        swarm = LocalSwarm(model=str(model), cuts=[0, 4, 8], link_delays_ms=[0, 0, 0])
        async with swarm:
            creds = swarm.client_credentials
            assert creds is not None
            chain = _chain(swarm)
            before = await probe_chain(chain, "tiny8", creds, POLICY)
            swarm.proxies[1].loss = 1.0  # stage 0 -> stage 1 only
            after = await probe_chain(chain, "tiny8", creds, POLICY)
            return before, after, chain

    before, after, chain = asyncio.run(scenario())
    assert before is None
    assert after is not None and after.kind is ProbeFailure.NO_TOKEN, after
    assert after.silent == ()
    assert "a link between stages" in describe(after, chain)
