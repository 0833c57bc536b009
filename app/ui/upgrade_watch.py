"""The tray's side of an upgrade installed under the running app (app/upgrades.py has
the rules): look at the install folder now and then, tell the volunteer, pause the stage
so running conversations finish, then quit and start the new release in this one's
place (run_app does the start, after Qt has let go of everything)."""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Slot

from app.node_status import ServeState
from app.ui.controllers import NodeController
from app.ui.settings import autostart_command
from app.upgrades import GRACE_S, Upgrade, UpgradeStep, installed_release, upgrade_step
from net.wire.versions import this_release

log = logging.getLogger(__name__)

LOOK_EVERY_MS = 10_000
_SERVING = (ServeState.SERVING, ServeState.PAUSING, ServeState.MOVING)


def restart_command() -> list[str]:
    """How to start the app again: as the login session would (the package's launcher,
    or this Python with the desktop module from a source tree)."""
    return shlex.split(autostart_command())


class UpgradeWatch(QObject):
    def __init__(
        self,
        node: NodeController,
        folder: Path | None,
        notify: Callable[[str, str], None],
        quit_app: Callable[[], None],
        grace_s: float = GRACE_S,
    ) -> None:
        super().__init__()
        self.node = node
        self.folder = folder
        self.notify = notify
        self.quit_app = quit_app
        self.grace_s = grace_s
        self.running = this_release()
        self.draining_since: float | None = None
        self.restart_into: list[str] | None = None
        """Set when the app quits to start the new release (run_app execs it)."""
        self.timer = QTimer(self)
        self.timer.setInterval(LOOK_EVERY_MS)
        self.timer.timeout.connect(self.look)
        if folder is not None:
            self.timer.start()

    @Slot()
    def look(self) -> UpgradeStep:
        if self.folder is None or self.restart_into is not None:
            return UpgradeStep.KEEP
        installed = installed_release(self.folder)
        serving = self.node.status.state in _SERVING
        draining = None if self.draining_since is None else time.monotonic() - self.draining_since
        step = upgrade_step(self.running, installed, serving, draining, self.grace_s)
        if step is UpgradeStep.DRAIN:
            assert installed is not None
            self.draining_since = time.monotonic()
            self.notify("Sangama update", Upgrade(self.running, installed).notice)
            log.info("release %s installed: pausing until conversations finish", installed)
            self.node.pause()
        elif step is UpgradeStep.RESTART:
            log.info("restarting into release %s", installed)
            self.timer.stop()
            self.restart_into = restart_command()
            self.quit_app()
        return step
