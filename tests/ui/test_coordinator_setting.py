"""The coordinator-address setting against a real coordinator (subprocess, HTTPS): when the
address kept with the identity no longer leads to the coordinator (it moved), the setting
takes over for heartbeats and placement; a malformed address is a clear error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.identity import IDENTITY_FILE, join_swarm
from app.node_status import ServeState
from app.ui.history import History
from app.ui.settings import Settings
from app.ui.tray import DesktopApp
from tests.support.coordinator_proc import CoordinatorProcess, free_port
from tests.support.tiny_models import write_tiny_model

pytestmark = [pytest.mark.ui, pytest.mark.integration]


@pytest.fixture(scope="module")
def coord(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    model = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny4.gguf", n_layer=4)
    c = CoordinatorProcess.start(tmp_path_factory.mktemp("coordinator"), model, min_stages=1)
    yield c
    c.stop()


def move_coordinator(identity_dir: Path) -> str:
    """Point the identity's stored coordinator address at a port nobody listens on, as if
    the coordinator had moved since the invite; return that old address."""
    path = identity_dir / IDENTITY_FILE
    doc = json.loads(path.read_text())
    doc["coordinator"] = f"https://127.0.0.1:{free_port()}"
    path.write_text(json.dumps(doc))
    return str(doc["coordinator"])


def test_coordinator_setting_overrides_the_address_kept_with_the_identity(
    qapp: QApplication,
    qtbot: QtBot,
    coord: CoordinatorProcess,
    tmp_path: Path,
    isolated_dirs: Path,
) -> None:
    qapp.setQuitOnLastWindowClosed(False)
    identity_dir = tmp_path / "identity"
    me = join_swarm(coord.admin.create_invite("worker")["code"], identity_dir)
    old = move_coordinator(identity_dir)
    old_place = old.removeprefix("https://")
    settings_dir = tmp_path / "settings"
    # A malformed address (settings.json edited by hand): a clear error, not a traceback.
    desk = DesktopApp(
        Settings(coordinator="coordinator.example.org:8443"),
        settings_dir=settings_dir,
        identity_dir=identity_dir,
        history=History(tmp_path / "chats"),
        tray_available=True,
    )
    try:
        qtbot.waitUntil(lambda: desk.node.status.state is ServeState.ERROR, timeout=30000)
        assert "must start with https://" in desk.node.status.error
        assert desk.tray is not None and "coordinator.example.org:8443" in desk.tray.toolTip()

        # Cleared: the stored address is used, and it leads nowhere; the status says where.
        dialog = desk.open_settings()
        assert old in dialog.coordinator.placeholderText()  # the address the invite named
        dialog.coordinator.setText("")
        dialog.save_button.click()
        # The status names the address (as HOST:PORT) it could not reach.
        qtbot.waitUntil(lambda: old_place in desk.node.status.error, timeout=30000)
        assert desk.node.status.state is ServeState.WAITING
        assert "reach" in desk.node.status.error

        # The coordinator's new address: typed wrong first (refused at once), then right.
        dialog = desk.open_settings()
        dialog.coordinator.setText(coord.url.removeprefix("https://"))
        assert not dialog.save_button.isEnabled()
        assert "must start with https://" in dialog.coordinator_hint.text()
        dialog.coordinator.setText(coord.url + "/")
        assert dialog.save_button.isEnabled()
        dialog.save_button.click()
        assert Settings.load(settings_dir).coordinator == coord.url
        qtbot.waitUntil(lambda: desk.node.status.state is ServeState.SERVING, timeout=60000)
        status = desk.node.status
        assert status.coordinator == coord.url and status.layers == (0, 4) and not status.error
        # The coordinator placed this node: its heartbeats arrive at the new address.
        plan = coord.admin.swarm()["plan"]
        assert [(s["node_id"], tuple(s["layers"])) for s in plan] == [(me.node_id, (0, 4))]
    finally:
        desk.quit()
    assert not desk.runner.running
