"""A real coturn on loopback (`sangama relay`'s config) that a test or the soak kills with
SIGKILL and starts again on the same port, as a supervisor restarts a crashed relay.

    relay = LoopbackRelay.start(tmp_path / "relay")      # raises RelayError without coturn
    coord = CoordinatorProcess.start(..., extra_args=relay.coordinator_args(tmp_path))
    relay.kill(); relay.restart()                          # or: await relay.restart_async()
    relay.stop()

coturn is started with a parent-death signal (app/parent_watch.py), and Linux sends it
when the *thread* that forked it ends, not the process. So a restart runs on the calling
thread (`restart`, for a test's main thread) or on this helper's own single thread, which
lives until `stop` (`restart_async`, for an event loop that must not block on coturn's
STUN answer).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from app.cli.relay import RelayError, RelayProcess, find_turnserver, relay_config, start_relay
from net.ice.turn import RelayConfig

SECRET = "loopback-relay-secret"


def free_udp_tcp_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.1 (coturn listens on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = int(u.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port")


def relay_port_range(port: int) -> tuple[int, int]:
    """The range coturn allocates relayed ports from: 1000 ports not holding `port`."""
    low = 42000 if not 42000 <= port <= 42999 else 43000
    return low, low + 999


def loopback_config(run_dir: Path, secret: str = SECRET, **fields: Any) -> RelayConfig:
    port = free_udp_tcp_port()
    low, high = relay_port_range(port)
    base: dict[str, Any] = {
        "listening_ip": "127.0.0.1",
        "relay_ip": "127.0.0.1",
        "port": port,
        "min_port": low,
        "max_port": high,
        "shared_secret": secret,
        "allow_loopback_peers": True,  # the nodes are on loopback
    }
    return relay_config(run_dir, **{**base, **fields})


class LoopbackRelay:
    def __init__(self, cfg: RelayConfig, run_dir: Path, binary: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.binary = binary
        self.processes: list[RelayProcess] = []
        """Every coturn started, the running one last."""
        self.restart_errors: list[str] = []
        """What a restart retried on (the TCP port lingering a moment after a kill)."""
        self._thread: ThreadPoolExecutor | None = None

    @classmethod
    def start(cls, run_dir: Path, secret: str = SECRET, **fields: Any) -> LoopbackRelay:
        """Start coturn on a free loopback port (RelayError if coturn cannot be used)."""
        binary = find_turnserver()
        run_dir.mkdir(parents=True, exist_ok=True)
        relay = cls(loopback_config(run_dir, secret, **fields), run_dir, binary)
        relay.processes.append(start_relay(relay.cfg, run_dir, binary=binary))
        return relay

    @property
    def port(self) -> int:
        return self.cfg.port

    @property
    def current(self) -> RelayProcess:
        return self.processes[-1]

    @property
    def up(self) -> bool:
        return bool(self.processes) and self.current.running()

    def coordinator_args(self, secret_dir: Path) -> list[str]:
        """`sangama coordinator` arguments that hand out this relay's TURN credentials."""
        secret_file = secret_dir / "turn-secret"
        secret_file.write_text(self.cfg.shared_secret + "\n")
        return ["--turn", f"127.0.0.1:{self.port}", "--turn-secret-file", str(secret_file)]

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, every allocation gone."""
        self.current.send_signal(signal.SIGKILL)
        self.current.wait()

    def restart(self, attempts: int = 40) -> None:
        """Start coturn again on the same port and config (on this thread)."""
        for _ in range(attempts):
            try:
                self.processes.append(start_relay(self.cfg, self.run_dir, binary=self.binary))
                return
            except RelayError as exc:
                self.restart_errors.append(str(exc))
                time.sleep(0.25)
        raise RelayError(f"coturn did not start again: {self.restart_errors[-1:]}")

    async def restart_async(self) -> None:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="relay-starter")
        await asyncio.get_running_loop().run_in_executor(self._thread, self.restart)

    def stop(self) -> None:
        for p in self.processes:
            p.stop()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
