"""The join dialog against a real coordinator (subprocess, HTTPS): a refused code shows
the coordinator's reason; a good one joins, serves, pauses, resumes and quits. (The tiny
model has no tokenizer, so chatting is tested against Gemma in test_chat.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.node_status import ServeState
from app.ui.history import History
from app.ui.settings import Settings
from app.ui.tray import DesktopApp
from coordinator import invites as inv
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.tiny_models import write_tiny_model

pytestmark = [pytest.mark.ui, pytest.mark.integration]


@pytest.fixture(scope="module")
def coord(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    model = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny4.gguf", n_layer=4)
    c = CoordinatorProcess.start(tmp_path_factory.mktemp("coordinator"), model, min_stages=1)
    yield c
    c.stop()


def test_join_serve_pause_resume_quit(
    qapp: QApplication,
    qtbot: QtBot,
    coord: CoordinatorProcess,
    tmp_path: Path,
    isolated_dirs: Path,
    artifacts: Path,
) -> None:
    qapp.setQuitOnLastWindowClosed(False)
    desk = DesktopApp(
        Settings(),
        settings_dir=tmp_path / "settings",
        identity_dir=tmp_path / "identity",
        history=History(tmp_path / "chats"),
        tray_available=True,
    )
    try:
        dialog = desk.open_join()
        # a malformed code: said at once, Join stays off
        dialog.code.setText("sangama1-not-a-real-code")
        assert not dialog.join_button.isEnabled()
        assert "damaged" in dialog.code_hint.text()

        good = coord.admin.create_invite("worker")["code"]
        d = inv.InviteCode.decode(good)
        forged = inv.InviteCode(d.coordinator, d.ca_fingerprint, "made-up").encode()
        dialog.code.setText(forged)
        assert dialog.join_button.isEnabled()
        with qtbot.waitSignal(desk.node.join_finished, timeout=20000) as refused:
            dialog.join_button.click()
        assert refused.args is not None and refused.args[0] is False
        assert "not known to the coordinator" in dialog.result_label.text()
        assert desk.node.status.state is ServeState.NOT_JOINED
        assert dialog.grab().save(str(artifacts / "offscreen_join_refused.png"))

        dialog.code.setText(good)
        assert dialog.cap_bytes > 0
        with qtbot.waitSignal(desk.node.join_finished, timeout=20000) as joined:
            dialog.join_button.click()
        assert joined.args is not None and joined.args[0] is True, joined.args
        assert not dialog.isVisible()  # accepted
        qtbot.waitUntil(lambda: desk.node.status.state is ServeState.SERVING, timeout=60000)
        status = desk.node.status
        assert status.layers == (0, 4)
        assert desk.tray is not None and "serving layers 0-3" in desk.tray.toolTip()
        assert Settings.load(tmp_path / "settings").vram_cap_bytes == dialog.cap_bytes
        # The first heartbeat while serving reports what this process holds (no GPU: RAM).
        qtbot.waitUntil(lambda: " GiB of " in desk.node.status.memory, timeout=20000)
        assert desk.node.status.memory.endswith(("of RAM", "of VRAM"))
        # What runs the stage, from the engine: its backend and its 4 layers.
        compute = desk.node.status.compute
        assert compute is not None and compute.backend, compute
        assert compute.layers_text.endswith("/4 layers on GPU")

        # a used code while serving: checked with the coordinator, nothing stops
        dialog.hide()
        dialog2 = desk.open_join()
        dialog2.code.setText(good)
        with qtbot.waitSignal(desk.node.code_checked, timeout=20000):
            dialog2.join_button.click()
        assert "already been used" in dialog2.result_label.text()
        assert "keeps serving" in dialog2.result_label.text()
        assert desk.node.status.state.name == "SERVING" and desk.node.serving
        dialog2.hide()

        # pause stops and frees the stage; resume rejoins and serves again
        desk.rebuild_menu()
        menu = [a.text() for a in desk.menu.actions()]
        assert "Pause contributing" in menu
        desk.toggle_pause()  # returns at once: running sessions (none here) finish first
        assert Settings.load(tmp_path / "settings").paused
        qtbot.waitUntil(lambda: desk.node.status.state is ServeState.PAUSED, timeout=30000)
        assert not desk.node.serving
        desk.rebuild_menu()
        assert "Resume contributing" in [a.text() for a in desk.menu.actions()]
        desk.toggle_pause()
        qtbot.waitUntil(lambda: desk.node.status.state is ServeState.SERVING, timeout=60000)
    finally:
        desk.quit()
    assert not desk.runner.running  # the loop thread ended: clean shutdown


def test_a_revoked_code_leaves_the_stage_serving_and_a_good_one_asks_first(
    qapp: QApplication,
    qtbot: QtBot,
    coord: CoordinatorProcess,
    tmp_path: Path,
    isolated_dirs: Path,
) -> None:
    qapp.setQuitOnLastWindowClosed(False)
    settings = Settings(vram_cap_bytes=2 * 1024**3)  # the volunteer's own cap
    desk = DesktopApp(
        settings,
        settings_dir=tmp_path / "settings",
        identity_dir=tmp_path / "identity",
        history=History(tmp_path / "chats"),
        tray_available=True,
    )
    try:
        first = coord.admin.create_invite("worker")["code"]
        desk.node.join(first, settings.vram_cap_bytes)
        qtbot.waitUntil(lambda: desk.node.status.state is ServeState.SERVING, timeout=60000)
        node_id = desk.node.status.node_id
        serving = desk.node.status

        revoked = coord.admin.create_invite("worker")
        coord.admin.delete(f"/api/v1/invites/{revoked['id']}")
        dialog = desk.open_join()
        assert dialog.cap_bytes == settings.vram_cap_bytes  # the cap set, not all that is free
        states: list[ServeState] = []
        desk.node.status_changed.connect(lambda s: states.append(s.state))
        dialog.code.setText(revoked["code"])
        with qtbot.waitSignal(desk.node.code_checked, timeout=20000) as checked:
            dialog.join_button.click()
        assert checked.args is not None and checked.args[0] is False
        assert "revoked" in dialog.result_label.text()
        assert "keeps serving" in dialog.result_label.text()
        assert desk.node.serving and desk.node.status.state is ServeState.SERVING
        assert desk.node.status.node_id == node_id and desk.node.status.layers == serving.layers
        assert all(s is ServeState.SERVING for s in states), states  # never left, not even briefly
        assert dialog.isVisible()
        shots = Path(__file__).resolve().parents[2] / "artifacts"
        shots.mkdir(exist_ok=True)
        assert dialog.grab().save(str(shots / "join_dialog_revoked_code_keeps_stage.png"))

        # A good code: valid, but leaving the swarm is asked first; nothing stopped yet.
        second = coord.admin.create_invite("worker")["code"]
        dialog.code.setText(second)
        with qtbot.waitSignal(desk.node.code_checked, timeout=20000) as checked:
            dialog.join_button.click()
        assert checked.args is not None and checked.args[0] is True
        assert "Leave" in dialog.join_button.text() and dialog.join_button.isEnabled()
        assert "leaves the swarm" in dialog.result_label.text()
        assert desk.node.serving and desk.node.status.node_id == node_id
        with qtbot.waitSignal(desk.node.join_finished, timeout=60000) as joined:
            dialog.join_button.click()
        assert joined.args is not None and joined.args[0] is True, joined.args
        assert joined.args[1] != node_id
        qtbot.waitUntil(lambda: desk.node.status.state is ServeState.SERVING, timeout=60000)
        assert desk.node.status.node_id == joined.args[1]
        assert Settings.load(tmp_path / "settings").vram_cap_bytes == 2 * 1024**3
    finally:
        desk.quit()
