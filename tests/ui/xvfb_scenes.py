"""Run under a real X server with a tray host (see test_xvfb_screens.py): the real app,
a real coordinator serving the default model (SmolLM2 135M Instruct), this app joining
it, serving every layer (and the notification saying so), answering a question in the
chat window, its settings, then an error shown from a click on the icon.
Screenshots of each scene go to the folder given as argv[1].

Prints `SCENE name path` per screenshot and `DONE` at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from app.node_status import ServeState
from app.ui.first_run_flow import serving_notice
from app.ui.history import History
from app.ui.settings import Settings
from app.ui.tray import DesktopApp
from coordinator import invites as inv
from core.models import default_model_path
from tests.support.coordinator_proc import CoordinatorProcess


def pump(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QApplication.processEvents()
        time.sleep(0.02)


def wait_until(what: str, pred: Callable[[], bool], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        QApplication.processEvents()
        time.sleep(0.02)


def shoot(out: Path, name: str, crop: tuple[int, int, int, int] | None = None) -> None:
    path = out / f"{name}.png"
    args = ["import", "-window", "root"]
    if crop is not None:
        x, y, w, h = crop
        args += ["-crop", f"{w}x{h}+{max(0, x)}+{max(0, y)}", "+repage"]
    subprocess.run([*args, str(path)], check=True, timeout=30)
    print(f"SCENE {name} {path}", flush=True)


def window_crop(widget: object, margin: int = 12) -> tuple[int, int, int, int]:
    g = widget.frameGeometry()  # type: ignore[attr-defined]
    return (g.x() - margin, g.y() - margin, g.width() + 2 * margin, g.height() + 2 * margin)


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sangama-ui-"))
    coord = CoordinatorProcess.start(work / "coordinator", default_model_path(), min_stages=1)
    try:
        good = coord.admin.create_invite("worker")["code"]
        decoded = inv.InviteCode.decode(good)
        forged = inv.InviteCode(decoded.coordinator, decoded.ca_fingerprint, "nope").encode()

        app = QApplication(sys.argv[:1])
        app.setQuitOnLastWindowClosed(False)
        wait_until("a system tray", QSystemTrayIcon.isSystemTrayAvailable, 10)
        desk = DesktopApp(
            Settings(),
            settings_dir=work / "settings",
            identity_dir=work / "identity",
            history=History(work / "chats"),
        )
        assert desk.tray is not None
        pump(1.5)  # let the tray host take the icon

        # 1. the tray menu, opened by a real right click on the icon
        centre = desk.tray.geometry().center()
        print(f"tray icon at {centre.x()},{centre.y()}", flush=True)
        subprocess.run(
            ["xdotool", "mousemove", str(centre.x()), str(centre.y()), "click", "3"], check=True
        )
        wait_until("the tray menu", desk.menu.isVisible, 10)
        pump(0.5)
        shoot(out, "tray_menu_full")
        g = desk.menu.geometry()
        shoot(out, "tray_menu", (g.x() - 40, g.y() - 40, g.width() + 200, g.height() + 80))
        desk.menu.hide()
        pump(0.3)

        # 2. join dialog: a refused code, then the good one
        dialog = desk.open_join()
        dialog.move(QPoint(120, 80))
        dialog.code.setText(forged)
        dialog.join_button.click()
        wait_until("the refusal", lambda: "did not accept" in dialog.result_label.text(), 30)
        pump(0.5)
        shoot(out, "join_dialog_refused", window_crop(dialog))
        dialog.code.setText(good)
        dialog.result_label.setText(" ")
        pump(0.5)
        shoot(out, "join_dialog", window_crop(dialog))
        dialog.join_button.click()
        wait_until(
            "serving",
            lambda: desk.node.status.state is ServeState.SERVING,
            150,
        )

        # 2b. the notification the first-run wizard gives when serving starts (same call)
        desk.notify(*serving_notice(desk.node.status))
        pump(1.5)
        shoot(out, "serving_notification")

        # 3. chat through the swarm this PC now serves
        chat = desk.open_chat()
        chat.move(QPoint(60, 40))
        chat.prompt.setPlainText("What is 2 + 2?")
        chat.greedy.setChecked(True)  # the same answer every run: the test reads it
        chat.max_tokens.setValue(60)  # the model stops at its end of turn well before
        done: list[object] = []
        desk.chat.finished.connect(done.append)
        desk.chat.failed.connect(done.append)
        chat.send()
        wait_until("the answer", lambda: bool(done), 120)
        pump(0.5)
        print(f"ANSWER {chat.transcript.toPlainText()!r}", flush=True)
        print(f"FOOTER {chat.footer.text()}", flush=True)
        shoot(out, "chat_window", window_crop(chat))
        chat.hide()

        # 4. status after the chat (sessions, timings, throughput plot)
        status = desk.open_status()
        status.move(QPoint(200, 60))
        pump(4.5)  # two heartbeats
        shoot(out, "status_window", window_crop(status))

        print(f"TOOLTIP {desk.tray.toolTip()}", flush=True)
        status.hide()

        # 5. settings: memory cap, start on login, coordinator (the invite's as a hint),
        # the local API port, logs
        settings = desk.open_settings()
        settings.move(QPoint(160, 90))
        pump(0.5)
        shoot(out, "settings_dialog", window_crop(settings))
        settings.reject()

        # 6. an error and its reason, one click on the icon away: paused, the identity's
        # certificate goes missing, resume fails
        desk.toggle_pause()
        wait_until("paused", lambda: desk.node.status.state is ServeState.PAUSED, 60)
        (work / "identity" / "node.pem").unlink()
        desk.toggle_pause()
        wait_until("the error", lambda: desk.node.status.state is ServeState.ERROR, 30)
        print(f"ERROR_TOOLTIP {desk.tray.toolTip()}", flush=True)
        centre = desk.tray.geometry().center()
        subprocess.run(
            ["xdotool", "mousemove", str(centre.x()), str(centre.y()), "click", "1"], check=True
        )
        wait_until("the error message", lambda: desk.error_box is not None, 10)
        box = desk.error_box
        assert box is not None
        wait_until("the error message shown", box.isVisible, 10)
        box.move(QPoint(240, 200))
        pump(0.5)
        print(f"ERROR_BOX {box.informativeText()}", flush=True)
        shoot(out, "error_message", window_crop(box))

        # 7. a clean Quit
        desk.quit()
        pump(0.5)
        print("DONE", flush=True)
        return 0
    finally:
        coord.stop()


if __name__ == "__main__":
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb")
    raise SystemExit(main())
