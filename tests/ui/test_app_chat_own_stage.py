"""The desktop app's chat window through a swarm where the app's own worker is a stage:
a coordinator and two worker processes serving SmolLM2, the window's controller connected
the way the tray connects it (`identity_connector` on the identity the app serves with).

The chat client and the app's stage then share one node id. The first chat right after
both stages serve used to wait out the 60 s first-token timeout (installers/README.md):
the last stage answered on the newest link under that id, the app's worker's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.client.connect import identity_connector
from app.client.route import fetch_route
from app.identity import Identity
from app.lab.processes import Child, spawn_sangama
from app.ui.chat_controller import ChatController, ChatStats
from app.ui.chat_window import ChatWindow
from app.ui.controllers import AsyncThread
from app.ui.history import History
from tests.support.coordinator_proc import CoordinatorProcess

pytestmark = [pytest.mark.ui, pytest.mark.integration, pytest.mark.e2e]

QUESTION = "What is 2 + 2?"
ANSWER_WAIT_MS = 45_000
"""Below the client's 60 s first-token timeout: an answer that never arrives fails here."""


@pytest.fixture(scope="module")
def coord(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    # The coordinator slices the model on first use: generous on a busy machine.
    data = tmp_path_factory.mktemp("coordinator")
    c = CoordinatorProcess.start(data, smollm2_path, min_stages=2, timeout=600)
    yield c
    c.stop()


@pytest.fixture
def runner() -> Iterator[AsyncThread]:
    r = AsyncThread("test-own-stage")
    yield r
    r.stop()


async def _start_worker(coord: CoordinatorProcess, wd: Path, name: str) -> Child:
    code = coord.admin.create_invite("worker")["code"]
    args = ["worker", "--join", code, "--identity-dir", str(wd / name)]
    return await spawn_sangama(name, args, wd / f"{name}.log", 180)


def _ask(
    qtbot: QtBot, window: ChatWindow, chat: ChatController, text: str
) -> tuple[ChatStats, str]:
    failures: list[str] = []
    pieces: list[str] = []
    chat.text.connect(pieces.append)
    chat.failed.connect(failures.append)
    try:
        window.prompt.setPlainText(text)
        with qtbot.waitSignal(chat.finished, timeout=ANSWER_WAIT_MS) as done:
            window.send()
    finally:
        chat.failed.disconnect(failures.append)
        chat.text.disconnect(pieces.append)
    assert not failures, failures
    stats = done.args[0]
    assert isinstance(stats, ChatStats) and not stats.stopped
    qtbot.waitUntil(lambda: not chat.busy and window.send_button.isEnabled(), timeout=5000)
    return stats, "".join(pieces)


def test_the_apps_first_chat_through_its_own_first_stage_answers(
    qapp: QApplication,
    qtbot: QtBot,
    runner: AsyncThread,
    coord: CoordinatorProcess,
    tmp_path: Path,
) -> None:
    async def both() -> list[Child]:
        return list(
            await asyncio.gather(*(_start_worker(coord, tmp_path, f"w{i}") for i in range(2)))
        )

    workers = runner.submit(both()).result(400)
    chat: ChatController | None = None
    try:
        ids = {w.name: Identity.load(tmp_path / w.name) for w in workers}
        route, _ = fetch_route(ids["w0"])
        chain = [s.node_id for s in route.stages]
        assert len(chain) == 2
        # The app is the route's first stage and chats as that stage's identity.
        own = tmp_path / next(n for n, i in ids.items() if i.node_id == chain[0])
        chat = ChatController(runner, identity_connector(own))
        window = ChatWindow(chat, History(tmp_path / "chats"))
        window.max_tokens.setValue(40)
        # Greedy, as this chain was measured: the answer is then the same every run.
        window.greedy.setChecked(True)
        window.show()
        # The first chat right after both stages serve: the one that timed out.
        first, answer = _ask(qtbot, window, chat, QUESTION)
        assert first.stages == 2 and first.tokens > 1
        assert "4" in answer, answer
        again, _ = _ask(qtbot, window, chat, "And 3 + 3?")
        assert again.stages == 2 and again.tokens > 1
    finally:
        if chat is not None:
            chat.shutdown()
        for w in workers:
            runner.submit(w.stop()).result(30)
