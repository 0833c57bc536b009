"""One sangama-app per user: the lock and socket names, a second claim in one process
handing "show" to the first, and the real app started twice under X11 with a tray host
(Xvfb + openbox + tint2, as test_xvfb_screens.py): one tray icon, the second start gone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.ui.single_instance import claim, instance_names, is_show_request
from tests.ui.test_xvfb_screens import x_display  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.unit
def test_names_are_per_user_and_settings_folder_and_fit_a_socket_path(tmp_path: Path) -> None:
    a = instance_names(tmp_path / "one", user="ada")
    assert a == instance_names(tmp_path / "one", user="ada")
    assert a.server_name != instance_names(tmp_path / "two", user="ada").server_name
    assert a.server_name != instance_names(tmp_path / "one", user="bob").server_name
    assert a.lock_path.parent == tmp_path / "one"
    assert re.fullmatch(r"sangama-app-[0-9a-f]{16}", a.server_name)


@pytest.mark.unit
def test_only_a_show_request_counts() -> None:
    assert is_show_request(b"show\n") and is_show_request(b"show")
    assert not is_show_request(b"") and not is_show_request(b"quit\n")


@pytest.mark.ui
def test_a_second_claim_tells_the_first_and_gets_nothing(
    qapp: QApplication, qtbot: QtBot, tmp_path: Path
) -> None:
    first = claim(tmp_path)
    assert first is not None
    try:
        with qtbot.waitSignal(first.show_requested, timeout=10000):
            assert claim(tmp_path) is None
        other = claim(tmp_path / "elsewhere")  # another settings folder: its own app
        assert other is not None
        other.release()
    finally:
        first.release()
    again = claim(tmp_path)  # released on quit: the next start is the first again
    assert again is not None
    again.release()


def _icons(x_log: Path) -> set[str]:
    """The pids whose tray icons tint2 holds now (its log says add_icon / remove_icon)."""
    held: dict[str, str] = {}
    for line in x_log.read_text(errors="replace").splitlines():
        if m := re.search(r"add_icon: (\d+) .*pid (\d+)", line):
            held[m.group(1)] = m.group(2)
        elif m := re.search(r"remove_icon: (\d+)", line):
            held.pop(m.group(1), None)
    return set(held.values())


@pytest.mark.ui
@pytest.mark.integration
def test_sangama_app_started_twice_shows_one_tray_icon(
    x_display: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "DISPLAY": x_display,
        "QT_QPA_PLATFORM": "xcb",
        "PYTHONPATH": str(ROOT),
        **{v: str(tmp_path / v.lower()) for v in ("XDG_CONFIG_HOME", "XDG_DATA_HOME")},
        **{v: str(tmp_path / v.lower()) for v in ("XDG_STATE_HOME", "XDG_CACHE_HOME")},
    }
    command = [sys.executable, "-m", "app.ui.desktop"]
    x_log = tmp_path / "x.log"
    first = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 60
        while str(first.pid) not in _icons(x_log):
            assert first.poll() is None, "the first app ended"
            assert time.monotonic() < deadline, "no tray icon from the first app"
            time.sleep(0.2)
        second = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 0, second.stderr[-2000:]
        time.sleep(1.0)  # an icon the second start made would have reached tint2 by now
        assert first.poll() is None  # the first keeps running
        assert _icons(x_log) == {str(first.pid)}
        seen = x_log.read_text(errors="replace")
        assert len(re.findall(r"add_icon: ", seen)) == 1  # never two, not even briefly
    finally:
        first.terminate()
        try:
            first.wait(20)
        except subprocess.TimeoutExpired:
            first.kill()
