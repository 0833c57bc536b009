"""The tray app: icon and tooltip show the node's state, the menu is rebuilt from that
state each time it opens, and closing windows never quits (only Quit does)."""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QMenu,
    QMessageBox,
    QPushButton,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from app.client.connect import ChatConnector, identity_connector
from app.identity import default_identity_dir
from app.node_status import NodeStatus, ServeState
from app.serving.coordinated import CoordinatedOptions
from app.ui.chat_controller import ChatController
from app.ui.chat_window import ChatWindow
from app.ui.controllers import ApiController, AsyncThread, NodeController
from app.ui.first_run import FirstRunWizard
from app.ui.first_run_flow import needs_first_run, quit_question
from app.ui.history import History
from app.ui.icons import state_icon
from app.ui.join_dialog import JoinDialog
from app.ui.settings import Settings, config_dir
from app.ui.settings_dialog import SettingsDialog
from app.ui.single_instance import claim
from app.ui.status_window import StatusWindow
from app.ui.upgrade_watch import UpgradeWatch
from app.upgrades import install_folder
from core.hardware import detect_hardware
from net.wire.versions import this_release

log = logging.getLogger(__name__)

NO_TRAY_TEXT = (
    "No system tray was found on this desktop, so Sangama shows this window instead. "
    "Closing it does not stop Sangama; use Quit."
)


class NoTrayWindow(QWidget):
    """Stands in for the tray icon where the desktop has no tray."""

    def __init__(self, app: DesktopApp) -> None:
        super().__init__()
        self.setWindowTitle("Sangama")
        self.state_label = QLabel()
        note = QLabel(NO_TRAY_TEXT)
        note.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(note)
        layout.addWidget(self.state_label)
        self.buttons: dict[str, QPushButton] = {}
        for name in ("Open chat", "Status", "Pause", "Join a swarm...", "Settings...", "Quit"):
            b = QPushButton(name)
            self.buttons[name] = b
            layout.addWidget(b)
        self.buttons["Open chat"].clicked.connect(app.open_chat)
        self.buttons["Status"].clicked.connect(app.open_status)
        self.buttons["Pause"].clicked.connect(app.toggle_pause)
        self.buttons["Join a swarm..."].clicked.connect(app.open_join)
        self.buttons["Settings..."].clicked.connect(app.open_settings)
        self.buttons["Quit"].clicked.connect(app.request_quit)

    def show_status(self, status: NodeStatus, pause_text: str) -> None:
        self.state_label.setText(status.summary)
        self.buttons["Pause"].setText(pause_text)
        self.buttons["Pause"].setEnabled(status.state is not ServeState.PAUSING)
        self.setWindowIcon(state_icon(status))

    def closeEvent(self, event: QCloseEvent) -> None:
        event.ignore()
        self.hide()


