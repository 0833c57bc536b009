"""Join a swarm: paste a code (its form is checked at once), see this PC's memory, pick a
cap (the one already set, if any), join. A PC that already serves a swarm checks the code
with its coordinator first and asks before leaving; a refused code leaves the stage
serving. Refusals show the coordinator's reason in plain words."""

from __future__ import annotations

import logging
from collections.abc import Sequence

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

from app.node_status import ServeState
from app.ui.controllers import NodeController, validate_code
from app.ui.settings import default_cap_bytes
from core.hardware import detect_hardware
from core.types import ComputeDevice, HardwareReport

log = logging.getLogger(__name__)

GIB = 1024**3
OK_STYLE = "color: #2e7d4f;"
BAD_STYLE = "color: #c62828;"
JOIN_TEXT = "Join and start serving"
LEAVE_TEXT = "Leave the current swarm and join"


def vulkan_gpus() -> tuple[ComputeDevice, ...]:
    """GPUs the engine's Vulkan backend sees (AMD, Intel and NVIDIA alike); () when the
    engine cannot say (no Vulkan loader, no engine)."""
    try:
        from core.backends import backend_report

        return backend_report().gpus
    except Exception as exc:  # the dialog still opens; it shows system memory then
        log.info("no GPU list from the engine: %s", exc)
        return ()


def usable_bytes(report: HardwareReport, gpus: Sequence[ComputeDevice] = ()) -> int:
    """What this PC could offer: NVML's free VRAM, else the Vulkan GPUs' free memory
    (dedicated GPUs), else available system memory."""
    if report.gpus:
        return report.usable_bytes
    dedicated = sum(d.free_bytes for d in gpus if d.kind == "gpu")
    return dedicated if dedicated > 0 else report.usable_bytes


