"""The real tray under X11: Xvfb + openbox + tint2 (an XEmbed tray host), the app joining a
real coordinator serving the default model (SmolLM2 135M Instruct), a real right click on
the icon, and screenshots of the tray menu, join dialog, serving notification, chat window
(a streamed answer to a question), status window, settings dialog and an error's message
(a real left click on the icon) in artifacts/ui/.
Needs: xvfb openbox tint2 xdotool imagemagick libxcb-cursor0 libxcb-icccm4
libxcb-keysyms1 (Debian)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ui, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("Xvfb", "openbox", "tint2", "xdotool", "import")
SCENES = (
    "tray_menu",
    "join_dialog_refused",
    "join_dialog",
    "serving_notification",
    "chat_window",
    "status_window",
    "settings_dialog",
    "error_message",
)


def _free_display() -> int:
    for n in range(90, 140):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            return n
    raise RuntimeError("no free X display number")


@pytest.fixture
def x_display(tmp_path: Path) -> Iterator[str]:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install xvfb openbox tint2 ...)")
    display = f":{_free_display()}"
    env = {**os.environ, "DISPLAY": display}
    procs: list[subprocess.Popen[bytes]] = []
    log = (tmp_path / "x.log").open("wb")
    try:
        procs.append(
            subprocess.Popen(
                ["Xvfb", display, "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                stdout=log,
                stderr=log,
            )
        )
        deadline = time.monotonic() + 10
        while not Path(f"/tmp/.X11-unix/X{display[1:]}").exists():
            assert time.monotonic() < deadline, "Xvfb did not start"
            time.sleep(0.1)
        procs.append(subprocess.Popen(["openbox"], env=env, stdout=log, stderr=log))
        time.sleep(0.5)
        procs.append(subprocess.Popen(["tint2"], env=env, stdout=log, stderr=log))
        time.sleep(1.0)
        yield display
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


def test_tray_menu_dialogs_chat_and_status_on_a_real_x_server(
    x_display: str, artifacts: Path
) -> None:
    for name in SCENES:
        (artifacts / f"{name}.png").unlink(missing_ok=True)
    env = {
        **os.environ,
        "DISPLAY": x_display,
        "QT_QPA_PLATFORM": "xcb",
        "PYTHONPATH": str(ROOT),
    }
    r = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("xvfb_scenes.py")), str(artifacts)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "DONE" in r.stdout, out[-4000:]
    for name in SCENES:
        png = artifacts / f"{name}.png"
        assert png.exists() and png.stat().st_size > 2000, name
    tooltip = next(line for line in r.stdout.splitlines() if line.startswith("TOOLTIP"))
    assert "serving layers 0-29" in tooltip
    footer = next(line for line in r.stdout.splitlines() if line.startswith("FOOTER"))
    assert "tokens/s" in footer and "1 stage" in footer
    answer = next(line for line in r.stdout.splitlines() if line.startswith("ANSWER"))
    assert "4" in answer.split("Swarm", 1)[-1], answer  # answered, not echoed
    error = next(line for line in r.stdout.splitlines() if line.startswith("ERROR_TOOLTIP"))
    assert "Sangama: error: " in error and "node.pem" in error
    box = next(line for line in r.stdout.splitlines() if line.startswith("ERROR_BOX"))
    assert "node.pem" in box  # the reason, from a real click on the icon
