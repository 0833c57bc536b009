"""Join a swarm: paste a code (its form is checked at once), see this PC's memory, pick a
cap, join. Refusals show the coordinator's reason in plain words."""

from __future__ import annotations

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.ui.controllers import NodeController, validate_code
from app.ui.settings import default_cap_bytes
from core.hardware import detect_hardware
from core.types import HardwareReport

GIB = 1024**3
OK_STYLE = "color: #2e7d4f;"
BAD_STYLE = "color: #c62828;"


def hardware_lines(report: HardwareReport) -> list[str]:
    lines = [
        f"GPU {g.index}: {g.name}, {g.free_bytes / GIB:.1f} GiB free"
        f" of {g.total_bytes / GIB:.1f} GiB"
        for g in report.gpus
    ]
    if not report.gpus:
        lines.append("No NVIDIA GPU found: this PC can still serve small stages from memory.")
    lines.append(
        f"System memory: {report.system_available_bytes / GIB:.1f} GiB available "
        f"of {report.system_total_bytes / GIB:.1f} GiB"
    )
    return lines


class JoinDialog(QDialog):
    def __init__(
        self,
        node: NodeController,
        hardware: HardwareReport | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.node = node
        self.setWindowTitle("Join a Sangama swarm")
        self.setMinimumWidth(560)
        hw = hardware or detect_hardware()
        usable = hw.usable_bytes

        intro = QLabel(
            "Paste the invite code the swarm's operator gave you. This PC will then serve a "
            "few layers of the swarm's model while the app runs."
        )
        intro.setWordWrap(True)
        self.code = QLineEdit()
        self.code.setPlaceholderText("sangama1-…")
        self.code.setClearButtonEnabled(True)
        self.code_hint = QLabel(" ")
        self.code_hint.setWordWrap(True)

        box = QGroupBox("This PC")
        form = QFormLayout(box)
        self.hardware_label = QLabel("\n".join(hardware_lines(hw)))
        self.hardware_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.hardware_label.setWordWrap(True)
        form.addRow(self.hardware_label)
        self.cap = QDoubleSpinBox()
        self.cap.setDecimals(1)
        self.cap.setSuffix(" GiB")
        self.cap.setRange(0.1, max(0.1, usable / GIB))
        self.cap.setSingleStep(0.5)
        self.cap.setValue(default_cap_bytes(usable) / GIB)
        form.addRow("Offer at most:", self.cap)
        cap_note = QLabel("The default leaves headroom for your own programs.")
        cap_note.setStyleSheet("color: palette(mid);")
        form.addRow("", cap_note)

        self.result_label = QLabel(" ")
        self.result_label.setWordWrap(True)
        self.result_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.join_button = QPushButton("Join and start serving")
        self.join_button.setDefault(True)
        self.buttons.addButton(self.join_button, QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.rejected.connect(self.reject)
        self.join_button.clicked.connect(self._join)

        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(QLabel("Invite code:"))
        layout.addWidget(self.code)
        layout.addWidget(self.code_hint)
        layout.addWidget(box)
        layout.addWidget(self.result_label)
        layout.addWidget(self.buttons)

        self.code.textChanged.connect(self._validate)
        node.join_finished.connect(self._joined)
        self._validate("")

    def showEvent(self, event: QShowEvent) -> None:
        # Each opening starts fresh: no stale code, result or disabled button.
        self.code.clear()
        self.code.setEnabled(True)
        self.result_label.setText(" ")
        self._validate("")
        super().showEvent(event)

    @property
    def cap_bytes(self) -> int:
        return int(self.cap.value() * GIB)

    @Slot(str)
    def _validate(self, text: str) -> None:
        problem = validate_code(text)
        if not text.strip():
            self.code_hint.setText("The code starts with 'sangama1-'.")
            self.code_hint.setStyleSheet("")
        elif problem is None:
            self.code_hint.setText("✓ The code looks right.")
            self.code_hint.setStyleSheet(OK_STYLE)
        else:
            self.code_hint.setText(problem)
            self.code_hint.setStyleSheet(BAD_STYLE)
        self.join_button.setEnabled(problem is None)

    @Slot()
    def _join(self) -> None:
        self.join_button.setEnabled(False)
        self.code.setEnabled(False)
        self.result_label.setStyleSheet("")
        self.result_label.setText("Joining… asking the coordinator.")
        self.node.join(self.code.text(), self.cap_bytes)

    @Slot(bool, str)
    def _joined(self, ok: bool, message: str) -> None:
        self.code.setEnabled(True)
        if ok:
            self.result_label.setStyleSheet(OK_STYLE)
            self.result_label.setText(f"Joined as {message}. Starting to serve…")
            self.accept()
            return
        self.result_label.setStyleSheet(BAD_STYLE)
        self.result_label.setText(f"The swarm did not accept this code: {message}")
        self._validate(self.code.text())