def hardware_lines(report: HardwareReport, gpus: Sequence[ComputeDevice] = ()) -> list[str]:
    """This PC's memory in words: NVML's NVIDIA GPUs, else the GPUs Vulkan sees (any
    vendor), else a line saying the stage runs from system memory."""
    lines = [
        f"GPU {g.index}: {g.name}, {g.free_bytes / GIB:.1f} GiB free"
        f" of {g.total_bytes / GIB:.1f} GiB"
        for g in report.gpus
    ]
    if not report.gpus:
        for d in gpus:
            kind = "integrated GPU" if d.kind == "igpu" else "GPU"
            memory = (
                f", {d.free_bytes / GIB:.1f} GiB free of {d.total_bytes / GIB:.1f} GiB"
                if d.total_bytes
                else ""
            )
            lines.append(f"{kind} {d.name} (Vulkan): {d.description}{memory}")
    if not report.gpus and not gpus:
        lines.append(
            "No GPU that Vulkan can use was found: this PC can still serve small stages "
            "from system memory."
        )
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
        gpus: Sequence[ComputeDevice] | None = None,
    ) -> None:
        super().__init__(parent)
        self.node = node
        self.setWindowTitle("Join a Sangama swarm")
        self.setMinimumWidth(560)
        hw = hardware or detect_hardware()
        found_gpus = vulkan_gpus() if gpus is None else tuple(gpus)
        usable = usable_bytes(hw, found_gpus)
        self._leave_confirmed_for = ""
        """The code the volunteer agreed to leave the current swarm for."""

        intro = QLabel(
            "Paste the invite code the swarm's operator gave you. This PC will then serve a "
            "few layers of the swarm's model while the app runs."
        )
        intro.setWordWrap(True)
        self.current_label = QLabel()
        """What this PC does now, so leaving is a choice made knowingly."""
        self.current_label.setWordWrap(True)
        self.code = QLineEdit()
        self.code.setPlaceholderText("sangama1-…")
        self.code.setClearButtonEnabled(True)
        self.code_hint = QLabel(" ")
        self.code_hint.setWordWrap(True)

        box = QGroupBox("This PC")
        form = QFormLayout(box)
        self.hardware_label = QLabel("\n".join(hardware_lines(hw, found_gpus)))
        self.hardware_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.hardware_label.setWordWrap(True)
        form.addRow(self.hardware_label)
        self.cap = QDoubleSpinBox()
        self.cap.setDecimals(1)
        self.cap.setSuffix(" GiB")
        chosen = node.options.vram_cap_bytes
        self.cap.setRange(0.1, max(0.1, usable / GIB, chosen / GIB))
        self.cap.setSingleStep(0.5)
        self.cap.setValue((chosen if chosen > 0 else default_cap_bytes(usable)) / GIB)
        form.addRow("Offer at most:", self.cap)
        cap_note = QLabel(
            "The cap you set in Settings."
            if chosen > 0
            else "The default leaves headroom for your own programs."
        )
        cap_note.setStyleSheet("color: palette(mid);")
        form.addRow("", cap_note)

        self.result_label = QLabel(" ")
        self.result_label.setWordWrap(True)
        self.result_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.join_button = QPushButton(JOIN_TEXT)
        self.join_button.setDefault(True)
        self.buttons.addButton(self.join_button, QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.rejected.connect(self.reject)
        self.join_button.clicked.connect(self._join)

        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.current_label)
        layout.addWidget(QLabel("Invite code:"))
        layout.addWidget(self.code)
        layout.addWidget(self.code_hint)
        layout.addWidget(box)
        layout.addWidget(self.result_label)
        layout.addWidget(self.buttons)

        self.code.textChanged.connect(self._validate)
        node.join_finished.connect(self._joined)
        node.code_checked.connect(self._checked)
        node.status_changed.connect(lambda _s: self._show_current())
        self._show_current()
        self._validate("")

    def showEvent(self, event: QShowEvent) -> None:
        # Each opening starts fresh: no stale code, result or disabled button.
        self.code.clear()
        self.code.setEnabled(True)
        self.result_label.setText(" ")
        self._leave_confirmed_for = ""
        self._validate("")
        chosen = self.node.options.vram_cap_bytes
        if chosen > 0:  # the cap set in Settings since the last opening
            self.cap.setMaximum(max(self.cap.maximum(), chosen / GIB))
            self.cap.setValue(chosen / GIB)
        super().showEvent(event)

    @property
    def cap_bytes(self) -> int:
        return int(self.cap.value() * GIB)

    @Slot(str)
    def _validate(self, text: str) -> None:
        if text.strip() != self._leave_confirmed_for:
            self._leave_confirmed_for = ""
            self.join_button.setText(JOIN_TEXT)
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

    def _show_current(self) -> None:
        status = self.node.status
        if not self.node.joined or status.state is ServeState.NOT_JOINED:
            self.current_label.setVisible(False)
            return
        self.current_label.setText(
            f"This PC is in a swarm now: {status.summary.removeprefix('Sangama: ')}. "
            "A new code is checked before anything stops."
        )
        self.current_label.setVisible(True)

    @property
    def leaves_a_swarm(self) -> bool:
        """Joining would take this PC out of the swarm it belongs to now."""
        return self.node.joined

    @Slot()
    def _join(self) -> None:
        self.join_button.setEnabled(False)
        self.code.setEnabled(False)
        self.result_label.setStyleSheet("")
        code = self.code.text().strip()
        if self.leaves_a_swarm and code != self._leave_confirmed_for:
            # Check first, ask second, stop last: the stage serves on meanwhile.
            self.result_label.setText("Checking the code with its coordinator…")
            self.node.check_code(code)
            return
        self.result_label.setText("Joining… asking the coordinator.")
        self.node.join(code, self.cap_bytes)

    @Slot(bool, str, str)
    def _checked(self, valid: bool, role: str, reason: str) -> None:
        if not self.isVisible() or self.code.isEnabled():
            return  # an answer for a dialog that moved on
        self.code.setEnabled(True)
        if not valid:
            self.result_label.setStyleSheet(BAD_STYLE)
            self.result_label.setText(
                f"The swarm did not accept this code: {reason.rstrip('.')}. "
                "This PC keeps serving its current swarm."
            )
            self._validate(self.code.text())
            return
        status = self.node.status
        now = (
            status.summary.removeprefix("Sangama: ")
            if status.state is not ServeState.NOT_JOINED
            else "joined"
        )
        self._leave_confirmed_for = self.code.text().strip()
        self.result_label.setStyleSheet("")
        self.result_label.setText(
            f"This code is valid (a {role or 'worker'} invite). Joining leaves the swarm "
            f"this PC is in now ({now}): running conversations finish first, then its "
            "stage stops. Press the button again to leave and join, or Cancel to stay."
        )
        self.join_button.setText(LEAVE_TEXT)
        self.join_button.setEnabled(True)

    @Slot(bool, str)
    def _joined(self, ok: bool, message: str) -> None:
        self.code.setEnabled(True)
        if ok:
            self.result_label.setStyleSheet(OK_STYLE)
            self.result_label.setText(f"Joined as {message}. Starting to serve…")
            self.accept()
            return
        self.result_label.setStyleSheet(BAD_STYLE)
        kept = " This PC keeps serving its current swarm." if self.node.joined else ""
        refused = message.rstrip(".")
        self.result_label.setText(f"The swarm did not accept this code: {refused}.{kept}")
        self._leave_confirmed_for = ""
        self._validate(self.code.text())
