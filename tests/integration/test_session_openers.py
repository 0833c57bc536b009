"""Who may open sessions on which stage, seen by a client-invite holder on a real swarm
(three `sangama worker` processes on loopback, raw frames over real QUIC links).

- One client holding hundreds of OPENs it never steps leaves room for an honest chat:
  the first stage lets one node hold only its share, and stages past the first take
  OPENs only from the stage before them.
- An OPEN sent straight to a middle stage is refused, NOT_OWNER.
- A ring (`Open.loop`) naming an address that is not the first stage's is refused,
  BAD_VALUE, and nothing is sent there.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from app.client.swarm_client import SwarmClient
from app.credentials import issue_node, load_credentials
from app.lab.local_swarm import LocalSwarm
from net import wire
from net.channel import Channel, NodeCredentials, connect_channel
from net.errors import ErrorCode
from net.wire.tensors import WireDtype
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [5, 9, 13, 17]
NEW = 8
HELD = 300
PATIENCE_S = 15.0
"""How long to wait before calling a test failed; never an expectation of speed."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("openers") / "tiny6.gguf", n_layer=6)


def intruder(swarm: LocalSwarm) -> NodeCredentials:
    """A node that redeemed a client invite: a real certificate, role client."""
    assert swarm.workdir is not None
    out = issue_node(swarm.workdir / "ca", "intruder", "client", swarm.workdir / "intruder")
    return load_credentials(out, "intruder")


def open_frame(name: str, loop: wire.Loop | None = None) -> wire.Open:
    return wire.Open(name, "m", WireDtype.F32, wire.SamplingSpec(), "intruder", 4, 4, loop=loop)


async def dial(swarm: LocalSwarm, creds: NodeCredentials, index: int) -> Channel:
    assert swarm.route is not None
    stage = swarm.route.stages[index]
    return await connect_channel(stage.address, creds, stage.node_id, swarm.tuning, PATIENCE_S)


def collect_errors(channel: Channel) -> list[wire.Error]:
    errors: list[wire.Error] = []
    channel.on_frame = lambda _c, f: errors.append(f) if isinstance(f, wire.Error) else None
    return errors


async def until(predicate: object, what: str) -> None:
    assert callable(predicate)
    for _ in range(int(PATIENCE_S / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_honest_chat_answers_while_another_client_holds_hundreds_of_idle_opens(
    tiny: Path,
) -> None:
    async def scenario() -> tuple[list[int], list[int], int, int]:
        # max_sessions_per_node 0: the worker's own default share (the lab's is all).
        async with LocalSwarm(
            model=str(tiny), cuts=[0, 2, 4, 6], max_sessions=8, max_sessions_per_node=0
        ) as swarm:
            assert swarm.client_credentials is not None and swarm.route is not None
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:
                quiet = [t async for ev in client.generate(PROMPT, NEW) for t in ev.tokens]
            bad = intruder(swarm)
            ch_first, ch_middle, ch_last = [await dial(swarm, bad, i) for i in (0, 1, 2)]
            refused = [collect_errors(ch) for ch in (ch_first, ch_middle, ch_last)]
            for i in range(HELD):  # OPENs never stepped, on every stage it can reach
                for ch in (ch_first, ch_middle, ch_last):
                    ch.send(open_frame(f"held{i}"))
                if i % 50 == 0:
                    await asyncio.sleep(0)
            # Every OPEN past the stage's share is answered; the rest sit there, idle.
            await until(lambda: sum(map(len, refused)) >= 3 * HELD - 8, "the refusals")
            async with SwarmClient(swarm.client_credentials, swarm.route) as client:
                during = [t async for ev in client.generate(PROMPT, NEW) for t in ev.tokens]
            held_first = HELD - len(refused[0])
            not_owner = sum(1 for e in refused[1] + refused[2] if e.code is ErrorCode.NOT_OWNER)
            return quiet, during, held_first, not_owner

    quiet, during, held_first, not_owner = asyncio.run(scenario())
    assert len(quiet) == NEW and during == quiet
    assert 0 < held_first < 8  # its share of the first stage's 8 sessions, not all
    assert not_owner == 2 * HELD  # no stage past the first took one


def test_opens_at_a_middle_stage_and_rings_to_other_addresses_are_refused(tiny: Path) -> None:
    async def scenario() -> tuple[list[wire.Error], list[wire.Error], int]:
        async with LocalSwarm(model=str(tiny), cuts=[0, 2, 4, 6], max_sessions=8) as swarm:
            assert swarm.route is not None
            bad = intruder(swarm)
            ch_first = await dial(swarm, bad, 0)
            ch_middle = await dial(swarm, bad, 1)
            ch_last = await dial(swarm, bad, 2)  # so the last stage would take its OPENs
            at_middle, at_first = collect_errors(ch_middle), collect_errors(ch_first)
            ch_middle.send(open_frame("m1"))

            # Where a hostile ring would make the last stage send its datagrams.
            victim = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            victim.bind(("127.0.0.1", 0))
            victim.setblocking(False)
            target = wire.Loop.address_text(victim.getsockname())
            first = swarm.route.first
            ring = wire.Loop(first.node_id, target, swarm.route.last.node_id)
            ch_first.send(open_frame("r1", ring))
            await until(lambda: at_middle and at_first, "both refusals")
            await asyncio.sleep(0.5)  # a dial to the victim would have begun by now
            reached = 0
            while True:
                try:
                    victim.recv(65536)
                except BlockingIOError:
                    break
                reached += 1
            victim.close()
            for ch in (ch_first, ch_middle, ch_last):
                ch.close()
            return at_middle, at_first, reached

    at_middle, at_first, reached = asyncio.run(scenario())
    assert [(e.session, e.code) for e in at_middle] == [("m1", ErrorCode.NOT_OWNER)]
    assert [(e.session, e.code) for e in at_first] == [("r1", ErrorCode.BAD_VALUE)]
    assert reached == 0
