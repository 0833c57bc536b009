"""One authenticated node floods a real first stage with OPENs (each closed at once): past
its burst it is refused OVERLOADED ("too fast", with a retry hint), and a client answering
meanwhile, and after, gets exactly the tokens it gets on a quiet swarm."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.client.swarm_client import SwarmClient
from app.credentials import issue_node, load_credentials
from app.lab.local_swarm import LocalSwarm
from net import wire
from net.channel import connect_channel
from net.errors import ErrorCode
from net.protocol import overload_hint
from net.wire.tensors import WireDtype
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

FLOOD = 400
PROMPT = [5, 9, 13, 17]
NEW = 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("flood") / "tiny8.gguf", n_layer=8)


def test_a_flood_of_opens_from_one_node_is_refused_and_others_answer_unchanged(
    tiny: Path,
) -> None:
    async def scenario() -> tuple[list[int], list[int], list[int], list[wire.Error]]:
        swarm = LocalSwarm(model=str(tiny), cuts=[0, 4, 8], max_sessions=8)
        await swarm.start()
        try:
            assert swarm.route is not None and swarm.workdir is not None
            assert swarm.client_credentials is not None
            flooder = load_credentials(
                issue_node(swarm.workdir / "ca", "flooder", "client", swarm.workdir / "flooder"),
                "flooder",
            )
            first = swarm.route.first
            errors: list[wire.Error] = []
            ch = await connect_channel(first.address, flooder, first.node_id)
            ch.on_frame = lambda _c, f: errors.append(f) if isinstance(f, wire.Error) else None
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:
                quiet = [t async for ev in client.generate(PROMPT, NEW) for t in ev.tokens]
                during_gen = client.generate(PROMPT, NEW)
                during = list((await during_gen.__anext__()).tokens)
                for i in range(FLOOD):
                    name = f"f{i}"
                    ch.send(wire.Open(name, "m", WireDtype.F32, wire.SamplingSpec(), "x", 4, 4))
                    ch.send(wire.Close(name, "flood"))
                    if i % 50 == 0:
                        await asyncio.sleep(0)
                during += [t async for ev in during_gen for t in ev.tokens]
                for _ in range(100):  # the refusals of the last OPENs are still on their way
                    if len(errors) >= FLOOD // 2:
                        break
                    await asyncio.sleep(0.05)
                after = [t async for ev in client.generate(PROMPT, NEW) for t in ev.tokens]
            ch.close()
            return quiet, during, after, errors
        finally:
            await swarm.stop()
            swarm.cleanup()

    quiet, during, after, errors = asyncio.run(scenario())
    assert len(quiet) == NEW and during == quiet and after == quiet
    too_fast = [e for e in errors if "too fast" in e.message]
    assert len(too_fast) >= FLOOD // 2, [e.message for e in errors[:5]]
    for e in too_fast:
        assert e.code is ErrorCode.OVERLOADED
        hint, _ = overload_hint(e.code, e.message)
        assert hint is not None and hint.retry_after_ms > 0 and not hint.try_another_route
