"""A real `sangama coordinator` in a subprocess, for tests that need the whole HTTPS server.

    with CoordinatorProcess.start(tmp_path / "coord", model_path, password="pw") as coord:
        coord.admin.post("/api/v1/invites", json={"role": "worker"})

The process is started as `python -m app.cli coordinator ...`, the helper waits for its
`READY https://HOST:PORT ca=FINGERPRINT` line, and stops it with SIGTERM (SIGKILL if it
does not go). `AdminApi` calls the operator API with the admin bearer token that the
coordinator wrote to DATA/admin-token, verifying TLS against DATA/ca/ca.pem.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

from app.cli.secret_args import ADMIN_PASSWORD_ENV
from app.parent_watch import PARENT_WATCH_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_PREFIX = "READY "


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class AdminApi:
    """The operator API of one coordinator, authenticated with its admin token."""

    def __init__(self, base_url: str, data_dir: Path, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.data_dir = data_dir
        self.timeout = timeout
        self.ca_path = data_dir / "ca" / "ca.pem"
        self.session = requests.Session()
        token = (data_dir / "admin-token").read_text().strip()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def request(self, method: str, path: str, **kw: Any) -> Any:
        """Call the API; raise for a non-2xx answer (with the server's message); return JSON."""
        kw.setdefault("timeout", self.timeout)
        # Per request, not session.verify: requests lets REQUESTS_CA_BUNDLE override the latter.
        kw.setdefault("verify", str(self.ca_path))
        r = self.session.request(method, f"{self.base_url}{path}", **kw)
        if not r.ok:
            raise requests.HTTPError(f"{method} {path} -> {r.status_code}: {r.text}", response=r)
        return r.json() if r.content else None

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)

    def swarm(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/api/v1/swarm")
        return result

    def create_invite(
        self, role: str = "worker", uses: int = 1, expires: str = "1h"
    ) -> dict[str, Any]:
        body = {"role": role, "uses": uses, "expires": expires}
        result: dict[str, Any] = self.post("/api/v1/invites", json=body)
        return result

    def close(self) -> None:
        self.session.close()


@dataclass
class CoordinatorProcess:
    proc: subprocess.Popen[str]
    data_dir: Path
    url: str
    ca_fingerprint: str
    password: str
    _lines: deque[str] = field(default_factory=lambda: deque(maxlen=400))
    _admin: AdminApi | None = None

    @property
    def ca_path(self) -> Path:
        return self.data_dir / "ca" / "ca.pem"

    @property
    def admin(self) -> AdminApi:
        if self._admin is None:
            self._admin = AdminApi(self.url, self.data_dir)
        return self._admin

    def output(self) -> str:
        """What the process printed so far (stdout and stderr, the last few hundred lines)."""
        return "".join(self._lines)

    @classmethod
    def start(
        cls,
        data_dir: Path,
        model: Path | str,
        *,
        password: str = "operator-pw",
        min_stages: int = 1,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        timeout: float = 120.0,
        env: dict[str, str] | None = None,
        cut_pieces: bool = True,
    ) -> CoordinatorProcess:
        port = port or free_port(host)
        data_dir.mkdir(parents=True, exist_ok=True)
        if not cut_pieces:
            seed_pieces(data_dir, model)
        cmd = [
            sys.executable,
            "-m",
            "app.cli",
            "coordinator",
            "--host",
            host,
            "--port",
            str(port),
            "--data",
            str(data_dir),
            "--model",
            str(model),
            "--min-stages",
            str(min_stages),
            *extra_args,
        ]
        # Its stdin is a pipe nobody writes to: when this process ends, however it ends
        # (a bench stopped with SIGTERM runs no finally), the coordinator reads EOF and
        # stops itself (app/parent_watch.py) instead of running on, orphaned.
        watch = {PARENT_WATCH_ENV: "1"}
        # The password by environment, not argument: a command line is public (ps).
        secret = {ADMIN_PASSWORD_ENV: password}
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **watch, **secret, **(env or {})}
        proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=full_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        lines: deque[str] = deque(maxlen=400)
        ready: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(READY_PREFIX):
                    ready.put(line.strip())
            ready.put("")  # end of output: the process is gone

        threading.Thread(target=pump, name=f"coordinator-{port}-output", daemon=True).start()
        try:
            line = ready.get(timeout=timeout)
        except queue.Empty:
            _stop(proc)
            raise RuntimeError(
                f"coordinator printed no READY line in {timeout:.0f} s:\n{''.join(lines)}"
            ) from None
        if not line:
            _stop(proc)
            raise RuntimeError(f"coordinator exited with {proc.returncode}:\n{''.join(lines)}")
        url, _, rest = line[len(READY_PREFIX) :].partition(" ")
        fingerprint = rest.removeprefix("ca=")
        return cls(proc, data_dir, url, fingerprint, password, lines)

    def stop(self, timeout: float = 15.0) -> int:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        return _stop(self.proc, timeout)

    def __enter__(self) -> CoordinatorProcess:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()


def seed_pieces(data_dir: Path, model: Path | str) -> None:
    """Put the model's pieces, cut once per machine in the user cache (as LocalSwarm and
    `stage_files` keep them), where the coordinator looks first (DATA/models), so it starts
    without cutting the model again: the cut reads and rewrites the whole GGUF (Gemma's
    embedding alone is 176 MiB). For tests about what
    comes after the start; the cut itself is tested in tests/unit and by coordinators
    started with cut_pieces=True."""
    from core.models import resolve_model, sliced_model

    pieces, _manifest = sliced_model(resolve_model(str(model)))
    target = data_dir / "models" / pieces.name
    if not target.exists():
        # A copy, not links: nothing the coordinator does can touch the shared cache.
        shutil.copytree(pieces, target, ignore=shutil.ignore_patterns("stages"))


def wait_settled(
    coord: CoordinatorProcess, n_stages: int, n_spares: int, timeout: float = 240.0
) -> None:
    """Until the plan has its stages and spares and every stage serves its layers (twice
    in a row, a heartbeat apart): a spare joining late may re-order the chain first."""
    deadline = time.monotonic() + timeout
    good = 0
    while time.monotonic() < deadline:
        swarm = coord.admin.swarm()
        serving = {n["node_id"]: n["n_layers"] for n in swarm["nodes"]}
        ok = (
            len(swarm["plan"]) == n_stages
            and len(swarm["spares"]) == n_spares
            and all(
                serving.get(s["node_id"]) == s["layers"][1] - s["layers"][0] for s in swarm["plan"]
            )
        )
        good = good + 1 if ok else 0
        if good >= 2:
            return
        time.sleep(1.0)
    raise AssertionError(f"the swarm did not settle: {coord.admin.swarm()}")


def _stop(proc: subprocess.Popen[str], timeout: float = 15.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    return proc.returncode
