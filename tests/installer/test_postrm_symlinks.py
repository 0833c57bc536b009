"""The Debian package's postrm purge runs as root in folders users control: it removes a
user's ~/.cache/sangama, and never follows a link a user planted to make root delete
something else. Run for real (as root, with a passwd list of test users), skipped
elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root"),
]

POSTRM = Path(__file__).resolve().parents[2] / "installers" / "linux" / "debian" / "postrm"
UID = 54321


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder the test users can reach (pytest's own are 0700, root's)."""
    path = Path(tempfile.mkdtemp(prefix="postrm-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run_purge(tmp_path: Path, homes: list[Path]) -> None:
    marker = tmp_path / "etc" / "sangama" / "purge-user-data"
    marker.parent.mkdir(parents=True)
    marker.touch()
    script = tmp_path / "postrm"
    text = POSTRM.read_text()
    assert "PURGE_MARKER=/etc/sangama/purge-user-data\n" in text
    script.write_text(
        text.replace("PURGE_MARKER=/etc/sangama/purge-user-data\n", f"PURGE_MARKER={marker}\n", 1)
    )
    script.chmod(0o755)
    fake = tmp_path / "bin"
    fake.mkdir()
    lines = "".join(f"user{i}:x:{UID}:{UID}::{home}:/bin/sh\\n" for i, home in enumerate(homes))
    (fake / "getent").write_text(f'#!/bin/sh\nprintf "{lines}"\n')
    (fake / "getent").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    subprocess.run([str(script), "purge"], env=env, check=True, timeout=60)
    assert not marker.exists()


def _home(tmp_path: Path, name: str) -> Path:
    home = tmp_path / name
    home.mkdir()
    os.chown(home, UID, UID)
    return home


def test_purge_removes_a_users_pieces_as_that_user(tmp_path: Path) -> None:
    home = _home(tmp_path, "alice")
    pieces = home / ".cache" / "sangama" / "pieces"
    pieces.mkdir(parents=True)
    (pieces / "blk.000.gguf").write_bytes(b"x")
    neighbour = home / ".cache" / "other-app"
    neighbour.mkdir()
    for path in (home / ".cache", home / ".cache" / "sangama", pieces, neighbour):
        os.chown(path, UID, UID)
    os.chown(pieces / "blk.000.gguf", UID, UID)
    _run_purge(tmp_path, [home])
    assert not (home / ".cache" / "sangama").exists()
    assert neighbour.exists()


def test_purge_never_follows_a_users_symlinks(tmp_path: Path) -> None:
    # Root's files a user points ~/.cache at: root's old `rm -rf "$home/.cache/sangama"`
    # deleted them through the link.
    victim = tmp_path / "system"
    (victim / "sangama").mkdir(parents=True)
    (victim / "sangama" / "precious").write_text("root's")
    linked_cache = _home(tmp_path, "mallory")
    (linked_cache / ".cache").symlink_to(victim)
    linked_home = tmp_path / "eve"
    linked_home.symlink_to(victim.parent / "system-home")
    (victim.parent / "system-home" / ".cache" / "sangama").mkdir(parents=True)
    (victim.parent / "system-home" / ".cache" / "sangama" / "keep").write_text("x")
    foreign = _home(tmp_path, "trudy")  # ~/.cache/sangama owned by someone else (root)
    (foreign / ".cache" / "sangama").mkdir(parents=True)
    os.chown(foreign / ".cache", UID, UID)
    _run_purge(tmp_path, [linked_cache, linked_home, foreign])
    assert (victim / "sangama" / "precious").read_text() == "root's"
    assert (victim.parent / "system-home" / ".cache" / "sangama" / "keep").exists()
    assert (foreign / ".cache" / "sangama").exists()
