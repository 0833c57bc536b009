"""`apt upgrade` under a running tray app: it notices the new release on disk, lets the
conversations running through its stage finish (the stage pauses), then quits to start
the new release in its place; settings stay as they were, so the new one serves again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from app.node_status import NodeStatus, ServeState
from app.ui.tray import DesktopApp
from app.upgrades import UpgradeStep
from net.wire.versions import this_release

pytestmark = pytest.mark.ui


@pytest.fixture
def install(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    (folder / f"sangama-{this_release()}.dist-info").mkdir(parents=True)
    return folder


@pytest.fixture
def desk(new_desk: Callable[..., DesktopApp], install: Path) -> DesktopApp:
    return new_desk(upgrade_folder=install)


def _upgrade(install: Path, to: str) -> None:
    (install / f"sangama-{this_release()}.dist-info").rename(install / f"sangama-{to}.dist-info")


def test_a_new_release_waits_for_running_conversations_then_takes_over(
    desk: DesktopApp, install: Path
) -> None:
    watch = desk.upgrades
    assert watch.timer.isActive()
    serving = NodeStatus(state=ServeState.SERVING, node_id="worker-1", layers=(0, 4), running=2)
    desk.node._apply(serving)
    assert watch.look() is UpgradeStep.KEEP
    _upgrade(install, "99.0.0")
    assert watch.look() is UpgradeStep.DRAIN
    # The stage stopped taking conversations (this fake one had no loop: it is freed at
    # once); the volunteer's own pause setting did not change.
    assert desk.node.status.state not in (ServeState.SERVING, ServeState.MOVING)
    assert desk.settings.paused is False
    assert desk.notices[-1][0] == "Sangama update"
    assert "Sangama 99.0.0 was installed" in desk.notices[-1][1]
    assert watch.restart_into is None and not desk.quitting
    assert watch.look() is UpgradeStep.RESTART  # nothing runs any more
    assert watch.restart_into is not None and desk.quitting
    assert not watch.timer.isActive()


def test_an_idle_app_restarts_at_once_and_a_half_done_upgrade_waits(
    desk: DesktopApp, install: Path
) -> None:
    watch = desk.upgrades
    (install / "sangama-99.0.0.dist-info").mkdir()  # unpacked beside the old one
    assert watch.look() is UpgradeStep.KEEP
    (install / f"sangama-{this_release()}.dist-info").rmdir()
    assert watch.look() is UpgradeStep.RESTART
    assert desk.notices == []  # nothing ran: no notice, just the new release
    assert watch.restart_into is not None and desk.quitting
