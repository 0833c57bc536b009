"""A throwaway PostgreSQL server for tests: initdb in a temp dir, started on a free port."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; the Debian package provides a postgres user.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextmanager
def temporary_postgres() -> Iterator[str]:
    """Yield a SQLAlchemy URL of a fresh, empty PostgreSQL server; stop it afterwards."""
    bindir = postgres_bin()
    if bindir is None:
        raise FileNotFoundError("PostgreSQL server binaries not found (apt-get install postgresql)")
    # Not under pytest's tmp dir: that is private to root, and the server runs as postgres.
    base = Path(tempfile.mkdtemp(prefix="sangama-pg-"))
    data = base / "pgdata"
    sock = base / "pgsock"
    data.mkdir(parents=True)
    sock.mkdir()
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        shutil.chown(data, "postgres")
        shutil.chown(sock, "postgres")
    subprocess.run(
        _as_postgres([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
        check=True,
        capture_output=True,
    )
    port = _free_port()
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        _as_postgres(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                opts,
                "-w",
                "-l",
                str(base / "pg.log"),
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)
