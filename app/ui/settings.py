"""The desktop app's settings: a JSON file under the user config dir (no Qt here).

Secrets never land here: the node key and token stay with `app.identity` (OS keyring).
Start-on-login is an XDG autostart `.desktop` file on Linux and a `Run` registry value
on Windows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import platformdirs

from app.serving.guest.policy import GuestSettings, SettingsError, parse_quiet_hours

log = logging.getLogger(__name__)

APP_NAME = "sangama"
SETTINGS_FILE = "settings.json"
AUTOSTART_FILE = "sangama-app.desktop"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_GIB = 1024**3
HEADROOM_FRACTION = 0.15
HEADROOM_MIN_BYTES = 1 * _GIB


def config_dir() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME))


def default_log_dir() -> Path:
    return Path(platformdirs.user_log_dir(APP_NAME))


def default_cap_bytes(usable_bytes: int) -> int:
    """What to offer by default: leave headroom for the volunteer's own programs."""
    headroom = max(int(usable_bytes * HEADROOM_FRACTION), HEADROOM_MIN_BYTES)
    return max(usable_bytes - headroom, usable_bytes // 2)


@dataclass
class Settings:
    vram_cap_bytes: int = 0
    """0: not chosen yet (the join dialog proposes a default with headroom)."""
    start_on_login: bool = False
    coordinator: str = ""
    """Empty: the coordinator the invite named (kept with the identity). Else its new
    address (the coordinator moved), used for heartbeats, routes, chat and the API."""
    log_level: str = "INFO"
    log_dir: str = ""
    """Empty: the platform's user log dir."""
    identity_dir: str = ""
    """Empty: app.identity's default."""
    paused: bool = False
    """Remembered so a paused node stays paused after a restart."""
    api_port: int = 0
    """The OpenAI-compatible API on 127.0.0.1:api_port for tools on this PC; 0: off."""
    pause_when_gpu_busy: bool = True
    """Step aside while another program (a game, a render) keeps the GPU busy."""
    pause_on_battery: bool = True
    quiet_hours: str = ""
    """Local times not to serve, e.g. "22:00-07:00"; empty: none."""
    max_download_kib_s: int = 0
    """Piece download cap in KiB/s; 0: none."""
    max_upload_kib_s: int = 0
    """Upload cap for the stage's links in KiB/s; 0: none."""
    pieces_cap_bytes: int = 0
    """Disk the model pieces cache may take (app.pieces_cache.make_room); 0: the default
    share of the free space."""
    first_run_done: bool = False
    """The first-run walk-through (app.ui.first_run) was finished."""
    chat_greedy: bool = False
    """The chat window's Greedy switch: the most likely token every time."""
    chat_custom_sampling: bool = False
    """False: the model's recommended sampling (core.sampling_defaults); True: the
    chat_* values below."""
    chat_temperature: float = 0.7
    chat_top_p: float = 0.9
    chat_top_k: int = 0
    chat_repetition_penalty: float = 1.1
    chat_answer_limit: int = 256
    """Max tokens of one answer."""

    def guest(self) -> GuestSettings:
        """The good-guest settings these describe; unusable quiet hours count as none
        (the settings dialog refuses them before they are saved)."""
        try:
            quiet = parse_quiet_hours(self.quiet_hours)
        except SettingsError as exc:
            log.warning("ignoring the quiet hours setting: %s", exc)
            quiet = ()
        return GuestSettings(
            pause_when_gpu_busy=self.pause_when_gpu_busy,
            pause_on_battery=self.pause_on_battery,
            quiet_hours=quiet,
            download_bytes_per_s=max(0, self.max_download_kib_s) * 1024,
            upload_bytes_per_s=max(0, self.max_upload_kib_s) * 1024,
        )

    @property
    def logs_path(self) -> Path:
        return Path(self.log_dir) if self.log_dir else default_log_dir()

    @staticmethod
    def path(directory: Path | None = None) -> Path:
        return (directory or config_dir()) / SETTINGS_FILE

    @classmethod
    def load(cls, directory: Path | None = None) -> Settings:
        path = cls.path(directory)
        try:
            doc: Any = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            log.warning("settings in %s unreadable (%s); using defaults", path, exc)
            return cls()
        if not isinstance(doc, dict):
            return cls()
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for name, value in doc.items():
            f = known.get(name)
            default = getattr(cls(), name, None) if f else None
            if f is not None and isinstance(default, float) and type(value) is int:
                value = float(value)  # 1 in a hand-edited file means 1.0
            if f is not None and isinstance(value, type(default)):
                kwargs[name] = value
        settings = cls(**kwargs)
        if settings.log_level not in LOG_LEVELS:
            settings.log_level = "INFO"
        return settings

    def save(self, directory: Path | None = None) -> Path:
        path = self.path(directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")
        os.replace(tmp, path)
        return path


# --- start on login ---------------------------------------------------------------------


def autostart_command() -> str:
    """How the login session should start the app (a package's launcher names itself)."""
    return os.environ.get("SANGAMA_APP_COMMAND") or f'"{sys.executable}" -m app.ui.desktop'


def xdg_autostart_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "autostart" / AUTOSTART_FILE


def desktop_entry(command: str) -> str:
    return (
        "[Desktop Entry]\n"
        "Type=Application\n"
        "Name=Sangama\n"
        "Comment=Share this PC's GPU with a Sangama swarm\n"
        f"Exec={command}\n"
        "Terminal=false\n"
        "X-GNOME-Autostart-enabled=true\n"
    )


def set_start_on_login(enabled: bool, command: str | None = None) -> str:
    """Create or remove the platform's start-on-login entry; return where it lives."""
    command = command or autostart_command()
    if sys.platform == "win32":
        import winreg

        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
            if enabled:
                winreg.SetValueEx(key, "Sangama", 0, winreg.REG_SZ, command)
            else:
                with contextlib.suppress(FileNotFoundError):
                    winreg.DeleteValue(key, "Sangama")
        return f"HKCU\\{RUN_KEY}\\Sangama"
    path = xdg_autostart_path()
    if enabled:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(desktop_entry(command), encoding="utf-8")
    else:
        path.unlink(missing_ok=True)
    return str(path)


def starts_on_login() -> bool:
    if sys.platform == "win32":
        import winreg

        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
                winreg.QueryValueEx(key, "Sangama")
            return True
        except OSError:
            return False
    return xdg_autostart_path().exists()
