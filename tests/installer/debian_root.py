"""A clean Debian system in a folder (12 "bookworm" or 13 "trixie"), for installing the
package the way a user would.

The base system comes from mmdebstrap (variant minbase, from the Debian mirrors this
machine's apt uses, with the suite's own release, updates and security archives) and is
cached as a tarball under ~/.cache/sangama/debian-root/, named after the suite, the day and
a digest of the mirror list and the extra packages, so reruns unpack it in seconds and a new
day starts from current packages. Each test unpacks a fresh copy. Downloaded .debs are kept
in the same cache, one folder per suite (bind-mounted over the root's
/var/cache/apt/archives): apt still resolves every dependency itself, it just does not fetch
the same file twice.

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
SUITES = ("bookworm", "trixie")  # Debian 12 and 13
DEBIAN_URI = "http://deb.debian.org/debian"
SECURITY_URI = "http://deb.debian.org/debian-security"
# What a desktop user has that minbase lacks: the passwd tools for a user account.
EXTRA_PACKAGES = ("passwd",)
USER = "volunteer"
UID = 1000


class RootError(RuntimeError):
    """Making, entering or cleaning the Debian root failed."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sangama" / "debian-root"


def mirror_uris() -> tuple[str, str]:
    """The Debian archive and security archive this machine's apt uses (deb822 sources)."""
    archive, security = DEBIAN_URI, SECURITY_URI
    text = SOURCES.read_text() if SOURCES.exists() else ""
    for line in text.splitlines():
        if line.startswith("URIs:"):
            uri = line.split(":", 1)[1].strip().split()[0]
            if uri.rstrip("/").endswith("-security"):
                security = uri
            else:
                archive = uri
    return archive, security


def mirror_lines(suite: str) -> list[str]:
    """One-line sources for `suite`: the release, its updates and its security archive.

    Written out rather than passing this machine's sources file, which names its own
    release's suites (a trixie root from a bookworm host needs trixie's)."""
    archive, security = mirror_uris()
    return [
        f"deb {archive} {suite} main",
        f"deb {archive} {suite}-updates main",
        f"deb {security} {suite}-security main",
    ]


def base_tarball(suite: str = "bookworm", today: dt.date | None = None) -> Path:
    """The cached minbase tarball of `suite` for today, made with mmdebstrap when missing."""
    if suite not in SUITES:
        raise RootError(f"unknown suite {suite!r} (one of {', '.join(SUITES)})")
    if shutil.which("mmdebstrap") is None:
        raise RootError("needs mmdebstrap (apt-get install mmdebstrap)")
    mirrors = mirror_lines(suite)
    digest = hashlib.sha256(
        "\n".join(mirrors).encode() + ",".join(EXTRA_PACKAGES).encode()
    ).hexdigest()[:12]
    day = (today or dt.date.today()).strftime("%Y%m%d")
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    tar = cache / f"{suite}-minbase-{day}-{digest}.tar"
    if tar.exists():
        return tar
    for old in cache.glob(f"{suite}-minbase-*.tar"):
        old.unlink()
    tmp = tar.with_suffix(".partial.tar")
    cmd = [
        "mmdebstrap",
        "--variant=minbase",
        "--quiet",
        f"--include={','.join(EXTRA_PACKAGES)}",
        suite,
        str(tmp),
        *mirrors,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RootError(f"mmdebstrap {suite} failed: {r.stderr[-2000:]}")
    tmp.replace(tar)
    return tar


@dataclass
class DebianRoot:
    """An unpacked root with /proc, /dev, the X socket and the apt cache mounted."""

    path: Path
    suite: str = "bookworm"
    mounts: list[Path] = field(default_factory=list)

    @classmethod
    @contextlib.contextmanager
    def unpacked(cls, tarball: Path, where: Path, suite: str = "bookworm") -> Iterator[DebianRoot]:
        where.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarball) as tf:
            tf.extractall(where, filter="fully_trusted")  # a root: devices, setuid, owners
        root = cls(where, suite)
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
        # one folder per suite: bookworm's and trixie's .debs share names but not builds
        archives = cache_root() / "archives" / self.suite
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
