"""The tray when the node steps aside by itself: the reason in the tooltip and the menu,
and the good-guest settings carried from the settings file to the serve loop."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication

from app.node_status import NodeStatus, ServeState
from app.serving.guest.policy import ON_BATTERY, QUIET_HOURS, GuestSettings, QuietHours
from app.ui.history import History
from app.ui.settings import Settings
from app.ui.tray import DesktopApp

pytestmark = pytest.mark.ui


@pytest.fixture
def desk(qapp: QApplication, tmp_path: Path, isolated_dirs: Path) -> Iterator[DesktopApp]:
    qapp.setQuitOnLastWindowClosed(False)
    settings = Settings(quiet_hours="23:00-06:30", max_upload_kib_s=512)
    d = DesktopApp(
        settings,
        settings_dir=tmp_path / "settings",
        identity_dir=tmp_path / "identity",
        history=History(tmp_path / "chats"),
        tray_available=True,
    )
    yield d
    d.quit()


def texts(d: DesktopApp) -> list[tuple[str, bool]]:
    d.rebuild_menu()
    return [(a.text(), a.isEnabled()) for a in d.menu.actions() if not a.isSeparator()]


def test_the_tray_says_why_it_paused_and_pause_then_stops_it_for_good(
    desk: DesktopApp, artifacts: Path
) -> None:
    assert desk.node.guest.quiet_hours == (QuietHours(23 * 60, 6 * 60 + 30),)
    assert desk.node.guest.upload_bytes_per_s == 512 * 1024
    running: concurrent.futures.Future[bool] = concurrent.futures.Future()
    desk.node._task = running  # the guest loop runs (and will resume by itself)
    desk.node._apply(NodeStatus(state=ServeState.PAUSED, paused_reason=ON_BATTERY))
    assert desk.tray is not None
    assert desk.tray.toolTip() == f"Sangama: paused ({ON_BATTERY})"
    menu = texts(desk)
    assert menu[0] == (f"Paused ({ON_BATTERY})", False)
    assert menu[1] == (f"Paused by itself ({ON_BATTERY}); resumes by itself", False)
    assert ("Pause contributing", False) in menu  # not joined here; joined it is enabled
    desk.menu.popup(desk.menu.pos())
    assert desk.menu.grab().save(str(artifacts / "offscreen_tray_paused_on_battery.png"))
    desk.menu.hide()
    desk.node._apply(NodeStatus(state=ServeState.PAUSING, paused_reason=QUIET_HOURS))
    assert desk.tray.toolTip() == f"Sangama: pausing ({QUIET_HOURS})"
    running.set_result(True)  # the volunteer paused: the loop ended, no reason any more
    desk.node._apply(NodeStatus(state=ServeState.PAUSED))
    assert desk.tray.toolTip() == "Sangama: paused"
    assert "Resume contributing" in [t for t, _ in texts(desk)]
    assert not any(t.startswith("Paused by itself") for t, _ in texts(desk))


def test_settings_carry_the_good_guest_choices_and_survive_bad_quiet_hours(
    tmp_path: Path,
) -> None:
    s = Settings(
        pause_when_gpu_busy=False,
        pause_on_battery=False,
        quiet_hours="22:00-07:00",
        max_download_kib_s=2048,
    )
    s.save(tmp_path)
    loaded = Settings.load(tmp_path)
    assert loaded == s
    assert loaded.guest() == GuestSettings(
        pause_when_gpu_busy=False,
        pause_on_battery=False,
        quiet_hours=(QuietHours(22 * 60, 7 * 60),),
        download_bytes_per_s=2048 * 1024,
    )
    assert Settings(quiet_hours="after dinner").guest().quiet_hours == ()
    assert Settings().guest() == GuestSettings()  # defaults: pause for GPU and battery
