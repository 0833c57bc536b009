"""Widgets offscreen (pytest-qt): icons, the tray menu rebuilt from state, the no-tray
window, windows that hide instead of quitting, chat errors shown in the window."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.compute import StageCompute
from app.node_status import NodeStatus, ServeState
from app.ui.history import History
from app.ui.icons import state_pixmap
from app.ui.settings import Settings
from app.ui.tray import NO_TRAY_TEXT, DesktopApp

pytestmark = pytest.mark.ui


@pytest.fixture
def desk(new_desk: Callable[..., DesktopApp]) -> DesktopApp:
    return new_desk()


def menu_texts(d: DesktopApp) -> list[str]:
    d.rebuild_menu()
    return [a.text() for a in d.menu.actions() if not a.isSeparator()]


def test_each_state_has_its_own_icon(qapp: QApplication) -> None:
    images = {s: state_pixmap(NodeStatus(state=s, progress=0.3), 32).toImage() for s in ServeState}
    edge = {s: img.pixelColor(5, 16).name() for s, img in images.items()}
    assert edge[ServeState.SERVING] != edge[ServeState.ERROR]
    assert images[ServeState.DOWNLOADING] != images[ServeState.WAITING]
    assert images[ServeState.PAUSED] != images[ServeState.NOT_JOINED]


def test_menu_is_rebuilt_from_state(desk: DesktopApp, artifacts: Path) -> None:
    texts = menu_texts(desk)
    assert texts == [
        "Not joined",
        "Open chat",
        "Status",
        "Pause contributing",
        "Join a swarm...",
        "Settings...",
        "Quit",
    ]
    pause = next(a for a in desk.menu.actions() if a.text() == "Pause contributing")
    assert not pause.isEnabled()  # nothing to pause before joining
    desk.node._apply(NodeStatus(state=ServeState.ERROR, error="The coordinator is unreachable"))
    assert desk.tray is not None
    assert desk.tray.toolTip() == "Sangama: error: The coordinator is unreachable"
    texts = menu_texts(desk)
    assert texts[:2] == ["Error: the coordinator is unreachable", "Why? Show the error…"]
    assert "Resume contributing" in texts
    box = desk.show_error()  # the reason, one click away, without blocking the tray
    assert box.isVisible() and not box.isModal()
    assert box.informativeText() == "The coordinator is unreachable"
    assert box.grab().save(str(artifacts / "offscreen_error_box.png"))
    box.hide()
    desk.node._apply(NodeStatus(state=ServeState.PAUSING, finishing=2))
    assert desk.tray.toolTip() == "Sangama: pausing, finishing 2 sessions"
    desk.rebuild_menu()
    pausing = next(a for a in desk.menu.actions() if a.text().startswith("Pausing"))
    assert not pausing.isEnabled()  # on its way already
    desk.node._apply(NodeStatus(state=ServeState.DOWNLOADING, progress=0.5))
    assert desk.tray.toolTip() == "Sangama: downloading (50%)"
    desk.menu.popup(desk.menu.pos())
    assert desk.menu.grab().save(str(artifacts / "offscreen_tray_menu.png"))
    desk.menu.hide()


def test_without_a_tray_a_window_says_so(
    qapp: QApplication, qtbot: QtBot, tmp_path: Path, isolated_dirs: Path
) -> None:
    d = DesktopApp(Settings(), tmp_path / "s", tmp_path / "i", History(tmp_path / "c"), None, False)
    try:
        assert d.tray is None and d.fallback is not None
        assert d.fallback.isVisible()
        labels = [w.text() for w in d.fallback.findChildren(type(d.fallback.state_label))]
        assert NO_TRAY_TEXT in labels
        d.fallback.close()  # closing hides; the app goes on
        assert not d.fallback.isVisible() and not d.quitting
    finally:
        d.quit()


def test_closing_windows_hides_them_and_never_quits(desk: DesktopApp, qtbot: QtBot) -> None:
    chat = desk.open_chat()
    status = desk.open_status()
    assert chat.isVisible() and status.isVisible()
    chat.close()
    status.close()
    assert not chat.isVisible() and not status.isVisible()
    assert not desk.quitting and desk.runner.running
    assert desk.open_chat() is chat  # the same window, history intact


def test_chat_before_joining_says_why_in_the_window(desk: DesktopApp, qtbot: QtBot) -> None:
    chat = desk.open_chat()
    chat.prompt.setPlainText("hello?")
    chat.send()
    qtbot.waitUntil(chat.error_label.isVisible, timeout=2000)
    assert "join one first" in chat.error_label.text()


def test_status_window_shows_stage_and_plot(desk: DesktopApp, artifacts: Path) -> None:
    status = desk.open_status()
    s = NodeStatus(
        state=ServeState.SERVING,
        node_id="worker-1",
        coordinator="https://127.0.0.1:8443",
        layers=(6, 12),
        model="gemma-3-270m",
        address="127.0.0.1:40000",
        next_hop="worker-2 at 127.0.0.1:40001 (direct)",
        sessions=3,
        steps=120,
        compute_ms=4.2,
        queue_ms=0.3,
        memory="1.2 GiB of VRAM",
        compute=StageCompute(
            "Vulkan0 (NVIDIA GeForce RTX 4090), 4/6 layers", 3 << 29, 8 << 30, 4, 6
        ),
        rtt_ms=0.8,
    )
    for i in range(30):
        desk.node._apply(replace(s, throughput=10 + (i % 7) * 3))
    assert status.fields["stage"].text().startswith("layers 6-11 (6 layers)")
    assert "worker-2" in status.fields["next"].text()
    assert "0.8 ms round trip" in status.fields["timings"].text()
    assert "0.3 ms waiting" in status.fields["timings"].text()
    assert status.fields["memory"].text() == "1.2 GiB of VRAM in use by Sangama"
    assert status.fields["backend"].text() == "Vulkan0 (NVIDIA GeForce RTX 4090), 4/6 layers"
    assert status.fields["device_memory"].text() == "1.5 / 8.0 GiB device memory"
    assert status.fields["gpu_layers"].text() == "4/6 layers on GPU"
    assert len(status.plot.samples) == 30
    assert status.grab().save(str(artifacts / "offscreen_status_window.png"))
    desk.node._apply(replace(s, state=ServeState.WAITING, compute=None))  # stage freed
    assert status.fields["backend"].text() == status.fields["gpu_layers"].text() == "—"


def test_settings_dialog_checks_the_coordinator_and_sets_the_api_port(
    desk: DesktopApp, tmp_path: Path, artifacts: Path
) -> None:
    dialog = desk.open_settings()
    assert dialog.api_port.value() == 0 and dialog.api_port.text() == "off"
    dialog.coordinator.setText("coordinator.example.org:8443")
    assert not dialog.save_button.isEnabled()
    assert "must start with https://" in dialog.coordinator_hint.text()
    dialog.coordinator.setText("https://coordinator.example.org:8443/")
    assert dialog.save_button.isEnabled() and not dialog.form.isRowVisible(dialog.coordinator_hint)
    dialog.api_port.setValue(8123)
    assert "http://127.0.0.1:8123/v1" in dialog.api_hint.text()
    assert dialog.grab().save(str(artifacts / "offscreen_settings_dialog.png"))
    dialog.save_button.click()
    saved = Settings.load(tmp_path / "settings")
    assert saved.coordinator == "https://coordinator.example.org:8443" and saved.api_port == 8123
    assert desk.node.options.coordinator == saved.coordinator
    assert desk.api.text == "off"  # not joined: nothing to serve the API as
