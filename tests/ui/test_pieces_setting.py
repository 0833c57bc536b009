"""The settings dialog's cap on the pieces cache (offscreen, pytest-qt): it shows what the
cache holds now and the default, saves the volunteer's cap, and hands it to the worker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication

from app.pieces_cache import pieces_dir, pieces_root
from app.ui.history import History
from app.ui.settings import Settings
from app.ui.settings_dialog import GIB
from app.ui.tray import DesktopApp

pytestmark = pytest.mark.ui


@pytest.fixture
def desk(new_desk: Callable[..., DesktopApp], tmp_path: Path) -> DesktopApp:
    model = pieces_dir(tmp_path / "identity", "some-model")
    model.mkdir(parents=True)
    (model / "blk.000.gguf").write_bytes(b"\0" * (3 << 20))
    (model / "blk.001.gguf").write_bytes(b"\0" * (1 << 19))
    return new_desk()


def test_the_dialog_shows_the_cache_and_saves_the_cap(
    desk: DesktopApp, tmp_path: Path, artifacts: Path
) -> None:
    dialog = desk.open_settings()
    assert dialog.pieces_cap.value() == 0.0
    assert dialog.pieces_cap.text().startswith("half the free space (")  # the default, now
    shown = dialog.pieces_used.text()
    assert "The pieces take 3.5 MiB now" in shown
    assert str(pieces_root(tmp_path / "identity")) in dialog.pieces_used.toolTip()
    assert "least recently used first" in shown
    assert dialog.grab().save(str(artifacts / "offscreen_settings_pieces_cap.png"))

    dialog.pieces_cap.setValue(2.5)
    dialog.save_button.click()

    saved = Settings.load(tmp_path / "settings")
    assert saved.pieces_cap_bytes == int(2.5 * GIB)
    assert desk.node.options.pieces_cap_bytes == saved.pieces_cap_bytes
    # Shown again as saved.
    assert desk.open_settings().pieces_cap.value() == 2.5


def test_a_saved_cap_reaches_the_worker_at_start(
    qapp: QApplication, tmp_path: Path, isolated_dirs: Path
) -> None:
    d = DesktopApp(
        Settings(pieces_cap_bytes=40 * GIB),
        settings_dir=tmp_path / "settings",
        identity_dir=tmp_path / "identity",
        history=History(tmp_path / "chats"),
        tray_available=True,
    )
    try:
        assert d.node.options.pieces_cap_bytes == 40 * GIB
        assert d.open_settings().pieces_cap.value() == 40.0
    finally:
        d.quit()
