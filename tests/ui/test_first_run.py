"""The first-run wizard against a real coordinator serving the default model (SmolLM2,
98 MB): each page in turn, a refused and an accepted invite, the real download with
speed and time left, serving with its notification; closing never stops serving, and
Quit asks while a conversation runs. Screenshots of each page in artifacts/ui/.

The GPU shown on the memory page is faked (this machine has none), so the page shows
what a volunteer with one sees; everything after it is real."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import QApplication, QMessageBox, QWizard
from pytestqt.qtbot import QtBot

from app.node_status import NodeStatus, ServeState
from app.ui.first_run import FirstRunWizard
from app.ui.first_run_flow import GIB, Page, cap_range, needs_first_run
from app.ui.history import History
from app.ui.settings import Settings
from app.ui.tray import DesktopApp
from coordinator import invites as inv
from core.types import GpuInfo, HardwareReport
from tests.support.coordinator_proc import CoordinatorProcess

pytestmark = [pytest.mark.ui, pytest.mark.integration]

GPU = GpuInfo(0, "NVIDIA GeForce RTX 3060", 12 * GIB, int(10.5 * GIB))
HARDWARE = HardwareReport((GPU,), 32 * GIB, 20 * GIB, "550.54", "")


@pytest.fixture(scope="module")
def coord(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    c = CoordinatorProcess.start(tmp_path_factory.mktemp("coordinator"), smollm2_path, min_stages=1)
    yield c
    c.stop()


def _page(wizard: FirstRunWizard) -> Page:
    return wizard.page_now  # a call, so mypy does not pin the page after the first check


def _shoot(wizard: QWizard, artifacts: Path, name: str) -> None:
    QApplication.processEvents()
    assert wizard.grab().save(str(artifacts / f"first_run_{name}.png"))


def test_first_run_walks_through_to_serving(
    qapp: QApplication,
    qtbot: QtBot,
    coord: CoordinatorProcess,
    tmp_path: Path,
    isolated_dirs: Path,
    artifacts: Path,
) -> None:
    qapp.setQuitOnLastWindowClosed(False)
    settings_dir = tmp_path / "settings"
    desk = DesktopApp(
        Settings(),
        settings_dir=settings_dir,
        identity_dir=tmp_path / "identity",
        history=History(tmp_path / "chats"),
        tray_available=True,
    )
    try:
        assert needs_first_run(desk.settings, desk.node.joined)  # what run_app checks
        wizard = FirstRunWizard(desk, hardware=HARDWARE)
        desk.first_run = wizard
        wizard.resize(660, 480)
        wizard.show()
        next_button = wizard.button(QWizard.WizardButton.NextButton)

        # 1. what Sangama does with this PC
        assert _page(wizard) is Page.WELCOME and next_button.isEnabled()
        _shoot(wizard, artifacts, "1_welcome")

        # 2. the cap, with what the GPU has
        wizard.next()
        assert _page(wizard) is Page.MEMORY
        assert "NVIDIA GeForce RTX 3060, 10.5 GiB free of 12.0 GiB" in (
            wizard.memory.hardware_label.text()
        )
        assert wizard.memory.cap_bytes == pytest.approx(cap_range(GPU.free_bytes).default, GIB / 20)
        wizard.memory.cap.setValue(6.0)
        _shoot(wizard, artifacts, "2_memory")

        # 3. the invite: a damaged code blocks Next; a made-up one is refused by the
        # coordinator, in its words; the good one joins and moves on by itself
        wizard.next()
        join_button = wizard.button(QWizard.WizardButton.CommitButton)
        assert _page(wizard) is Page.INVITE and join_button.text() == "Join"
        assert not join_button.isEnabled()
        wizard.invite.code.setText("sangama1-not-a-real-code")
        assert not join_button.isEnabled() and "damaged" in wizard.invite.why.text()
        good = coord.admin.create_invite("worker")["code"]
        d = inv.InviteCode.decode(good)
        forged = inv.InviteCode(d.coordinator, d.ca_fingerprint, "made-up").encode()
        wizard.invite.code.setText(forged)
        assert join_button.isEnabled()
        with qtbot.waitSignal(desk.node.join_finished, timeout=30000):
            join_button.click()
        assert _page(wizard) is Page.INVITE
        assert "not known to the coordinator" in wizard.invite.result_label.text()
        _shoot(wizard, artifacts, "3_invite_refused")
        wizard.invite.code.setText(good)
        _shoot(wizard, artifacts, "3_invite")

        # 4. the real download: the page as it showed progress halfway (else the last)
        shot: list[tuple[QPixmap, bool]] = []  # the grab, and whether it is from halfway
        lines: list[str] = []

        def downloading(status: NodeStatus) -> None:
            if status.state is ServeState.DOWNLOADING and status.download_bytes:
                lines.append(wizard.download.detail.text())
                halfway = 0.3 < status.progress < 0.8 and "/s" in lines[-1]
                if not shot or not shot[0][1]:
                    shot[:] = [(wizard.grab(), halfway)]

        desk.node.status_changed.connect(downloading)  # after the wizard's own slot
        with qtbot.waitSignal(desk.node.join_finished, timeout=30000) as joined:
            join_button.click()
        assert joined.args is not None and joined.args[0] is True, joined.args
        assert _page(wizard) is Page.DOWNLOAD
        back = wizard.button(QWizard.WizardButton.BackButton)
        assert not (back.isVisible() and back.isEnabled())  # joined: no way back
        assert desk.settings.vram_cap_bytes == 6 * GIB  # the join saved the cap chosen
        try:
            qtbot.waitUntil(lambda: _page(wizard) is Page.SERVING, timeout=240000)
        except AssertionError:  # pytest-qt's TimeoutError is one
            raise AssertionError(f"not serving: {desk.node.status}, {lines[-3:]}") from None
        assert lines, "the download page showed the download"
        assert " of " in lines[-1] and "%" in lines[-1], lines
        assert any("MiB/s" in ln for ln in lines) or "measuring speed" in lines[-1], lines
        assert shot and shot[0][0].save(str(artifacts / "first_run_4_download.png"))
        print("download lines:", lines[:3], "...", lines[-3:])

        # 5. serving, and the notification that said so
        assert desk.node.status.state is ServeState.SERVING
        assert desk.notices and desk.notices[0][0] == "Sangama is serving"
        assert "layers 0-29" in desk.notices[0][1]
        assert wizard.serving.summary.text() == desk.notices[0][1]
        _shoot(wizard, artifacts, "5_serving")
        wizard.button(QWizard.WizardButton.FinishButton).click()
        assert not wizard.isVisible()
        saved = Settings.load(settings_dir)
        assert saved.first_run_done and saved.vram_cap_bytes == 6 * GIB
        assert not needs_first_run(saved, desk.node.joined)

        # Closing windows never stops serving
        qtbot.wait(500)
        assert desk.node.status.state is ServeState.SERVING and not desk.quitting

        # Quit asks while a conversation runs (the status a heartbeat would report)
        desk.node._apply(replace(desk.node.status, sessions=5, running=1))
        box = desk.request_quit()
        assert box is not None and box.isVisible() and not desk.quitting
        assert box.text().startswith("1 conversation runs through this PC")
        assert box.grab().save(str(artifacts / "first_run_quit_question.png"))
        box.button(QMessageBox.StandardButton.No).click()
        assert not desk.quitting and desk.node.status.state is ServeState.SERVING
        desk.node._apply(replace(desk.node.status, sessions=5, running=0))
        assert desk.request_quit() is None and desk.quitting  # nothing running: at once
    finally:
        desk.quit()
    assert not desk.runner.running
