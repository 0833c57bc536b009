"""Chat with the swarm: streamed tokens, Stop, new conversation, history on disk,
sampling settings, and a footer with tokens/s, time to first token and stage count."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QCloseEvent, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.ui.controllers import ChatController, ChatStats
from app.ui.history import Conversation, History
from core.types import SamplingParams

ERROR_STYLE = "color: #c62828;"


class ChatWindow(QWidget):
    def __init__(
        self, chat: ChatController, history: History, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.chat = chat
        self.history = history
        self.conversation = Conversation()
        self._answer = ""
        self.setWindowTitle("Sangama chat")
        self.resize(900, 600)

        # left: conversations
        self.conversations = QListWidget()
        self.new_button = QPushButton("New conversation")
        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        lv.addWidget(self.new_button)
        lv.addWidget(self.conversations)

        # right: transcript, input, sampling
        self.transcript = QTextBrowser()
        self.transcript.setOpenExternalLinks(False)
        self.transcript.setPlaceholderText("Ask the swarm something.")
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Type a message; Ctrl+Enter sends.")
        self.prompt.setFixedHeight(70)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row = QHBoxLayout()
        row.addWidget(self.prompt, 1)
        row.addLayout(buttons)

        self.sampling_box = QGroupBox("Sampling")
        self.sampling_box.setCheckable(True)
        self.sampling_box.setChecked(False)
        self.sampling_box.setFlat(True)
        form = QFormLayout()
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setValue(0.7)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.05, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(0.95)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setValue(40)
        self.repetition = QDoubleSpinBox()
        self.repetition.setRange(1.0, 2.0)
        self.repetition.setSingleStep(0.05)
        self.repetition.setValue(1.0)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 4096)
        self.max_tokens.setValue(256)
        form.addRow("Temperature (0 = greedy)", self.temperature)
        form.addRow("Top p", self.top_p)
        form.addRow("Top k (0 = off)", self.top_k)
        form.addRow("Repetition penalty", self.repetition)
        form.addRow("Max tokens", self.max_tokens)
        inner = QWidget()
        inner.setLayout(form)
        box_layout = QVBoxLayout(self.sampling_box)
        box_layout.addWidget(inner)
        self.sampling_box.toggled.connect(inner.setVisible)
        inner.setVisible(False)

        self.error_label = QLabel("")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(ERROR_STYLE)
        self.error_label.setVisible(False)
        self.footer = QLabel("Ready.")
        self.footer.setStyleSheet("color: palette(mid);")

        right = QWidget()
        rv = QVBoxLayout(right)
        rv.setContentsMargins(0, 0, 0, 0)
        rv.addWidget(self.transcript, 1)
        rv.addWidget(self.error_label)
        rv.addLayout(row)
        rv.addWidget(self.sampling_box)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([220, 680])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.footer)

        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(chat.stop)
        self.new_button.clicked.connect(self.new_conversation)
        self.conversations.itemActivated.connect(self._open_item)
        self.conversations.itemClicked.connect(self._open_item)
        chat.text.connect(self._on_text)
        chat.finished.connect(self._on_finished)
        chat.failed.connect(self._on_failed)
        chat.busy_changed.connect(self._on_busy)
        from PySide6.QtGui import QKeySequence, QShortcut

        QShortcut(QKeySequence("Ctrl+Return"), self.prompt, self.send)
        self._refresh_list()

    # --- sampling -----------------------------------------------------------------------

    def sampling(self) -> SamplingParams:
        if not self.sampling_box.isChecked():
            # Greedy, no penalty: how the instruction-tuned default answers best (a
            # penalty over the prompt's words, the template's system turn included,
            # steers it off the answer).
            return SamplingParams()
        return SamplingParams(
            temperature=self.temperature.value(),
            top_k=self.top_k.value(),
            top_p=self.top_p.value(),
            repetition_penalty=self.repetition.value(),
        )

    # --- conversation -------------------------------------------------------------------

    def _refresh_list(self) -> None:
        self.conversations.clear()
        for c in self.history.list():
            item = QListWidgetItem(c.title)
            item.setData(Qt.ItemDataRole.UserRole, c.id)
            self.conversations.addItem(item)

    @Slot(QListWidgetItem)
    def _open_item(self, item: QListWidgetItem) -> None:
        if self.chat.busy:
            return
        self.conversation = self.history.load(str(item.data(Qt.ItemDataRole.UserRole)))
        self._render()

    @Slot()
    def new_conversation(self) -> None:
        if self.chat.busy:
            self.chat.stop()
        self.conversation = Conversation()
        self._render()
        self.prompt.setFocus()

    def _render(self) -> None:
        self.transcript.clear()
        for role, text in self.conversation.messages:
            self._append_block(role, text)
        self.error_label.setVisible(False)

    def _append_block(self, role: str, text: str) -> None:
        who = "You" if role == "user" else "Swarm"
        color = "#1f5fbf" if role == "user" else "#2e7d4f"
        body = html.escape(text).replace("\n", "<br>")
        self.transcript.append(f'<p><b style="color:{color}">{who}</b><br>{body}</p>')

    @Slot()
    def send(self) -> None:
        text = self.prompt.toPlainText().strip()
        if not text or self.chat.busy:
            return
        self.prompt.clear()
        self.error_label.setVisible(False)
        self.conversation.add("user", text)
        self._append_block("user", text)
        self.transcript.append('<p><b style="color:#2e7d4f">Swarm</b><br></p>')
        self._answer = ""
        self.footer.setText("Waiting for the first token…")
        self.chat.send(self.conversation.messages, self.sampling(), self.max_tokens.value())

    @Slot(str)
    def _on_text(self, piece: str) -> None:
        self._answer += piece
        cursor = self.transcript.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(piece, QTextCharFormat())
        self.transcript.setTextCursor(cursor)
        self.transcript.ensureCursorVisible()

    def _keep_answer(self) -> None:
        if self._answer.strip():
            self.conversation.add("assistant", self._answer.strip())
        self._answer = ""
        self.history.save(self.conversation)
        self._refresh_list()

    @Slot(object)
    def _on_finished(self, stats: ChatStats) -> None:
        self._keep_answer()
        stopped = " (stopped)" if stats.stopped else ""
        self.footer.setText(
            f"{stats.tokens} tokens{stopped} · {stats.tokens_per_s:.1f} tokens/s · "
            f"first token after {stats.first_token_ms:.0f} ms · {stats.stages} stage"
            f"{'s' if stats.stages != 1 else ''}"
        )

    @Slot(str)
    def _on_failed(self, reason: str) -> None:
        self._keep_answer()
        self.error_label.setText(f"The swarm could not answer: {reason}")
        self.error_label.setVisible(True)
        self.footer.setText("Error.")

    @Slot(bool)
    def _on_busy(self, busy: bool) -> None:
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)

    def closeEvent(self, event: QCloseEvent) -> None:
        # Closing a window never quits the app; it only hides.
        event.ignore()
        self.hide()
