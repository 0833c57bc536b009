"""A clean Debian 12 system in a folder, for installing the package the way a user would.

The base system comes from mmdebstrap (variant minbase, from this machine's Debian mirrors)
and is cached as a tarball under ~/.cache/sangama/debian-root/, named after the day and a
digest of the mirror list and the extra packages, so reruns unpack it in seconds and a new
day starts from current packages. Each test unpacks a fresh copy. Downloaded .debs are kept
in the same cache (bind-mounted over the root's /var/cache/apt/archives): apt still
resolves every dependency itself, it just does not fetch the same file twice.

The root shares this machine's network (loopback reaches a coordinator running outside)
and its X server (/tmp/.X11-unix is bind-mounted).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
SUITE = "bookworm"
# What a desktop user has that minbase lacks: the passwd tools for a user account.
EXTRA_PACKAGES = ("passwd",)
USER = "volunteer"
UID = 1000


class RootError(RuntimeError):
    """Making, entering or cleaning the Debian root failed."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sangama" / "debian-root"


def base_tarball(today: dt.date | None = None) -> Path:
    """The cached minbase tarball for today, made with mmdebstrap when missing."""
    if shutil.which("mmdebstrap") is None:
        raise RootError("needs mmdebstrap (apt-get install mmdebstrap)")
    sources = SOURCES.read_bytes() if SOURCES.exists() else b"deb.debian.org"
    digest = hashlib.sha256(sources + ",".join(EXTRA_PACKAGES).encode()).hexdigest()[:12]
    day = (today or dt.date.today()).strftime("%Y%m%d")
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    tar = cache / f"{SUITE}-minbase-{day}-{digest}.tar"
    if tar.exists():
        return tar
    for old in cache.glob(f"{SUITE}-minbase-*.tar"):
        old.unlink()
    tmp = tar.with_suffix(".partial.tar")
    mirrors = [str(SOURCES)] if SOURCES.exists() else []
    cmd = [
        "mmdebstrap",
        "--variant=minbase",
        "--quiet",
        f"--include={','.join(EXTRA_PACKAGES)}",
        SUITE,
        str(tmp),
        *mirrors,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RootError(f"mmdebstrap failed: {r.stderr[-2000:]}")
    tmp.replace(tar)
    return tar


@dataclass
class DebianRoot:
    """An unpacked root with /proc, /dev, the X socket and the apt cache mounted."""

    path: Path
    mounts: list[Path] = field(default_factory=list)

    @classmethod
    @contextlib.contextmanager
    def unpacked(cls, tarball: Path, where: Path) -> Iterator[DebianRoot]:
        where.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarball) as tf:
            tf.extractall(where, filter="fully_trusted")  # a root: devices, setuid, owners
        root = cls(where)
        try:
            root._mount_all()
            yield root
        finally:
            root.unmount_all()

    def _bind(self, source: Path, target: str, *extra: str) -> None:
        dest = self.path / target.lstrip("/")
        dest.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            ["mount", *extra, "--bind", str(source), str(dest)], capture_output=True, text=True
        )
        if r.returncode != 0:
            raise RootError(f"mount {source} on {dest}: {r.stderr.strip()}")
        self.mounts.append(dest)

    def _mount_all(self) -> None:
        proc = self.path / "proc"
        proc.mkdir(exist_ok=True)
        r = subprocess.run(
            ["mount", "-t", "proc", "proc", str(proc)], capture_output=True, text=True
        )
        if r.returncode != 0:
            raise RootError(f"mount proc: {r.stderr.strip()}")
        self.mounts.append(proc)
        self._bind(Path("/dev"), "/dev")
        self._bind(Path("/dev/pts"), "/dev/pts")
        self._bind(Path("/dev/shm"), "/dev/shm")
        self._bind(Path("/tmp/.X11-unix"), "/tmp/.X11-unix")
        archives = cache_root() / "archives"
        (archives / "partial").mkdir(parents=True, exist_ok=True)
        self._bind(archives, "/var/cache/apt/archives")
        shutil.copy("/etc/resolv.conf", self.path / "etc" / "resolv.conf")
        # keep what apt downloads: the cache above is shared between runs
        (self.path / "etc/apt/apt.conf.d/99sangama-keep").write_text(
            'Binary::apt::APT::Keep-Downloaded-Packages "true";\n'
        )

    def unmount_all(self) -> None:
        for target in reversed(self.mounts):
            subprocess.run(["umount", "--lazy", str(target)], capture_output=True)
        self.mounts.clear()

    def run(
        self,
        cmd: Sequence[str],
        user: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 600,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            self.command(cmd, user, env), capture_output=True, text=True, timeout=timeout
        )
        if check and r.returncode != 0:
            raise RootError(
                f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            )
        return r

    def command(
        self, cmd: Sequence[str], user: str | None = None, env: dict[str, str] | None = None
    ) -> list[str]:
        """`chroot ROOT env -i ... CMD`: nothing of this machine's environment leaks in."""
        home = f"/home/{user}" if user else "/root"
        base = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": home,
            "LANG": "C.UTF-8",
            "DEBIAN_FRONTEND": "noninteractive",
            **(env or {}),
        }
        spec = [f"--userspec={user}:{user}"] if user else []
        return [
            "chroot",
            *spec,
            str(self.path),
            "env",
            "-i",
            *(f"{k}={v}" for k, v in base.items()),
            *cmd,
        ]

    def add_user(self, name: str = USER, uid: int = UID) -> Path:
        self.run(["useradd", "--create-home", "--uid", str(uid), "--shell", "/bin/sh", name])
        return self.path / "home" / name

    def files_of(self, package: str) -> list[str]:
        return self.run(["dpkg", "-L", package]).stdout.split()