class DesktopApp(QObject):
    """Owns the background loop, the controllers, the windows and the tray icon."""

    def __init__(
        self,
        settings: Settings,
        settings_dir: Path | None = None,
        identity_dir: Path | None = None,
        history: History | None = None,
        chat_connector: ChatConnector | None = None,
        tray_available: bool | None = None,
        autostart_serving: bool = True,
        upgrade_folder: Path | None = None,
    ) -> None:
        """`upgrade_folder`: where an upgrade would put the new release's metadata
        (run_app passes the install's; None: no watching)."""
        super().__init__()
        self.settings = settings
        self.settings_dir = settings_dir
        identity_dir = identity_dir or (
            Path(settings.identity_dir) if settings.identity_dir else default_identity_dir()
        )
        self.runner = AsyncThread()
        self.node = NodeController(
            self.runner,
            CoordinatedOptions(
                identity_dir=identity_dir,
                vram_cap_bytes=settings.vram_cap_bytes,
                coordinator=settings.coordinator or None,
                pieces_cap_bytes=settings.pieces_cap_bytes,
            ),
            guest=settings.guest(),
        )
        self._fixed_connector = chat_connector
        self.chat = ChatController(self.runner, chat_connector or self._joined_connector())
        self.api = ApiController(self.runner)
        self.history = history or History()
        self.chat_window: ChatWindow | None = None
        self.status_window: StatusWindow | None = None
        self.join_dialog: JoinDialog | None = None
        self.settings_dialog: SettingsDialog | None = None
        self.error_box: QMessageBox | None = None
        self.quit_box: QMessageBox | None = None
        self.first_run: FirstRunWizard | None = None
        self.notices: list[tuple[str, str]] = []
        self.told_update = ""
        """The update notice last shown as a notification: each one is told once."""
        self.quitting = False

        has_tray = (
            QSystemTrayIcon.isSystemTrayAvailable() if tray_available is None else tray_available
        )
        self.menu = QMenu()
        self.menu.aboutToShow.connect(self.rebuild_menu)
        self.tray: QSystemTrayIcon | None = None
        self.fallback: NoTrayWindow | None = None
        if has_tray:
            self.tray = QSystemTrayIcon(state_icon(self.node.status))
            self.tray.setContextMenu(self.menu)
            self.tray.activated.connect(self._activated)
            self.tray.show()
        else:
            self.fallback = NoTrayWindow(self)
            self.fallback.show()
        self.rebuild_menu()
        self.node.status_changed.connect(self._status_changed)
        self.node.join_finished.connect(self._joined)
        self._status_changed(self.node.status)
        if autostart_serving and self.node.joined and not settings.paused:
            self.node.resume()
        self._serve_api()
        self.upgrades = UpgradeWatch(self.node, upgrade_folder, self.notify, self.quit)

    def _joined_connector(self) -> ChatConnector | None:
        if not self.node.joined:
            return None
        return identity_connector(self.node.options.identity_dir, self.settings.coordinator)

    def _serve_api(self) -> None:
        """Start, move or stop the local API to match the settings and the identity."""
        identity = self.node.options.identity_dir if self.node.joined else None
        self.api.serve(self.settings.api_port, identity, self.settings.coordinator)

    # --- state shown ----------------------------------------------------------------------

    @property
    def pause_text(self) -> str:
        if self.node.status.state is ServeState.PAUSING:
            return "Pausing: finishing conversations…"
        return "Resume contributing" if self._paused_like() else "Pause contributing"

    def _paused_like(self) -> bool:
        status = self.node.status
        if status.paused_reason and self.node.serving:
            return False  # paused by itself and resuming by itself: Pause stops it for good
        return status.state in (ServeState.PAUSED, ServeState.ERROR)

    @property
    def why_paused(self) -> str:
        """The menu's line under the state while the node steps aside by itself."""
        status = self.node.status
        if status.state in (ServeState.PAUSED, ServeState.PAUSING) and status.paused_reason:
            return f"Paused by itself ({status.paused_reason}); resumes by itself"
        return ""

    @Slot(object)
    def _status_changed(self, status: NodeStatus) -> None:
        if status.update and status.update != self.told_update:
            self.told_update = status.update
            self.notify("Sangama update", status.update)
        if self.tray is not None:
            self.tray.setIcon(state_icon(status))
            self.tray.setToolTip(status.summary)
        if self.fallback is not None:
            self.fallback.show_status(status, self.pause_text)

    @Slot()
    def rebuild_menu(self) -> None:
        """Build the menu from the current state (called each time it opens)."""
        m = self.menu
        m.clear()
        status = self.node.status
        head = QAction(status.summary.removeprefix("Sangama: ").capitalize(), m)
        head.setIcon(state_icon(status))
        head.setEnabled(False)
        m.addAction(head)
        if status.state is ServeState.ERROR:
            why = m.addAction("Why? Show the error…")
            why.triggered.connect(self.show_error)
        if self.why_paused:
            m.addAction(self.why_paused).setEnabled(False)
        if status.update:
            m.addAction(status.update).setEnabled(False)
        m.addSeparator()
        m.addAction("Open chat").triggered.connect(self.open_chat)
        m.addAction("Status").triggered.connect(self.open_status)
        pause = m.addAction(self.pause_text)
        pause.setEnabled(self.node.joined and status.state is not ServeState.PAUSING)
        pause.triggered.connect(self.toggle_pause)
        m.addSeparator()
        m.addAction("Join a swarm...").triggered.connect(self.open_join)
        m.addAction("Settings...").triggered.connect(self.open_settings)
        m.addSeparator()
        m.addAction("Quit").triggered.connect(self.request_quit)

    @Slot(QSystemTrayIcon.ActivationReason)
    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason is QSystemTrayIcon.ActivationReason.Trigger:
            if self.node.status.state is ServeState.ERROR:
                self.show_error()
            else:
                self.open_status()

    # --- commands ------------------------------------------------------------------------

    @Slot()
    def show_error(self) -> QMessageBox:
        """The reason, in a box that does not block the tray (one click from the icon)."""
        if self.error_box is None:
            self.error_box = QMessageBox(QMessageBox.Icon.Warning, "Sangama: error", "")
            self.error_box.setStandardButtons(QMessageBox.StandardButton.Ok)
            self.error_box.setWindowModality(Qt.WindowModality.NonModal)  # chat stays usable
        self.error_box.setText("Sangama stopped contributing because of this error:")
        self.error_box.setInformativeText(self.node.status.error or "Unknown error")
        _raise(self.error_box)
        return self.error_box

    @Slot()
    def open_chat(self) -> ChatWindow:
        if self.chat_window is None:
            self.chat_window = ChatWindow(
                self.chat, self.history, settings=self.settings, settings_dir=self.settings_dir
            )
        _raise(self.chat_window)
        return self.chat_window

    @Slot()
    def open_status(self) -> StatusWindow:
        if self.status_window is None:
            self.status_window = StatusWindow(self.node, self.api)
        _raise(self.status_window)
        return self.status_window

    @Slot()
    def open_join(self) -> JoinDialog:
        if self.join_dialog is None:
            self.join_dialog = JoinDialog(self.node)
        _raise(self.join_dialog)
        return self.join_dialog

    @Slot()
    def open_settings(self) -> SettingsDialog:
        if self.settings_dialog is not None:
            self.settings_dialog.close()
        before = replace(self.settings)
        dialog = SettingsDialog(
            self.settings,
            self.settings_dir,
            detect_hardware().usable_bytes,
            joined_coordinator=str(self.node.identity_doc().get("coordinator", "")),
            identity_dir=self.node.options.identity_dir,
        )
        dialog.accepted.connect(lambda: self._settings_saved(before))
        self.settings_dialog = dialog
        _raise(dialog)
        return dialog

    def _settings_saved(self, before: Settings) -> None:
        s = self.settings
        _configure_logging(s)
        # The pieces cap applies when serving starts again (after a pause, a restart): the
        # stage served now already fits, so it is not worth a restart by itself.
        self.node.options = replace(
            self.node.options,
            vram_cap_bytes=s.vram_cap_bytes,
            coordinator=s.coordinator or None,
            pieces_cap_bytes=s.pieces_cap_bytes,
        )
        guest = s.guest()
        if guest != self.node.guest:  # takes effect when serving starts again
            self.node.guest = guest
            if s.coordinator == before.coordinator:
                self.node.restart()
        if s.coordinator != before.coordinator:
            # Heartbeats, routes, chat and the API all go to the new address from now on.
            self.node.restart()
            if self._fixed_connector is None:
                self.chat.set_connector(self._joined_connector())
        if s.coordinator != before.coordinator or s.api_port != before.api_port:
            self._serve_api()

    @Slot()
    def toggle_pause(self) -> None:
        if self.node.status.state is ServeState.PAUSING:
            return  # already on its way; the menu item is disabled meanwhile
        if self._paused_like():
            self.settings.paused = False
            self.node.resume()
        else:
            self.settings.paused = True
            self.node.pause()
        self.settings.save(self.settings_dir)

    @Slot(bool, str)
    def _joined(self, ok: bool, _message: str) -> None:
        if not ok:
            return
        self.settings.vram_cap_bytes = self.node.options.vram_cap_bytes
        self.settings.paused = False
        self.settings.coordinator = ""  # the invite named the coordinator of this swarm
        self.settings.save(self.settings_dir)
        if self._fixed_connector is None:
            self.chat.set_connector(self._joined_connector())
        self._serve_api()

    @Slot()
    def bring_to_front(self) -> None:
        """Another start of the app: show this one instead (the walk-through while it
        is not finished, else the status window, as a click on the icon does)."""
        if self.first_run is not None and self.first_run.isVisible():
            _raise(self.first_run)
        else:
            self.open_status()

    def open_first_run(self) -> FirstRunWizard:
        """The first-run walk-through (app.ui.first_run); run_app opens it on a first start."""
        if self.first_run is None:
            self.first_run = FirstRunWizard(self)
        _raise(self.first_run)
        return self.first_run

    def notify(self, title: str, text: str) -> None:
        """A desktop notification from the tray icon (kept in `notices` for the record)."""
        self.notices.append((title, text))
        if self.tray is not None:
            self.tray.showMessage(title, text, QSystemTrayIcon.MessageIcon.Information, 10000)

    @Slot()
    def request_quit(self) -> QMessageBox | None:
        """Quit from the menu: asks first while conversations run through this PC."""
        question = quit_question(self.node.status)
        if question is None:
            self.quit()
            return None
        if self.quit_box is None:
            self.quit_box = QMessageBox(QMessageBox.Icon.Question, "Quit Sangama?", "")
            self.quit_box.setStandardButtons(
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No
            )
            self.quit_box.setDefaultButton(QMessageBox.StandardButton.No)
            self.quit_box.setWindowModality(Qt.WindowModality.NonModal)
            self.quit_box.accepted.connect(self.quit)  # Yes is the accept role
        self.quit_box.setText(question)
        _raise(self.quit_box)
        return self.quit_box

    @Slot()
    def quit(self) -> None:
        """Stop serving (frees the stage), close links, end the loop thread, leave Qt."""
        if self.quitting:
            return
        self.quitting = True
        self.chat.shutdown()
        self.api.shutdown()
        self.node.shutdown()
        self.runner.stop()
        if self.tray is not None:
            self.tray.hide()
        windows = (self.chat_window, self.status_window, self.join_dialog, self.settings_dialog)
        for w in (*windows, self.error_box, self.quit_box, self.first_run, self.fallback):
            if w is not None:
                w.hide()
        app = QApplication.instance()
        if app is not None:
            app.quit()


