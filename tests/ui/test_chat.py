"""The chat window against a real loopback swarm (two worker processes serving the
default model, SmolLM2 135M Instruct): a streamed answer to a question, the footer,
history on disk, Stop, new conversation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.client.connect import direct_connector
from app.lab.local_swarm import LocalSwarm
from app.ui.chat_controller import ChatController, ChatStats
from app.ui.chat_window import ChatWindow
from app.ui.controllers import AsyncThread
from app.ui.history import History

pytestmark = [pytest.mark.ui, pytest.mark.integration]

QUESTION = "What is 2 + 2?"


@pytest.fixture(scope="module")
def swarm_chat(smollm2_path: Path) -> Iterator[tuple[AsyncThread, ChatController]]:
    runner = AsyncThread("test-swarm")
    swarm = LocalSwarm(str(smollm2_path), [0, 15, 30])
    runner.submit(swarm.start()).result(240)
    assert swarm.route is not None and swarm.client_credentials is not None
    chat = ChatController(
        runner, direct_connector(swarm.client_credentials, swarm.route, smollm2_path, swarm.tuning)
    )
    yield runner, chat
    chat.shutdown()
    runner.submit(swarm.stop()).result(60)
    swarm.cleanup()
    runner.stop()


def test_streamed_answer_footer_history_and_stop(
    qapp: QApplication,
    qtbot: QtBot,
    swarm_chat: tuple[AsyncThread, ChatController],
    tmp_path: Path,
    artifacts: Path,
) -> None:
    _, chat = swarm_chat
    history = History(tmp_path / "chats")
    window = ChatWindow(chat, history)
    window.resize(900, 600)
    window.greedy.setChecked(True)  # the same answer every run: this test reads it
    window.show()
    pieces: list[str] = []
    chat.text.connect(pieces.append)
    window.max_tokens.setValue(60)
    window.prompt.setPlainText(QUESTION)
    with qtbot.waitSignal(chat.finished, timeout=90000) as done:
        window.send()
        qtbot.waitUntil(lambda: window.stop_button.isEnabled(), timeout=5000)
    stats = done.args[0] if done.args else None
    assert isinstance(stats, ChatStats) and not stats.stopped
    assert stats.tokens > 1 and stats.stages == 2 and stats.first_token_ms > 0
    assert len(pieces) > 1  # streamed, not one block
    answer = "".join(pieces)
    # An instruction-tuned model answers (a base model would continue the question), and
    # stops on its end-of-turn token before the limit.
    assert "4" in answer and QUESTION not in answer, answer
    assert stats.tokens < 60, answer
    assert answer.strip() in window.transcript.toPlainText()
    footer = window.footer.text()
    assert "tokens/s" in footer and "first token after" in footer and "2 stages" in footer
    # The buttons follow the controller's busy state, which may settle an event later.
    qtbot.waitUntil(
        lambda: not window.stop_button.isEnabled() and window.send_button.isEnabled(),
        timeout=5000,
    )
    assert window.grab().save(str(artifacts / "offscreen_chat_window.png"))
    saved = history.list()
    assert len(saved) == 1 and saved[0].messages[-1][0] == "assistant"

    # Stop: a long answer ends early, and says so
    window.max_tokens.setValue(2000)
    window.prompt.setPlainText("Write a long story about a lighthouse.")
    with qtbot.waitSignal(chat.finished, timeout=60000) as stopped:
        window.send()
        qtbot.waitUntil(lambda: len(window._answer) > 20, timeout=30000)
        window.stop_button.click()
    s2 = stopped.args[0] if stopped.args else None
    assert isinstance(s2, ChatStats) and s2.stopped and s2.tokens < 2000
    assert "(stopped)" in window.footer.text()
    assert len(history.load(saved[0].id).messages) == 4  # both turns kept

    # New conversation: empty transcript; the old one stays in the list
    window.new_conversation()
    assert window.transcript.toPlainText() == ""
    assert window.conversations.count() == 1
    window.hide()
