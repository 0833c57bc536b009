"""Chat with the swarm: streamed tokens, Stop, conversations on disk (new, rename,
delete), the model's recommended sampling with Greedy one switch away and custom values
remembered across restarts, and a footer that follows the answer as it streams (tokens,
tokens/s, time to first token, stage count, and whether it was cut short)."""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import QPoint, Qt, Slot
from PySide6.QtGui import QCloseEvent, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.ui.chat_controller import ChatController, ChatProgress, ChatStats, Finish
from app.ui.history import Conversation, History
from app.ui.settings import Settings
from core.sampling_defaults import GREEDY
from core.types import SamplingParams

ERROR_STYLE = "color: #c62828;"
NOTE_STYLE = "color:#8a6d00"


def finish_note(stats: ChatStats, max_tokens: int) -> str:
    """The line under an answer that did not end by itself; '' when it did."""
    if stats.finish == Finish.LENGTH:
        return (
            f"[Cut at the {max_tokens}-token limit: the answer may be unfinished. "
            "Raise Max tokens under Sampling for longer answers.]"
        )
    if stats.finish == Finish.LOOP:
        return "[Ended early: the answer kept repeating itself.]"
    if stats.finish == Finish.STOPPED:
        return "[Stopped.]"
    return ""


class ChatWindow(QWidget):
    def __init__(
        self,
        chat: ChatController,
        history: History,
        parent: QWidget | None = None,
        *,
        settings: Settings | None = None,
        settings_dir: Path | None = None,
    ) -> None:
        super().__init__(parent)
        self.chat = chat
        self.history = history
        self.settings = settings if settings is not None else Settings()
        self.settings_dir = settings_dir
        """None with no settings given: nothing is written (tests, embedded uses)."""
        self._persist = settings is not None
        self._asked_max = 0
        """The token limit of the answer under way (the spin box may change meanwhile)."""
        self.conversation = Conversation()
        self._answer = ""
        self.setWindowTitle("Sangama chat")
        self.resize(900, 600)

        # left: conversations
        self.conversations = QListWidget()
        self.conversations.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.new_button = QPushButton("New conversation")
        self.rename_button = QPushButton("Rename…")
        self.delete_button = QPushButton("Delete…")
        manage = QHBoxLayout()
        manage.addWidget(self.rename_button)
        manage.addWidget(self.delete_button)
        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        lv.addWidget(self.new_button)
        lv.addWidget(self.conversations)
        lv.addLayout(manage)

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

        prefs = self.settings
        self.greedy = QCheckBox("Greedy: always the most likely word (tends to repeat itself)")
        self.greedy.setChecked(prefs.chat_greedy)
        self.sampling_box = QGroupBox("Custom sampling (else the model's recommended)")
        self.sampling_box.setCheckable(True)
        self.sampling_box.setChecked(prefs.chat_custom_sampling)
        self.sampling_box.setFlat(True)
        form = QFormLayout()
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setValue(prefs.chat_temperature)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.05, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(prefs.chat_top_p)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setValue(prefs.chat_top_k)
        self.repetition = QDoubleSpinBox()
        self.repetition.setRange(1.0, 2.0)
        self.repetition.setSingleStep(0.05)
        self.repetition.setValue(prefs.chat_repetition_penalty)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 4096)
        self.max_tokens.setValue(prefs.chat_answer_limit)
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
        inner.setVisible(self.sampling_box.isChecked())
        self.sampling_label = QLabel("Sampling: the model's recommended")
        self.sampling_label.setStyleSheet("color: palette(mid);")
        self.sampling_label.setWordWrap(True)

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
        rv.addWidget(self.greedy)
        rv.addWidget(self.sampling_box)
        rv.addWidget(self.sampling_label)

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
        self.rename_button.clicked.connect(self._ask_rename)
        self.delete_button.clicked.connect(self._ask_delete)
        self.conversations.customContextMenuRequested.connect(self._list_menu)
        self.conversations.itemActivated.connect(self._open_item)
        self.conversations.itemClicked.connect(self._open_item)
        self.conversations.currentItemChanged.connect(lambda *_: self._show_manage())
        for box in (self.greedy, self.sampling_box):
            box.toggled.connect(self._remember)
        for spin in (self.temperature, self.top_p, self.repetition):
            spin.valueChanged.connect(self._remember)
        for ispin in (self.top_k, self.max_tokens):
            ispin.valueChanged.connect(self._remember)
        self.greedy.toggled.connect(self._show_sampling_choice)
        chat.text.connect(self._on_text)
        chat.taken_back.connect(self._on_taken_back)
        chat.progress.connect(self._on_progress)
        chat.finished.connect(self._on_finished)
        chat.failed.connect(self._on_failed)
        chat.busy_changed.connect(self._on_busy)
        from PySide6.QtGui import QKeySequence, QShortcut

        QShortcut(QKeySequence("Ctrl+Return"), self.prompt, self.send)
        self._refresh_list()
        self._show_sampling_choice()

    # --- sampling -----------------------------------------------------------------------

    def sampling(self) -> SamplingParams | None:
        """What the next answer samples with; None: the model's recommendation (greedy
        makes a small model loop: "L'Etoile, la Marseillaise, ..." instead of Paris)."""
        if self.greedy.isChecked():
            return GREEDY
        if not self.sampling_box.isChecked():
            return None
        return SamplingParams(
            temperature=self.temperature.value(),
            top_k=self.top_k.value(),
            top_p=self.top_p.value(),
            repetition_penalty=self.repetition.value(),
        )

    @Slot()
    def _show_sampling_choice(self) -> None:
        self.sampling_box.setEnabled(not self.greedy.isChecked())

    @Slot()
    def _remember(self) -> None:
        """Every change is kept at once: the next start opens with the same choices."""
        s = self.settings
        s.chat_greedy = self.greedy.isChecked()
        s.chat_custom_sampling = self.sampling_box.isChecked()
        s.chat_temperature = self.temperature.value()
        s.chat_top_p = self.top_p.value()
        s.chat_top_k = self.top_k.value()
        s.chat_repetition_penalty = self.repetition.value()
        s.chat_answer_limit = self.max_tokens.value()
        if self._persist:
            try:
                s.save(self.settings_dir)
            except OSError as exc:  # a full disk must not break the chat
                self.error_label.setText(f"Could not save the chat settings: {exc}")
                self.error_label.setVisible(True)

    # --- conversation -------------------------------------------------------------------

    def _refresh_list(self) -> None:
        self.conversations.clear()
        for c in self.history.list():
            item = QListWidgetItem(c.title)
            item.setData(Qt.ItemDataRole.UserRole, c.id)
            self.conversations.addItem(item)
            if c.id == self.conversation.id:
                self.conversations.setCurrentItem(item)
        self._show_manage()

    def _selected_id(self) -> str | None:
        item = self.conversations.currentItem()
        return None if item is None else str(item.data(Qt.ItemDataRole.UserRole))

    def _show_manage(self) -> None:
        chosen = self._selected_id() is not None
        self.rename_button.setEnabled(chosen)
        self.delete_button.setEnabled(chosen)

    def rename_conversation(self, conversation_id: str, name: str) -> None:
        renamed = self.history.rename(conversation_id, name)
        if renamed.id == self.conversation.id:
            self.conversation.name = renamed.name
        self._refresh_list()

    def delete_conversation(self, conversation_id: str) -> None:
        """Remove it from disk; the one on screen starts afresh if it was this one."""
        if conversation_id == self.conversation.id:
            if self.chat.busy:
                self.chat.stop()
            self.conversation = Conversation()
            self._answer = ""
            self._render()
        self.history.delete(conversation_id)
        self._refresh_list()

    @Slot()
    def _ask_rename(self) -> None:
        cid = self._selected_id()
        if cid is None:
            return
        current = self.conversations.currentItem().text()
        name, ok = QInputDialog.getText(self, "Rename conversation", "Name:", text=current)
        if ok:
            self.rename_conversation(cid, name)

    @Slot()
    def _ask_delete(self) -> None:
        cid = self._selected_id()
        if cid is None:
            return
        title = self.conversations.currentItem().text()
        answer = QMessageBox.question(
            self,
            "Delete conversation?",
            f"Delete “{title}” from this PC? This cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_conversation(cid)

    @Slot(QPoint)
    def _list_menu(self, pos: QPoint) -> None:
        item = self.conversations.itemAt(pos)
        if item is None:
            return
        self.conversations.setCurrentItem(item)
        menu = QMenu(self)
        menu.addAction("Rename…").triggered.connect(self._ask_rename)
        menu.addAction("Delete…").triggered.connect(self._ask_delete)
        menu.exec(self.conversations.viewport().mapToGlobal(pos))

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
        if not self.chat.busy:
            self.footer.setText("Ready.")  # the last answer's figures belong to another chat
        self._show_manage()

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
        self._asked_max = self.max_tokens.value()
        self.footer.setText("Waiting for the first token…")
        self.chat.send(self.conversation.messages, self.sampling(), self._asked_max)

    @Slot(object)
    def _on_progress(self, progress: ChatProgress) -> None:
        rate = f" · {progress.tokens_per_s:.1f} tokens/s" if progress.tokens_per_s else ""
        self.footer.setText(
            f"Answering… {progress.tokens} token{'s' if progress.tokens != 1 else ''}{rate} · "
            f"first token after {progress.first_token_ms:.0f} ms"
        )

    @Slot(str)
    def _on_text(self, piece: str) -> None:
        self._answer += piece
        cursor = self.transcript.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(piece, QTextCharFormat())
        self.transcript.setTextCursor(cursor)
        self.transcript.ensureCursorVisible()

    def _on_taken_back(self, kept: str) -> None:
        """The answer shown so far becomes `kept`: the rest came through a stage a spot
        check then found faulty, and is computed again."""
        cursor = self.transcript.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.movePosition(
            QTextCursor.MoveOperation.Left, QTextCursor.MoveMode.KeepAnchor, len(self._answer)
        )
        cursor.insertText(kept, QTextCharFormat())
        self._answer = kept
        self.transcript.setTextCursor(cursor)

    def _keep_answer(self) -> None:
        if self._answer.strip():
            self.conversation.add("assistant", self._answer.strip())
        self._answer = ""
        self.history.save(self.conversation)
        self._refresh_list()

    @Slot(object)
    def _on_finished(self, stats: ChatStats) -> None:
        self._keep_answer()
        note = finish_note(stats, self._asked_max)
        if note:
            self.transcript.append(f'<p><i style="{NOTE_STYLE}">{html.escape(note)}</i></p>')
        ended = {
            Finish.LENGTH: " (cut at the limit)",
            Finish.LOOP: " (ended: repeating itself)",
            Finish.STOPPED: " (stopped)",
        }.get(stats.finish, "")
        self.footer.setText(
            f"{stats.tokens} tokens{ended} · {stats.tokens_per_s:.1f} tokens/s · "
            f"first token after {stats.first_token_ms:.0f} ms · {stats.stages} stage"
            f"{'s' if stats.stages != 1 else ''}"
        )
        if stats.sampling:
            self.sampling_label.setText(f"Sampling: {stats.sampling}")

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
