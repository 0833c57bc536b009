"""The chat window when part of an answer is taken back (a stage that computed it was
found faulty): the transcript drops the taken-back text and the answer goes on after
what is kept; what was said before the answer stays."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication

from app.ui.chat_controller import ChatController
from app.ui.chat_window import ChatWindow
from app.ui.controllers import AsyncThread
from app.ui.history import History

pytestmark = pytest.mark.ui


def test_taken_back_text_leaves_the_transcript(qapp: QApplication, tmp_path: Path) -> None:
    runner = AsyncThread("test-taken-back")
    chat = ChatController(runner, None)
    window = ChatWindow(chat, History(tmp_path / "chats"))
    try:
        before = window.transcript.toPlainText()
        chat.text.emit("The answer is 5, ")
        chat.text.emit("surely.")
        chat.taken_back.emit("The answer is ")
        assert window.transcript.toPlainText() == before + "The answer is "
        chat.text.emit("4.")
        assert window.transcript.toPlainText() == before + "The answer is 4."
        chat.taken_back.emit("")
        assert window.transcript.toPlainText() == before
    finally:
        chat.shutdown()
        runner.stop()
