"""Settings: VRAM cap, disk for model pieces, start on login, when to step aside (GPU busy,
battery, quiet hours) and bandwidth caps, coordinator address, the local OpenAI-compatible
API, log level and logs location."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app import pieces_cache
from app.identity import coordinator_url, secrets_place
from app.serving.guest.policy import SettingsError, parse_quiet_hours
from app.ui.controllers import validate_coordinator
from app.ui.settings import LOG_LEVELS, Settings, set_start_on_login

GIB = 1024**3
MAX_KIB_S = 10_000_000


def secrets_note(place: str, identity_dir: Path | None) -> str:
    """Where the node's key and token really are, in words (app.identity.secrets_place)."""
    if place == "files":
        where = f" in {identity_dir}" if identity_dir is not None else ""
        return (
            "The node's key and token are kept in files only your account can read "
            f"(mode 0600){where}, never in this settings file: this PC had no usable "
            "system keyring when it joined."
        )
    if place == "keyring":
        return "The node's key and token are kept in the system keyring, never in this file."
    return (
        "When you join, the node's key and token go to the system keyring where one is "
        "usable, else to files only your account can read in the identity folder; never "
        "to this settings file."
    )


def quiet_hours_problem(text: str) -> str | None:
    try:
        parse_quiet_hours(text)
    except SettingsError as exc:
        return str(exc)
    return None


