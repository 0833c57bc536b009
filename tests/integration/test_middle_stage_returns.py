"""A middle stage leaves mid-chat (its volunteer stops it: it drains, then stops) and
comes back with the same identity while the first stage runs the way the desktop app
runs it: its worker and its chat in one process, on one event loop (app/ui: AsyncThread,
serve_as_guest, identity_connector on the worker's own identity). No spare. Once the
middle serves again the app's chat, a fresh connection of the app and the
coordinator's own probe all get answers.

Every worker runs in this process, each on its own loop thread as the app runs one, so
which of them placement makes the first stage does not matter. The coordinator's
timeouts are short (stale 4 s, dead 8 s) so the middle's absence outlasts them (it
leaves the plan and comes back into it), as a 27 s absence after a 20 s drain does with
the defaults. ~90 s."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from app.client.connect import ChatConnection, identity_connector
from app.client.generation import answer_of
from app.client.route import fetch_route
from app.identity import Identity, join_swarm
from app.serving.coordinated import CoordinatedOptions
from app.serving.guest.loop import serve_as_guest
from app.serving.guest.policy import GuestSettings
from app.ui.controllers import AsyncThread
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7]
AWAY_S = 14.0
"""Past the coordinator's dead_after (8 s) and the first stage's relink window (so
the link to the middle is given up, not resumed)."""


class AppNode:
    """One node as the desktop app runs it: a loop thread serving as the joined node."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.node_id = Identity.load(directory).node_id
        self.runner: AsyncThread | None = None
        self._stop: asyncio.Event | None = None
        self._serving: Future[None] | None = None

    def start(self) -> None:
        self.runner = AsyncThread(self.directory.name)

        async def serve() -> None:
            self._stop = asyncio.Event()
            options = CoordinatedOptions(identity_dir=self.directory, drain_s=2.0)
            await serve_as_guest(options, GuestSettings(), self._stop, lambda _s: None)

        self._serving = self.runner.submit(serve())

    def stop(self) -> None:
        """As the volunteer's stop: running sessions drain, then the stage is freed."""
        assert self.runner is not None and self._serving is not None
        if self._stop is not None:
            self.runner.loop.call_soon_threadsafe(self._stop.set)
        self._serving.result(60)
        self.runner.stop()
        self.runner = None


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[tuple[CoordinatorProcess, list[AppNode]]]:
    model = write_tiny_model(tmp_path / "tiny9.gguf", n_layer=9)
    coord = CoordinatorProcess.start(
        tmp_path / "coordinator",
        model,
        min_stages=3,
        extra_args=["--stale-after", "4", "--dead-after", "8", "--answer-probe-every", "3"],
    )
    nodes: list[AppNode] = []
    try:
        for name in ("n0", "n1", "n2"):
            join_swarm(coord.admin.create_invite("worker")["code"], tmp_path / name)
            nodes.append(AppNode(tmp_path / name))
        for n in nodes:
            n.start()
        yield coord, nodes
    finally:
        for n in nodes:
            if n.runner is not None:
                try:
                    n.stop()
                except Exception:  # already failing: the test's own error says why
                    n.runner.stop()
        coord.stop()


def _answer(coord: CoordinatorProcess) -> Any:
    return coord.admin.swarm().get("answer") or {}


def test_a_middle_stage_that_drains_stops_and_returns_answers_again(
    swarm: tuple[CoordinatorProcess, list[AppNode]],
) -> None:
    coord, nodes = swarm
    some = Identity.load(nodes[0].directory)
    deadline = time.monotonic() + 120
    while True:
        try:
            route, _ = fetch_route(some)
            if len(route.stages) == 3:
                break
        except Exception:
            assert time.monotonic() < deadline, "no three-stage route"
        time.sleep(0.5)
    by_id = {n.node_id: n for n in nodes}
    first, middle = by_id[route.stages[0].node_id], by_id[route.stages[1].node_id]
    assert first.runner is not None

    async def ask(conn: ChatConnection, n: int) -> list[int]:
        return await answer_of(conn.client.generate(PROMPT, n))

    missed: list[str] = []

    async def app_side() -> tuple[list[int], list[int], list[int], list[int]]:
        # The app's chat: one connection kept across messages, as the chat window does.
        conn = await identity_connector(first.directory)()
        try:
            before = await asyncio.wait_for(ask(conn, 8), 45)
            loop = asyncio.get_running_loop()
            during = asyncio.ensure_future(ask(conn, 400))  # a chat while it leaves
            await asyncio.sleep(0.3)
            await loop.run_in_executor(None, middle.stop)
            away_until = loop.time() + AWAY_S
            while loop.time() < away_until:  # the operator hears the swarm cannot answer
                answer = await loop.run_in_executor(None, _answer, coord)
                if answer.get("can_answer") is False:
                    missed.append(answer["reason"])
                await asyncio.sleep(0.5)
            middle.start()
            long = await asyncio.wait_for(during, 120)
            after = await asyncio.wait_for(ask(conn, 8), 45)
        finally:
            await conn.close()
        fresh_conn = await identity_connector(first.directory)()
        try:
            fresh = await asyncio.wait_for(ask(fresh_conn, 8), 45)
        finally:
            await fresh_conn.close()
        return before, long, after, fresh

    before, long, after, fresh = first.runner.submit(app_side()).result(400)
    assert len(long) == 400
    assert missed, "the coordinator never said the swarm could not answer"
    assert after == before == fresh
    deadline = time.monotonic() + 60
    while _answer(coord).get("can_answer") is not True:
        assert time.monotonic() < deadline, _answer(coord)
        time.sleep(1)
