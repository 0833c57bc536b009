"""The app updated under its feet: notice a newer release installed on disk (`apt
upgrade` replaces the files of a running app), let running conversations finish, then
start the new release in place of this one. The rules are pure; the tray runs them.

A running Python keeps the modules it imported but imports the rest lazily, so after an
upgrade the old release would load new modules beside its old ones: restarting is the
only clean way on. Identity, settings and pieces live in the user's folders, which an
upgrade never touches, so the new release starts where this one stopped.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from itertools import islice
from pathlib import Path

DIST = "sangama"
_DIST_INFO = re.compile(r"^sangama-(?P<release>[0-9][0-9A-Za-z.+!_-]{0,63})\.dist-info$")
GRACE_S = 600.0
"""The longest running conversations may hold back a restart into a new release."""
MAX_ENTRIES = 4096
"""Entries of the install folder read at most per look (it holds a few hundred)."""


class UpgradeStep(enum.Enum):
    KEEP = "keep"
    """Nothing new on disk (or the app runs from a source tree)."""
    DRAIN = "drain"
    """A newer release is installed: take no new conversations, let the running ones end."""
    WAIT = "wait"
    """Still draining."""
    RESTART = "restart"
    """Start the new release now."""


@dataclass(frozen=True)
class Upgrade:
    running: str
    installed: str

    @property
    def notice(self) -> str:
        return (
            f"Sangama {self.installed} was installed: this PC restarts into it once the "
            f"conversations running through it finish (you run {self.running})"
        )


def upgrade_step(
    running: str, installed: str | None, serving: bool, draining_s: float | None,
    grace_s: float = GRACE_S,
) -> UpgradeStep:  # fmt: skip
    """What the app does about the release on disk. `draining_s`: how long it has been
    draining (None: not yet); `serving`: whether a stage still runs conversations."""
    if installed is None or installed == running:
        return UpgradeStep.KEEP
    if not serving:
        return UpgradeStep.RESTART
    if draining_s is None:
        return UpgradeStep.DRAIN
    return UpgradeStep.RESTART if draining_s >= grace_s else UpgradeStep.WAIT


def install_folder() -> Path | None:
    """The folder holding this app's installed metadata (None: a bare source tree)."""
    try:
        found = distribution(DIST)
    except PackageNotFoundError:
        return None
    folder = Path(str(found.locate_file("")))
    return folder if folder.is_dir() else None


def installed_release(folder: Path) -> str | None:
    """The release whose metadata is in `folder` now, read from the disk afresh (an upgrade
    replaces sangama-OLD.dist-info with sangama-NEW.dist-info); None when there is none or
    more than one (an upgrade half done: look again later)."""
    found: list[str] = []
    try:
        for entry in islice(folder.iterdir(), MAX_ENTRIES):
            if m := _DIST_INFO.match(entry.name):
                found.append(m.group("release"))
    except OSError:
        return None
    return found[0] if len(found) == 1 else None
