"""A worker's link onward when the coordinator replaces its next stage
(app.serving.links.downstream): sessions that reached the old next stage fail, a replay whose
OPEN came while the link was down goes on to the new one, and the worker is told at once
that sessions wait for a link (its heartbeat then asks early). Fake channels from a fake
dialer: no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest

from app.config import Hop
from app.serving.links.downstream import Downstream, carried
from net import wire
from net.channel import Channel, NodeCredentials
from net.quic.links import QuicTuning
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

OLD_HOP = Hop("worker-old", ("127.0.0.1", 1))
NEW_HOP = Hop("worker-new", ("127.0.0.1", 2))


class FakeChannel:
    def __init__(self) -> None:
        self.sent: list[wire.Frame] = []
        self.closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.on_frame: Callable[..., None] | None = None
        self.on_close: Callable[[Any, str], None] | None = None

    def send(self, frame: wire.Frame) -> None:
        self.sent.append(frame)

    def close(self, reason: str) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)

    def die(self) -> None:
        """The peer went away: the link closes under the worker."""
        self.close("peer unreachable")
        assert self.on_close is not None
        self.on_close(self, "peer unreachable")


async def settle() -> None:
    """Let the link's dialling task run to where it waits."""
    for _ in range(20):
        await asyncio.sleep(0)


def opened(name: str) -> wire.Open:
    return wire.Open(name, "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 4)


def step(name: str, start: int, n: int) -> wire.Step:
    return wire.Step(name, start, start, (1,) * n, bytes(16 * n), n, 4, WireDtype.F32)


def test_a_replay_that_never_reached_the_old_next_stage_goes_to_the_new_one() -> None:
    async def scenario() -> None:
        channels: dict[str, list[FakeChannel]] = {OLD_HOP.node_id: [], NEW_HOP.node_id: []}
        old_is_dead = asyncio.Event()
        waiting_told: list[bool] = []

        async def dial(node: str, _address: tuple[str, int]) -> tuple[Channel, str]:
            if node == OLD_HOP.node_id and old_is_dead.is_set():
                await asyncio.Event().wait()  # a dead stage: dialling never gets through
            channel = FakeChannel()
            channels[node].append(channel)
            return cast(Channel, channel), "direct"

        down = Downstream(
            OLD_HOP,
            cast(NodeCredentials, None),
            QuicTuning(),
            lambda _c, _f: None,
            lambda _reason: None,
            dialer=dial,
            on_waiting=lambda: waiting_told.append(True),
        )
        # A running answer: its prompt and a decode step went to the old next stage.
        down.send(opened("old"))
        await settle()
        assert down.connected and not down.waiting
        waiting_told.clear()
        down.send(step("old", 0, 4))
        down.send(step("old", 4, 1))
        rtt = asyncio.ensure_future(down.measure_rtt(timeout=60.0))  # a beat's PING
        await settle()
        # The old next stage dies: the link relinks (in vain) and the worker is told.
        old_is_dead.set()
        channels[OLD_HOP.node_id][0].die()
        await settle()
        assert down.waiting and waiting_told and down.lost_at is not None
        # The PING's waiter ends with the link, not at its timeout: the early heartbeat
        # is not held up by it.
        assert rtt.done() and rtt.result() is None
        # The client's replay arrives before the coordinator's news: held, not sent.
        down.send(opened("replay"))
        down.send(step("replay", 0, 5))
        # The heartbeat brings the new next stage.
        assert down.retarget(NEW_HOP) == ("old",)  # its KV was on the old stage
        await settle()
        (new_link,) = channels[NEW_HOP.node_id]
        assert new_link.sent == [opened("replay"), step("replay", 0, 5)]
        assert down.connected and not down.waiting and down.lost_at is None
        # Once sent, a session is on the new stage: a further retarget fails it.
        assert down.retarget(OLD_HOP) == ("replay",)
        await down.close()

    asyncio.run(scenario())


def test_carried_keeps_only_sessions_no_link_carried() -> None:
    assert carried(("a", "b", "c"), {"c", "a", "x"}) == ("a", "c")
    assert carried(("a",), set()) == ()
