"""Desktop app tests: Qt renders offscreen here (docs/architecture.md); the Xvfb test starts its own
X server with a tray host."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "ui"


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """platformdirs and XDG autostart point into tmp_path, never the real home."""
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    yield tmp_path


@pytest.fixture
def new_desk(qapp: Any, tmp_path: Path, isolated_dirs: Path) -> Iterator[Callable[..., Any]]:
    """Makes the desktop app on a tray, its settings, identity and chats in tmp_path (more
    DesktopApp arguments by keyword); each one made quits at the end of the test."""
    from app.ui.history import History
    from app.ui.settings import Settings
    from app.ui.tray import DesktopApp

    qapp.setQuitOnLastWindowClosed(False)
    made: list[DesktopApp] = []

    def make(**more: Any) -> DesktopApp:
        d = DesktopApp(
            Settings(),
            settings_dir=tmp_path / "settings",
            identity_dir=tmp_path / "identity",
            history=History(tmp_path / "chats"),
            tray_available=True,
            **more,
        )
        made.append(d)
        return d

    yield make
    for d in made:
        d.quit()