class SettingsDialog(QDialog):
    def __init__(
        self,
        settings: Settings,
        settings_dir: Path | None = None,
        usable_bytes: int = 0,
        parent: QWidget | None = None,
        *,
        joined_coordinator: str = "",
        identity_dir: Path | None = None,
    ) -> None:
        super().__init__(parent)
        self.settings = settings
        self.settings_dir = settings_dir
        self.setWindowTitle("Sangama settings")
        self.setMinimumWidth(520)
        self.form = form = QFormLayout()
        self.cap = QDoubleSpinBox()
        self.cap.setDecimals(1)
        self.cap.setSuffix(" GiB")
        self.cap.setRange(0.0, max(1.0, usable_bytes / GIB, settings.vram_cap_bytes / GIB))
        self.cap.setSpecialValueText("everything free")
        self.cap.setValue(settings.vram_cap_bytes / GIB)
        form.addRow("Memory to offer:", self.cap)
        self._add_pieces_cap(form, settings, identity_dir)
        self.autostart = QCheckBox("Start Sangama when I log in")
        self.autostart.setChecked(settings.start_on_login)
        form.addRow("", self.autostart)

        # Good-guest settings: the same ones `sangama worker` takes as flags; the tray's
        # worker reads them from this file (Settings.guest).
        guest = QGroupBox("Be a good guest on this PC")
        gform = QFormLayout(guest)
        self.gpu_pause = QCheckBox("Pause while another program keeps the GPU busy (a game)")
        self.gpu_pause.setChecked(settings.pause_when_gpu_busy)
        self.battery_pause = QCheckBox("Pause while on battery")
        self.battery_pause.setChecked(settings.pause_on_battery)
        gform.addRow(self.gpu_pause)
        gform.addRow(self.battery_pause)
        self.quiet_hours = QLineEdit(settings.quiet_hours)
        self.quiet_hours.setPlaceholderText("none; e.g. 22:00-07:00 or 09:00-12:00,14:00-17:00")
        self.quiet_hint = QLabel()
        self.quiet_hint.setWordWrap(True)
        self.quiet_hint.setStyleSheet("color: #c62828;")
        gform.addRow("Quiet hours:", self.quiet_hours)
        gform.addRow("", self.quiet_hint)
        self.max_download = QSpinBox()
        self.max_download.setRange(0, MAX_KIB_S)
        self.max_download.setSuffix(" KiB/s")
        self.max_download.setSpecialValueText("no cap")
        self.max_download.setValue(settings.max_download_kib_s)
        self.max_upload = QSpinBox()
        self.max_upload.setRange(0, MAX_KIB_S)
        self.max_upload.setSuffix(" KiB/s")
        self.max_upload.setSpecialValueText("no cap")
        self.max_upload.setValue(settings.max_upload_kib_s)
        gform.addRow("Download at most:", self.max_download)
        gform.addRow("Upload at most:", self.max_upload)
        self.guest_form = gform
        self.coordinator = QLineEdit(settings.coordinator)
        self.coordinator.setPlaceholderText(
            f"as the invite named: {joined_coordinator}"
            if joined_coordinator
            else "as the invite names when you join"
        )
        self.coordinator.setToolTip("Only if the coordinator moved: its new https://host:port")
        self.coordinator_hint = QLabel()
        self.coordinator_hint.setWordWrap(True)
        self.coordinator_hint.setStyleSheet("color: #c62828;")
        form.addRow("Coordinator:", self.coordinator)
        form.addRow("", self.coordinator_hint)
        self.api_port = QSpinBox()
        self.api_port.setRange(0, 65535)
        self.api_port.setSpecialValueText("off")
        self.api_port.setValue(settings.api_port)
        self.api_port.setToolTip("An OpenAI-compatible API for tools on this PC; off: none")
        self.api_hint = QLabel()
        api_row = QHBoxLayout()
        api_row.addWidget(self.api_port)
        api_row.addWidget(self.api_hint, 1)
        form.addRow("OpenAI API port:", api_row)
        self.log_level = QComboBox()
        self.log_level.addItems(list(LOG_LEVELS))
        self.log_level.setCurrentText(settings.log_level)
        form.addRow("Log level:", self.log_level)
        self.log_dir = QLineEdit(str(settings.logs_path))
        open_logs = QPushButton("Open")
        open_logs.clicked.connect(self._open_logs)
        row = QHBoxLayout()
        row.addWidget(self.log_dir, 1)
        row.addWidget(open_logs)
        form.addRow("Logs:", row)
        place = secrets_place(identity_dir) if identity_dir is not None else ""
        note = QLabel(secrets_note(place, identity_dir))
        note.setWordWrap(True)
        self.secrets_label = note
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.save_button = buttons.button(QDialogButtonBox.StandardButton.Save)
        self.coordinator.textChanged.connect(self._check_coordinator)
        self.quiet_hours.textChanged.connect(self._check_quiet_hours)
        self.api_port.valueChanged.connect(self._show_api)
        self._check_coordinator(self.coordinator.text())
        self._check_quiet_hours(self.quiet_hours.text())
        self._show_api(self.api_port.value())
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(guest)
        layout.addWidget(note)
        layout.addWidget(buttons)

    def _add_pieces_cap(
        self, form: QFormLayout, settings: Settings, identity_dir: Path | None
    ) -> None:
        """The cap on the pieces cache, with what the cache holds now and the default."""
        root = pieces_cache.pieces_root(identity_dir) if identity_dir is not None else None
        cached = pieces_cache.cached_files(root) if root is not None else []
        used = sum(f.size for f in cached)
        default = pieces_cache.default_cap(root, cached) if root is not None else 0
        disk = pieces_cache.disk_total(root) if root is not None else 0
        self.pieces_cap = QDoubleSpinBox()
        self.pieces_cap.setDecimals(1)
        self.pieces_cap.setSuffix(" GiB")
        self.pieces_cap.setRange(0.0, max(1.0, disk / GIB, settings.pieces_cap_bytes / GIB))
        self.pieces_cap.setSpecialValueText(
            f"half the free space ({pieces_cache.size_text(default)} now)"
            if root is not None
            else "half the free space"
        )
        self.pieces_cap.setValue(settings.pieces_cap_bytes / GIB)
        form.addRow("Disk for model pieces:", self.pieces_cap)
        self.pieces_used = QLabel(
            f"The pieces take {pieces_cache.size_text(used)} now. To stay under this, those "
            "of stages this PC no longer serves go first, least recently used first."
        )
        self.pieces_used.setToolTip(f"The pieces are kept in {root}" if root is not None else "")
        self.pieces_used.setWordWrap(True)
        form.addRow("", self.pieces_used)

    @Slot(str)
    def _check_coordinator(self, text: str) -> None:
        """A malformed address is said at once, and cannot be saved."""
        problem = validate_coordinator(text)
        self.coordinator_hint.setText(problem or "")
        self.form.setRowVisible(self.coordinator_hint, problem is not None)
        self._update_save()

    @Slot(str)
    def _check_quiet_hours(self, text: str) -> None:
        """Quiet hours the worker could not read are said at once, and cannot be saved."""
        problem = quiet_hours_problem(text)
        self.quiet_hint.setText(problem or "")
        self.guest_form.setRowVisible(self.quiet_hint, problem is not None)
        self._update_save()

    def _update_save(self) -> None:
        ok = validate_coordinator(self.coordinator.text()) is None and (
            quiet_hours_problem(self.quiet_hours.text()) is None
        )
        self.save_button.setEnabled(ok)
        self.adjustSize()  # room for the hints (a dialog does not grow by itself)

    @Slot(int)
    def _show_api(self, port: int) -> None:
        self.api_hint.setText(
            "a port lets OpenAI tools on this PC use the swarm"
            if port == 0
            else f"http://127.0.0.1:{port}/v1 (API key: the api-key file beside the identity)"
        )

    @Slot()
    def _open_logs(self) -> None:
        path = Path(self.log_dir.text())
        path.mkdir(parents=True, exist_ok=True)
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))

    def apply(self) -> Settings:
        """Write the form into the settings, save them, and set start-on-login."""
        s = self.settings
        s.vram_cap_bytes = int(self.cap.value() * GIB)
        s.pieces_cap_bytes = int(self.pieces_cap.value() * GIB)
        if self.autostart.isChecked() != s.start_on_login:
            set_start_on_login(self.autostart.isChecked())
        s.start_on_login = self.autostart.isChecked()
        text = self.coordinator.text().strip()
        s.coordinator = coordinator_url(text) if text else ""
        s.api_port = self.api_port.value()
        s.pause_when_gpu_busy = self.gpu_pause.isChecked()
        s.pause_on_battery = self.battery_pause.isChecked()
        s.quiet_hours = self.quiet_hours.text().strip()
        s.max_download_kib_s = self.max_download.value()
        s.max_upload_kib_s = self.max_upload.value()
        s.log_level = self.log_level.currentText()
        s.log_dir = self.log_dir.text().strip()
        s.save(self.settings_dir)
        return s

    def accept(self) -> None:
        self.apply()
        super().accept()
