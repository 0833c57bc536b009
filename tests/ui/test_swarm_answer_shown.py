"""The tray's status window says whether the swarm can answer, as the coordinator's
end-to-end probe found it (heartbeat answer -> NodeStatus.swarm -> the window), and what
the coordinator says of this release (NodeStatus.update: the window, the menu, one
notification)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from app.node_status import NodeStatus, ServeState, swarm_answer
from app.ui.tray import DesktopApp
from coordinator.releases import update_notice
from net.wire.versions import this_release

pytestmark = pytest.mark.ui


@pytest.fixture
def desk(new_desk: Callable[..., DesktopApp]) -> DesktopApp:
    return new_desk()


def test_the_status_window_says_whether_the_swarm_can_answer(desk: DesktopApp) -> None:
    status = desk.open_status()
    serving = NodeStatus(state=ServeState.SERVING, node_id="worker-1", layers=(0, 4))
    desk.node._apply(serving)
    assert status.fields["swarm"].text() == "—"  # the coordinator has not said yet
    broken = swarm_answer(False, 1_700_000_000, "stage worker-2 does not accept links")
    desk.node._apply(NodeStatus(**{**serving.__dict__, "swarm": broken}))
    text = status.fields["swarm"].text()
    assert text.startswith("cannot answer since ")
    assert text.endswith("because stage worker-2 does not accept links")
    desk.node._apply(NodeStatus(**{**serving.__dict__, "swarm": swarm_answer(True, 0, "")}))
    assert status.fields["swarm"].text() == "can answer"


def test_an_update_the_coordinator_announces_is_told_once_and_stays_in_menu_and_window(
    desk: DesktopApp,
) -> None:
    status = desk.open_status()
    serving = NodeStatus(state=ServeState.SERVING, node_id="worker-1", layers=(0, 4))
    desk.node._apply(serving)
    assert status.fields["release"].text() == f"{this_release()}, current"
    assert desk.notices == []
    notice = update_notice(this_release(), "99.0.0")
    assert notice == f"Sangama 99.0.0 is available (you run {this_release()})"
    for _ in range(3):  # every heartbeat says it again: one notification
        desk.node._apply(replace(serving, update=notice))
    assert desk.notices == [("Sangama update", notice)]
    assert status.fields["release"].text() == notice
    desk.rebuild_menu()
    lines = [a.text() for a in desk.menu.actions()]
    assert notice in lines
    too_old = update_notice(this_release(), "99.0.0", "98.0")
    desk.node._apply(replace(serving, update=too_old))
    assert desk.notices[-1] == ("Sangama update", too_old)
    assert "too old for this swarm: update to 98.0 or later" in too_old
