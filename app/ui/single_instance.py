"""One `sangama-app` per user: a second start hands "show" to the first and exits.

Two apps under one user would run two stages with the same node id (one identity
folder), so the coordinator would see one node flapping between two addresses and the
volunteer two tray icons. The first app holds a lock file in the settings folder and
listens on a local socket named after that folder; a later start finds the lock taken,
tells the first one to come to the front, and leaves.

The lock (QLockFile: stale locks of dead processes are taken over) decides who is first;
the socket only carries the message. Checking the socket alone would race: two apps
started at once would both find nobody listening.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal, Slot
from PySide6.QtNetwork import QLocalServer, QLocalSocket

log = logging.getLogger(__name__)

LOCK_FILE = "sangama-app.lock"
SHOW = b"show\n"
CONNECT_TIMEOUT_MS = 1000
FIRST_START_WAIT_S = 10.0
"""How long a second start waits for a first one that holds the lock but is still
starting (not listening yet) before giving up on telling it."""


@dataclass(frozen=True)
class InstanceNames:
    lock_path: Path
    server_name: str


def instance_names(settings_dir: Path, user: str | None = None) -> InstanceNames:
    """The lock file and the socket name for one user's app with one settings folder.

    Short and free of path characters: a socket name becomes a file name under /tmp on
    Unix (at most ~100 bytes) and a pipe name on Windows."""
    who = user if user is not None else _user()
    digest = hashlib.sha256(f"{who}\0{settings_dir.resolve()}".encode()).hexdigest()[:16]
    return InstanceNames(settings_dir / LOCK_FILE, f"sangama-app-{digest}")


def is_show_request(data: bytes) -> bool:
    """What a second start sends: anything else on the socket is ignored."""
    return data.strip() == SHOW.strip()


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers): the home is unique
        return str(Path.home())


class SingleInstance(QObject):
    """The first app's side: holds the lock, listens, says `show_requested`."""

    show_requested = Signal()

    def __init__(self, names: InstanceNames, lock: QLockFile) -> None:
        super().__init__()
        self.names = names
        self._lock = lock
        self._server = QLocalServer(self)
        self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        QLocalServer.removeServer(names.server_name)  # a crashed first app's socket
        if not self._server.listen(names.server_name):
            log.warning("a second start cannot reach this app: %s", self._server.errorString())
        self._server.newConnection.connect(self._accept)

    @Slot()
    def _accept(self) -> None:
        # A second start writes one short line and leaves: read it here and be done,
        # keeping no connection (and no callbacks on a socket Qt may delete) around.
        while (sock := self._server.nextPendingConnection()) is not None:
            if not sock.bytesAvailable():
                sock.waitForReadyRead(CONNECT_TIMEOUT_MS)
            data = bytes(sock.readAll().data())
            sock.abort()
            sock.deleteLater()
            if is_show_request(data):
                log.info("another start of sangama-app: coming to the front")
                self.show_requested.emit()

    def release(self) -> None:
        self._server.close()
        self._lock.unlock()


def claim(settings_dir: Path) -> SingleInstance | None:
    """The SingleInstance if this is the first app of this user and settings folder;
    None after telling the running one to come to the front (the caller exits)."""
    names = instance_names(settings_dir)
    settings_dir.mkdir(parents=True, exist_ok=True)
    lock = QLockFile(str(names.lock_path))
    lock.setStaleLockTime(0)  # only a dead owner's lock is stale, never a slow one
    if lock.tryLock(0):
        return SingleInstance(names, lock)
    deadline = time.monotonic() + FIRST_START_WAIT_S
    while not tell_first(names.server_name):
        if time.monotonic() > deadline:
            log.warning("sangama-app is already running but did not answer")
            return None
        time.sleep(0.2)
    return None


def tell_first(server_name: str) -> bool:
    """Send "show" to the running app; False if nobody listens (yet)."""
    sock = QLocalSocket()
    sock.connectToServer(server_name)
    if not sock.waitForConnected(CONNECT_TIMEOUT_MS):
        return False
    sock.write(SHOW)
    sent = sock.waitForBytesWritten(CONNECT_TIMEOUT_MS)
    sock.disconnectFromServer()
    if sock.state() is not QLocalSocket.LocalSocketState.UnconnectedState:
        sock.waitForDisconnected(CONNECT_TIMEOUT_MS)
    return sent