def _raise(widget: QWidget) -> None:
    """Bring a window to the front, restoring it if it was minimized (show() alone
    leaves a minimized window in the taskbar)."""
    if widget.isMinimized():
        widget.setWindowState(widget.windowState() & ~Qt.WindowState.WindowMinimized)
        widget.showNormal()
    widget.show()
    widget.raise_()
    widget.activateWindow()


def _configure_logging(settings: Settings) -> None:
    root = logging.getLogger()
    root.setLevel(settings.log_level)
    logs = settings.logs_path
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    target = str(logs / "sangama-app.log")
    if not any(getattr(h, "baseFilename", None) == target for h in root.handlers):
        handler = logging.handlers.RotatingFileHandler(target, maxBytes=2_000_000, backupCount=3)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)


def run_app(argv: Sequence[str] | None = None) -> int:
    """Start the tray app; returns the exit status when Quit is chosen."""
    app = QApplication(list(argv if argv is not None else sys.argv))
    app.setApplicationName("Sangama")
    app.setQuitOnLastWindowClosed(False)
    settings = Settings.load()
    _configure_logging(settings)
    instance = claim(config_dir())
    if instance is None:
        log.info("sangama-app already runs for this user: brought it to the front")
        return 0
    desktop = DesktopApp(settings, upgrade_folder=install_folder())
    instance.show_requested.connect(desktop.bring_to_front)
    app.aboutToQuit.connect(desktop.quit)
    app.aboutToQuit.connect(instance.release)
    if needs_first_run(settings, desktop.node.joined):
        desktop.open_first_run()
    log.info("sangama-app release %s", this_release())
    log.info("sangama-app started on %s", QGuiApplication.platformName())
    status = app.exec()
    command = desktop.upgrades.restart_into
    if command is not None:  # a new release was installed: it takes this one's place
        instance.release()
        log.info("starting the new release: %s", command)
        logging.shutdown()
        os.execv(command[0], command)
    return status
