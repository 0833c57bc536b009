"""The desktop app's chat through a swarm where the app's own worker is a stage.

The app chats as the identity it serves with (app/ui: `identity_connector` on its own
identity dir), so the chat client and the app's stage share one node id. Its first chat
right after both stages serve must answer, like a chat from any other node."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.client.connect import identity_connector
from app.client.generation import answer_of
from app.client.route import fetch_route
from app.identity import Identity
from app.lab.local_run import build_pipeline
from app.lab.processes import Child, spawn_sangama
from core.types import LayerRange
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 17, 42, 99, 7]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny8.gguf", n_layer=8)


@pytest.fixture(scope="module")
def coord(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    c = CoordinatorProcess.start(tmp_path_factory.mktemp("coordinator"), model, min_stages=2)
    yield c
    c.stop()


async def _start_worker(coord: CoordinatorProcess, wd: Path, name: str) -> Child:
    code = coord.admin.create_invite("worker")["code"]
    args = ["worker", "--join", code, "--identity-dir", str(wd / name)]
    return await spawn_sangama(name, args, wd / f"{name}.log", 180)


def test_first_chat_as_the_first_stages_own_identity_answers(
    coord: CoordinatorProcess, model: Path, tmp_path: Path
) -> None:
    whole = build_pipeline([model], [LayerRange(0, 8)], 8, 512, 64, 1, True)
    expected = list(whole.generate(PROMPT, 6).tokens)
    whole.shutdown()

    async def scenario() -> tuple[list[int], list[int], list[str]]:
        workers = list(
            await asyncio.gather(*(_start_worker(coord, tmp_path, f"w{i}") for i in range(2)))
        )
        try:
            loop = asyncio.get_running_loop()
            ids = {w.name: Identity.load(tmp_path / w.name) for w in workers}
            route, _ = await loop.run_in_executor(None, fetch_route, ids["w0"])
            chain = [s.node_id for s in route.stages]
            # The app is the route's first stage: it chats as that stage's identity.
            own = next(n for n, i in ids.items() if i.node_id == chain[0])

            async def chat() -> list[int]:
                conn = await identity_connector(tmp_path / own)()
                try:
                    return await answer_of(conn.client.generate(PROMPT, 6))
                finally:
                    await conn.close()

            # Bounded below the client's 60 s first-token wait: an answer sent to the
            # app's worker instead of its chat never arrives.
            first = await asyncio.wait_for(chat(), 45)
            second = await asyncio.wait_for(chat(), 45)
            return first, second, chain
        finally:
            for w in workers:
                await w.stop()

    first, second, chain = asyncio.run(scenario())
    assert len(chain) == 2
    assert first == expected
    assert second == expected
