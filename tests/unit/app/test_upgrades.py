"""An upgrade installed under the running app: what the app does (a pure table), and how
it reads the release on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.upgrades import Upgrade, UpgradeStep, installed_release, upgrade_step

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("installed", "serving", "draining_s", "step"),
    [
        (None, True, None, UpgradeStep.KEEP),  # a source tree, or an upgrade half done
        ("0.1.0", True, None, UpgradeStep.KEEP),  # what runs is what is installed
        ("0.2.0", False, None, UpgradeStep.RESTART),  # nothing to wait for
        ("0.2.0", True, None, UpgradeStep.DRAIN),  # conversations run: let them finish
        ("0.2.0", True, 30.0, UpgradeStep.WAIT),
        ("0.2.0", True, 600.0, UpgradeStep.RESTART),  # they may not hold it back for ever
        ("0.2.0", False, 30.0, UpgradeStep.RESTART),  # they finished
        ("0.0.9", False, None, UpgradeStep.RESTART),  # a downgrade is a new release too
    ],
)
def test_what_the_app_does_about_the_release_on_disk(
    installed: str | None, serving: bool, draining_s: float | None, step: UpgradeStep
) -> None:
    assert upgrade_step("0.1.0", installed, serving, draining_s, grace_s=600.0) is step


def test_the_release_on_disk_is_read_afresh_and_a_half_done_upgrade_is_none(
    tmp_path: Path,
) -> None:
    (tmp_path / "PySide6-6.9.1.dist-info").mkdir()
    (tmp_path / "sangama_extra-1.0.dist-info").mkdir()  # another distribution
    assert installed_release(tmp_path) is None
    (tmp_path / "sangama-0.1.0.dist-info").mkdir()
    assert installed_release(tmp_path) == "0.1.0"
    (tmp_path / "sangama-0.2.0.dist-info").mkdir()  # dpkg unpacked the new, old not gone
    assert installed_release(tmp_path) is None
    (tmp_path / "sangama-0.1.0.dist-info").rmdir()
    assert installed_release(tmp_path) == "0.2.0"
    assert installed_release(tmp_path / "gone") is None


def test_the_notice_names_both_releases() -> None:
    notice = Upgrade("0.1.0", "0.2.0").notice
    assert "Sangama 0.2.0 was installed" in notice and "(you run 0.1.0)" in notice
