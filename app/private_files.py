"""Files only the user may read: chat history, identity secrets, API keys.

A volunteer's PC may have other accounts, and a default umask (022) makes new files
world-readable (0644) in world-listable folders (0755). What this app keeps about its
user is private: folders 0700, files 0600, from their creation on (never created open and
narrowed afterwards, which leaves a moment in which another user can open them). Folders
made before this rule are narrowed when next used, where the user owns them.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: Path) -> Path:
    """`path` as a folder only its owner can enter (made with its parents if missing)."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    info = path.stat()
    mine = hasattr(os, "getuid") and info.st_uid == os.getuid()
    if mine and stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(PRIVATE_DIR)
    return path


def write_private(path: Path, data: str | bytes) -> Path:
    """Write `path` whole and atomically, mode 0600, in a private folder."""
    private_dir(path.parent)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    # mkstemp makes the file 0600 from the start; replace keeps that mode.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
