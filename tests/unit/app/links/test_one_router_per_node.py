"""The desktop app's worker and its chat are one node in one process, and its signalling
messages (ICE offers and answers through the coordinator) come from one mailbox: the
coordinator hands each message to whichever request for that node's messages asks first.
Two routers polling that mailbox steal each other's messages: an ICE answer to the
worker's dial to its next stage (a stage that came back and does not take direct dials
yet), taken by the chat's router, never reaches the worker's dial, and offers for the
worker taken there are never answered. The app's pieces must share one router."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from app.links.paths import node_router, start_links
from coordinator.contract import Signal, TurnAnswer
from net.ice.paths import IceOffer
from net.quic.links import QuicTuning

pytestmark = pytest.mark.unit

NODE = "worker-a"
OFFER = IceOffer("ufrag1", "p" * 22, ())


class Mailbox:
    """The coordinator's side: one queue of messages per node, handed to the earliest
    waiting request (SignalBoxes + GET SIGNALS)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._messages: list[Signal] = []
        self._waiting: list[list[Signal]] = []

    def post(self, message: Signal) -> None:
        with self._cond:
            if self._waiting:
                self._waiting.pop(0).append(message)
            else:
                self._messages.append(message)
            self._cond.notify_all()

    def take(self, wait: float) -> list[Signal]:
        with self._cond:
            if self._messages:
                taken, self._messages = self._messages, []
                return taken
            mine: list[Signal] = []
            self._waiting.append(mine)
            self._cond.wait_for(lambda: bool(mine), timeout=wait)
            if mine:
                return mine
            self._waiting.remove(mine)
            return []

    def waiters(self) -> int:
        with self._cond:
            return len(self._waiting)


class Client:
    """A CoordinatorClient of NODE (each part of the app makes its own)."""

    def __init__(self, box: Mailbox) -> None:
        self.base_url = "https://coordinator.test"
        self.node_id = NODE
        self._box = box

    def signals(self, wait: float) -> list[Signal]:
        return self._box.take(min(wait, 0.5))

    def post_signal(self, peer: str, kind: str, link: str, payload: dict[str, Any]) -> None:
        pass

    def turn(self) -> TurnAnswer | None:
        return None


async def _until(pred: Any, within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not pred():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


def test_the_workers_ice_answers_reach_it_while_the_chat_is_connected() -> None:
    async def scenario() -> list[bool]:
        box = Mailbox()
        # The chat connected first (its links live as long as the chat window's
        # connection); the worker's stage router starts later (a stage rebuilt).
        _dialer, chat_router = await start_links(Client(box), object(), QuicTuning())  # type: ignore[arg-type]
        await _until(lambda: box.waiters() == 1)
        worker_router = node_router(Client(box))  # type: ignore[arg-type]
        worker_router.start()
        got = []
        try:
            for n in range(4):  # the worker dials its next stage over ICE, four times
                link = f"link{n}.1"
                waiting = asyncio.ensure_future(worker_router.receive("answer", link))
                await asyncio.sleep(0.05)
                box.post(Signal("worker-b", "answer", link, OFFER.to_dict()))
                done, _ = await asyncio.wait({waiting}, timeout=2.0)
                got.append(bool(done))
                waiting.cancel()
        finally:
            await worker_router.stop()
            await chat_router.stop()
        return got

    assert asyncio.run(scenario()) == [True] * 4
