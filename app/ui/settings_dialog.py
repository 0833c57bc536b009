"""Settings: VRAM cap, start on login, coordinator address, log level and logs location."""

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
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.settings import LOG_LEVELS, Settings, set_start_on_login

GIB = 1024**3


class SettingsDialog(QDialog):
    def __init__(
        self,
        settings: Settings,
        settings_dir: Path | None = None,
        usable_bytes: int = 0,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.settings = settings
        self.settings_dir = settings_dir
        self.setWindowTitle("Sangama settings")
        self.setMinimumWidth(520)
        form = QFormLayout()
        self.cap = QDoubleSpinBox()
        self.cap.setDecimals(1)
        self.cap.setSuffix(" GiB")
        self.cap.setRange(0.0, max(1.0, usable_bytes / GIB, settings.vram_cap_bytes / GIB))
        self.cap.setSpecialValueText("everything free")
        self.cap.setValue(settings.vram_cap_bytes / GIB)
        form.addRow("Memory to offer:", self.cap)
        self.autostart = QCheckBox("Start Sangama when I log in")
        self.autostart.setChecked(settings.start_on_login)
        form.addRow("", self.autostart)
        self.coordinator = QLineEdit(settings.coordinator)
        self.coordinator.setPlaceholderText("set by the invite code when you join")
        form.addRow("Coordinator:", self.coordinator)
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
        note = QLabel("Keys and tokens are kept in the system keyring, never in this file.")
        note.setWordWrap(True)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(note)
        layout.addWidget(buttons)

    @Slot()
    def _open_logs(self) -> None:
        path = Path(self.log_dir.text())
        path.mkdir(parents=True, exist_ok=True)
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))

    def apply(self) -> Settings:
        """Write the form into the settings, save them, and set start-on-login."""
        s = self.settings
        s.vram_cap_bytes = int(self.cap.value() * GIB)
        if self.autostart.isChecked() != s.start_on_login:
            set_start_on_login(self.autostart.isChecked())
        s.start_on_login = self.autostart.isChecked()
        s.coordinator = self.coordinator.text().strip()
        s.log_level = self.log_level.currentText()
        s.log_dir = self.log_dir.text().strip()
        s.save(self.settings_dir)
        return s

    def accept(self) -> None:
        self.apply()
        super().accept()
