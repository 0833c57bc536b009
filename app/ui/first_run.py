"""The first-run walk-through, a QWizard: what Sangama does with this PC, the memory cap
(with what the GPU has), the invite (joined through the node controller, as the join
dialog does), the download with speed and time left, then a notification when serving.
Every decision is app.ui.first_run_flow's; this module draws and gathers facts."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from app.node_status import NodeStatus, ServeState
from app.ui.controllers import validate_code
from app.ui.first_run_flow import (
    GIB,
    WHAT_SANGAMA_DOES,
    DownloadMeter,
    FlowFacts,
    Page,
    blocker,
    cap_range,
    download_line,
    finished_settings,
    next_page,
    serving_notice,
)
from app.ui.join_dialog import BAD_STYLE, OK_STYLE, hardware_lines
from core.hardware import detect_hardware
from core.types import HardwareReport

if TYPE_CHECKING:
    from app.ui.tray import DesktopApp

MUTED = "color: palette(mid);"


def _label(text: str = " ", style: str = "") -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    if style:
        label.setStyleSheet(style)
    return label


class _Page(QWizardPage):
    """A page whose Next follows first_run_flow.blocker."""

    def __init__(self, wizard: FirstRunWizard, page: Page, title: str, subtitle: str) -> None:
        super().__init__()
        self._wizard = wizard
        self.page = page
        self.setTitle(title)
        self.setSubTitle(subtitle)
        self.why = _label(" ", MUTED)

    def isComplete(self) -> bool:
        return blocker(self.page, self._wizard.facts()) is None

    def refresh(self) -> None:
        self.why.setText(blocker(self.page, self._wizard.facts()) or " ")
        self.completeChanged.emit()

    def nextId(self) -> int:
        if self.page is Page.SERVING:
            return -1
        return int(self.page) + 1


class WelcomePage(_Page):
    def __init__(self, wizard: FirstRunWizard) -> None:
        super().__init__(wizard, Page.WELCOME, "Welcome to Sangama", "What it does with this PC")
        layout = QVBoxLayout(self)
        for paragraph in WHAT_SANGAMA_DOES:
            layout.addWidget(_label(paragraph))
        layout.addStretch(1)


class MemoryPage(_Page):
    def __init__(self, wizard: FirstRunWizard, hardware: HardwareReport) -> None:
        super().__init__(
            wizard, Page.MEMORY, "How much memory to offer", "This PC, and the most it gives"
        )
        r = cap_range(hardware.usable_bytes)
        self.hardware_label = _label("\n".join(hardware_lines(hardware)))
        self.cap = QDoubleSpinBox()
        self.cap.setDecimals(1)
        self.cap.setSuffix(" GiB")
        self.cap.setSingleStep(0.5)
        self.cap.setRange(r.low / GIB, r.high / GIB)
        self.cap.setValue(r.default / GIB)
        form = QFormLayout(self)
        form.addRow(self.hardware_label)
        form.addRow("Offer at most:", self.cap)
        form.addRow(
            "",
            _label(
                "Sangama never uses more than this for the layers it serves. The default "
                "leaves headroom for your own programs and games.",
                MUTED,
            ),
        )
        form.addRow(self.why)
        self.cap.valueChanged.connect(lambda _v: self.refresh())

    @property
    def cap_bytes(self) -> int:
        return int(self.cap.value() * GIB)


class InvitePage(_Page):
    def __init__(self, wizard: FirstRunWizard) -> None:
        super().__init__(wizard, Page.INVITE, "Paste your invite", "From the swarm's operator")
        # A commit page: its button reads "Join", and once joined there is no way back.
        self.setCommitPage(True)
        self.setButtonText(QWizard.WizardButton.CommitButton, "Join")
        self.code = QLineEdit()
        self.code.setPlaceholderText("sangama1-…")
        self.code.setClearButtonEnabled(True)
        self.result_label = _label()
        layout = QVBoxLayout(self)
        layout.addWidget(
            _label(
                "The invite code names the swarm's coordinator and lets this PC join once. "
                "On Join, the coordinator checks it and gives this PC its layers."
            )
        )
        layout.addWidget(self.code)
        layout.addWidget(self.why)
        layout.addWidget(self.result_label)
        layout.addStretch(1)
        self.code.textChanged.connect(self._edited)

    @Slot(str)
    def _edited(self, _text: str) -> None:
        self.result_label.setText(" ")
        self.refresh()
        problem = validate_code(self.code.text())
        ok = problem is None
        self.why.setStyleSheet(OK_STYLE if ok else (BAD_STYLE if self.code.text() else MUTED))
        if ok:
            self.why.setText("✓ The code looks right.")

    def validatePage(self) -> bool:
        """Join (the node controller, as the join dialog does); the wizard moves on by
        itself when the coordinator accepts."""
        w = self._wizard
        if w.joined:
            return True
        if blocker(self.page, w.facts()) is not None:
            return False
        w.start_join(self.code.text())
        return False


class DownloadPage(_Page):
    def __init__(self, wizard: FirstRunWizard) -> None:
        super().__init__(
            wizard, Page.DOWNLOAD, "Getting this PC's layers", "Downloaded once, then checked"
        )
        self.state_label = _label("Waiting for the coordinator to assign layers…")
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.detail = _label(" ", MUTED)
        layout = QVBoxLayout(self)
        layout.addWidget(self.state_label)
        layout.addWidget(self.bar)
        layout.addWidget(self.detail)
        layout.addWidget(self.why)
        layout.addStretch(1)

    def show_status(self, status: NodeStatus, meter: DownloadMeter, now: float) -> None:
        s = status.state
        layers = ""
        if status.layers is not None:
            a, b = status.layers
            layers = f" layers {a}-{b - 1}"
        if s is ServeState.DOWNLOADING:
            meter.observe(now, status.downloaded_bytes, status.download_bytes)
            self.state_label.setText(f"Downloading{layers} of {status.model or 'the model'}…")
            self.bar.setValue(int(meter.view().fraction * 1000))
            self.detail.setText(download_line(meter))
        elif s is ServeState.LOADING:
            self.state_label.setText(f"Loading{layers} into memory…")
            self.bar.setValue(1000)
        elif s is ServeState.SERVING:
            self.state_label.setText(f"Serving{layers}.")
            self.bar.setValue(1000)
        elif s is ServeState.WAITING:
            self.state_label.setText("Waiting for the coordinator to assign layers…")
        self.refresh()


class ServingPage(_Page):
    def __init__(self, wizard: FirstRunWizard) -> None:
        super().__init__(wizard, Page.SERVING, "This PC is serving", "Thank you")
        self.summary = _label()
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addWidget(
            _label(
                "Closing this window keeps Sangama serving in the background. The tray "
                "icon shows what it does; open the chat from its menu, pause it there, or "
                "Quit to stop serving.",
            )
        )
        layout.addStretch(1)


class FirstRunWizard(QWizard):
    """Shown by the app's first start (app.ui.tray.run_app); closing it never stops serving."""

    def __init__(
        self,
        app: DesktopApp,
        hardware: HardwareReport | None = None,
        clock: Callable[[], float] = time.monotonic,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.app = app
        self.clock = clock
        self.meter = DownloadMeter()
        self.joined = False
        self.joining = False
        self.notice: tuple[str, str] | None = None
        self.setWindowTitle("Sangama: first start")
        self.setWizardStyle(QWizard.WizardStyle.ClassicStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnLastPage, True)
        self.setOption(QWizard.WizardOption.NoCancelButtonOnLastPage, True)
        self.setMinimumSize(620, 440)
        self.hardware = hardware or detect_hardware()
        self.welcome = WelcomePage(self)
        self.memory = MemoryPage(self, self.hardware)
        self.invite = InvitePage(self)
        self.download = DownloadPage(self)
        self.serving = ServingPage(self)
        for page in (self.welcome, self.memory, self.invite, self.download, self.serving):
            self.setPage(int(page.page), page)
        self.setStartId(int(Page.WELCOME))
        app.node.status_changed.connect(self._status)
        app.node.join_finished.connect(self._join_finished)
        self.accepted.connect(self._finished)

    def facts(self) -> FlowFacts:
        return FlowFacts(
            usable_bytes=self.hardware.usable_bytes,
            cap_bytes=self.memory.cap_bytes,
            code_problem=validate_code(self.invite.code.text()),
            joined=self.joined,
            joining=self.joining,
            status=self.app.node.status,
        )

    @property
    def page_now(self) -> Page:
        return Page(self.currentId())

    def start_join(self, code: str) -> None:
        self.joining = True
        self.invite.code.setEnabled(False)
        self.invite.refresh()
        self.app.node.join(code, self.memory.cap_bytes)

    @Slot(bool, str)
    def _join_finished(self, ok: bool, message: str) -> None:
        if not self.joining:
            return  # the join dialog's join, not ours
        self.joining = False
        self.invite.code.setEnabled(True)
        if not ok:
            self.invite.result_label.setStyleSheet(BAD_STYLE)
            self.invite.result_label.setText(f"The swarm did not accept this code: {message}")
            self.invite.refresh()
            return
        self.joined = True
        self.invite.result_label.setStyleSheet(OK_STYLE)
        self.invite.result_label.setText(f"Joined as {message}.")
        if next_page(Page.INVITE, self.facts()) is Page.DOWNLOAD:
            self.next()

    @Slot(object)
    def _status(self, status: NodeStatus) -> None:
        if not self.joined:
            return
        self.download.show_status(status, self.meter, self.clock())
        if status.state is ServeState.SERVING and self.notice is None:
            self.notice = serving_notice(status)
            self.serving.summary.setText(self.notice[1])
            self.app.notify(*self.notice)
            if self.page_now is Page.DOWNLOAD:
                self.next()

    @Slot()
    def _finished(self) -> None:
        done = finished_settings(self.app.settings, self.memory.cap_bytes if self.joined else None)
        for f in fields(done):  # the app shares this Settings object with its dialogs
            setattr(self.app.settings, f.name, getattr(done, f.name))
        self.app.settings.save(self.app.settings_dir)
