"""`sangama relay`: write coturn's configuration, run coturn as a child, say READY when it answers.

The relay is stock coturn (Debian package `coturn`; docs/architecture.md, "Links"); this
module only configures it (net/ice/turn.py renders every limit explicitly), supervises it and
reports. The shared secret the coordinator needs to derive TURN credentials lives in the run
directory, mode 0600.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import platformdirs

from app.cli.secret_args import TURN_SECRET_ENV, read_secret
from app.errors import AppError
from app.parent_watch import child_preexec
from app.ports import outward_host
from net.ice import turn
from net.ice.turn import RelayConfig

BINARY = "turnserver"
INSTALL_HINT = (
    "install coturn: `sudo apt-get install -y coturn`, then keep its system service off "
    "(`sudo systemctl disable --now coturn`): `sangama relay` runs its own instance"
)
SECRET_FILE = "turn-secret"
CONFIG_FILE = "turnserver.conf"
LOG_FILE = "turn.log"
PID_FILE = "turnserver.pid"
DB_FILE = "turndb"
OUTPUT_FILE = "turnserver.out"
"""coturn's own stdout/stderr (start-up complaints before its log file opens)."""

STUN_MAGIC = 0x2112A442
BINDING_REQUEST = 0x0001
BINDING_SUCCESS = 0x0101


class RelayError(AppError):
    """The relay could not be configured, started or kept running."""


def default_run_dir() -> Path:
    return Path(platformdirs.user_data_dir("sangama")) / "relay"


def find_turnserver() -> Path:
    """coturn's `turnserver` binary, or RelayError with the install hint."""
    # Debian puts it in /usr/bin; sbin too in case a distribution moves it off PATH.
    found = shutil.which(BINARY) or next(
        (p for p in ("/usr/bin/turnserver", "/usr/sbin/turnserver") if os.access(p, os.X_OK)),
        None,
    )
    if found is None:
        raise RelayError(f"coturn's `{BINARY}` is not installed; {INSTALL_HINT}")
    return Path(found)


def load_or_create_secret(run_dir: Path) -> str:
    """The relay's REST shared secret: generated once into RUN/turn-secret (0600)."""
    path = run_dir / SECRET_FILE
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        value = path.read_text(encoding="utf-8").strip()
        if not value:
            raise RelayError(f"{path} is empty; delete it to generate a new secret") from None
        return value
    value = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(value + "\n")
    return value


def relay_config(run_dir: Path, **fields: Any) -> RelayConfig:
    """A RelayConfig whose log, pid and database files live in `run_dir` (absolute paths)."""
    base = run_dir.resolve()
    files: dict[str, Any] = {
        "log_file": str(base / LOG_FILE),
        "pid_file": str(base / PID_FILE),
        "db_file": str(base / DB_FILE),
    }
    return RelayConfig(**{**files, **fields})


def advertised_host(cfg: RelayConfig) -> str:
    """The address nodes should dial: the public one if known, else where coturn listens."""
    if cfg.external_ip is not None:
        return cfg.external_ip
    if ipaddress.ip_address(cfg.listening_ip).is_unspecified:
        return cfg.relay_ip
    return cfg.listening_ip


# ---------------------------------------------------------------- STUN probe


def binding_request(transaction_id: bytes) -> bytes:
    """A bare STUN Binding request (RFC 8489 §5): type, length 0, magic cookie, id."""
    if len(transaction_id) != 12:
        raise ValueError("a STUN transaction id is 12 bytes")
    return struct.pack("!HHI", BINDING_REQUEST, 0, STUN_MAGIC) + transaction_id


def is_binding_success(data: bytes, transaction_id: bytes) -> bool:
    if len(data) < 20:
        return False
    kind, length, cookie = struct.unpack_from("!HHI", data)
    return (
        kind == BINDING_SUCCESS
        and cookie == STUN_MAGIC
        and data[8:20] == transaction_id
        and len(data) == 20 + length
    )


def probe_stun(host: str, port: int, timeout_s: float = 0.25) -> bool:
    """True when a STUN server answers a Binding request at host:port within timeout_s."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    transaction_id = secrets.token_bytes(12)
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.sendto(binding_request(transaction_id), (host, port))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                data, _ = sock.recvfrom(2048)
                if is_binding_success(data, transaction_id):
                    return True
        except OSError:  # timeout, or ICMP port unreachable surfacing as ECONNREFUSED
            return False
    return False


def _probe_host(cfg: RelayConfig) -> str:
    ip = ipaddress.ip_address(cfg.listening_ip)
    if ip.is_unspecified:
        return "::1" if ip.version == 6 else "127.0.0.1"
    return cfg.listening_ip


def _check_port_free(cfg: RelayConfig) -> None:
    # Else a relay already on the port would answer our probe and we would say READY
    # for a process that is about to die on "address in use".
    v6 = ipaddress.ip_address(cfg.listening_ip).version == 6
    family = socket.AF_INET6 if v6 else socket.AF_INET
    kinds = [socket.SOCK_DGRAM] + ([socket.SOCK_STREAM] if cfg.tcp_clients else [])
    for kind in kinds:
        with socket.socket(family, kind) as sock:
            if kind == socket.SOCK_STREAM:
                # As coturn does: lingering TIME_WAIT connections must not block a restart.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((cfg.listening_ip, cfg.port))
            except OSError as exc:
                proto = "UDP" if kind == socket.SOCK_DGRAM else "TCP"
                raise RelayError(
                    f"{proto} port {cfg.listening_ip}:{cfg.port} is unavailable ({exc}); "
                    "another relay (the coturn system service?) may hold it"
                ) from None


# ---------------------------------------------------------------- the child process


class RelayProcess:
    """A running coturn started by `start_relay`; stop() ends it (also on `with` exit)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], cfg: RelayConfig, run_dir: Path, config: Path
    ) -> None:
        self.proc = proc
        self.cfg = cfg
        self.run_dir = run_dir
        self.config_path = config

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def host(self) -> str:
        return advertised_host(self.cfg)

    @property
    def uri(self) -> str:
        """'turn:HOST:PORT' as printed on the READY line."""
        host = self.host
        return f"turn:[{host}]:{self.cfg.port}" if ":" in host else f"turn:{host}:{self.cfg.port}"

    @property
    def uris(self) -> tuple[str, ...]:
        """What a coordinator hands to nodes (RFC 7064/7065 forms)."""
        found = [turn.turn_uri(self.host, self.cfg.port, "udp")]
        if self.cfg.tcp_clients:
            found.append(turn.turn_uri(self.host, self.cfg.port, "tcp"))
        return (*found, turn.stun_uri(self.host, self.cfg.port))

    @property
    def ready_line(self) -> str:
        return f"READY {self.uri} realm={self.cfg.realm}"

    def running(self) -> bool:
        return self.proc.poll() is None

    def send_signal(self, signum: int) -> None:
        if self.running():
            self.proc.send_signal(signum)

    def wait(self, timeout_s: float | None = None) -> int:
        return self.proc.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> int:
        """SIGTERM (coturn shuts down cleanly on it), then SIGKILL after timeout_s."""
        if self.running():
            self.proc.terminate()
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(
            t for name in (OUTPUT_FILE, LOG_FILE) if (t := _tail(self.run_dir / name, lines))
        )

    def __enter__(self) -> RelayProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def write_config(cfg: RelayConfig, run_dir: Path) -> Path:
    """RUN/turnserver.conf, mode 0600: it holds the shared secret."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = run_dir / CONFIG_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file may have looser bits; O_CREAT's mode would not fix it
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(turn.render_turnserver_conf(cfg))
    return path


def start_relay(
    cfg: RelayConfig,
    run_dir: Path,
    *,
    binary: Path | None = None,
    ready_timeout_s: float = 10.0,
) -> RelayProcess:
    """Write the config into run_dir, start coturn, return once it answers STUN over UDP."""
    exe = binary or find_turnserver()
    _check_port_free(cfg)
    config = write_config(cfg, run_dir)
    out = open(run_dir / OUTPUT_FILE, "wb")  # noqa: SIM115 - handed to the child, closed below
    parent = os.getpid()
    try:
        proc = subprocess.Popen(
            [str(exe), "-c", str(config.resolve())],
            cwd=run_dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Own session: a terminal's Ctrl-C reaches only us, and we decide the shutdown.
            start_new_session=True,
            # ... and it still ends with us if we are killed (app/parent_watch.py).
            preexec_fn=(lambda: child_preexec(parent)) if sys.platform == "linux" else None,
        )
    finally:
        out.close()
    relay = RelayProcess(proc, cfg, run_dir, config)
    try:
        _await_stun(relay, ready_timeout_s)
    except BaseException:
        # Its own session shields coturn from our Ctrl-C: never leave it behind.
        relay.stop()
        raise
    return relay


def _await_stun(relay: RelayProcess, timeout_s: float) -> None:
    host, port = _probe_host(relay.cfg), relay.cfg.port
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not relay.running():
            raise RelayError(
                f"coturn exited with status {relay.proc.returncode} during start-up:\n"
                f"{relay.log_tail()}"
            )
        if probe_stun(host, port):
            return
        time.sleep(0.05)
    raise RelayError(
        f"coturn did not answer STUN on {host}:{port} within {timeout_s:g} s:\n{relay.log_tail()}"
    )


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------- the command


def add_relay_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `sangama relay` (app/cli/swarm_commands.py calls this on its subparser)."""
    p.add_argument("--dir", type=Path, default=None, help="run directory (default: data dir)")
    p.add_argument("--listen", default="0.0.0.0", help="address coturn listens on")
    p.add_argument("--port", type=int, default=turn.DEFAULT_TURN_PORT, help="STUN/TURN port")
    p.add_argument(
        "--relay-ip",
        default=None,
        help="address relayed packets leave from (default: --listen, or this machine's "
        "outward address when listening on all)",
    )
    p.add_argument("--external-ip", default=None, help="public address when behind a 1:1 NAT")
    p.add_argument("--min-port", type=int, default=turn.DEFAULT_MIN_PORT)
    p.add_argument("--max-port", type=int, default=turn.DEFAULT_MAX_PORT)
    p.add_argument("--realm", default=turn.DEFAULT_REALM)
    p.add_argument(
        "--secret-file",
        type=Path,
        default=None,
        help="file holding the REST shared secret (or set SANGAMA_TURN_SECRET; default: "
        "DIR/turn-secret, generated)",
    )
    p.add_argument(
        "--secret", default=None, help="deprecated: visible in ps; use the file or variable"
    )
    g = p.add_argument_group("limits (0 = unlimited)")
    g.add_argument("--user-quota", type=int, default=turn.DEFAULT_USER_QUOTA, help="per node")
    g.add_argument("--total-quota", type=int, default=turn.DEFAULT_TOTAL_QUOTA)
    g.add_argument(
        "--max-bps", type=int, default=turn.DEFAULT_MAX_BPS, help="bytes/s per allocation"
    )
    g.add_argument(
        "--bps-capacity", type=int, default=turn.DEFAULT_BPS_CAPACITY, help="bytes/s in all"
    )
    g.add_argument(
        "--stale-nonce",
        type=int,
        default=None,
        metavar="SECONDS",
        help="nonce lifetime (default: coturn's; 0 = never stale)",
    )
    g = p.add_argument_group("peers")
    g.add_argument(
        "--allow-private-peers",
        action="store_true",
        help="let allocations reach private, CGNAT and link-local ranges (LAN or lab swarms)",
    )
    g.add_argument(
        "--allow-peer",
        action="append",
        default=[],
        metavar="IP[-IP]",
        help="an exception to the denied ranges (repeatable)",
    )
    g.add_argument(
        "--allow-loopback-peers", action="store_true", help="tests and demos on one machine only"
    )
    p.add_argument("--no-tcp", action="store_true", help="no TURN-over-TCP listener")
    p.add_argument("--ready-timeout", type=float, default=10.0, help="seconds to wait for coturn")


def config_from_args(args: argparse.Namespace, run_dir: Path, secret: str) -> RelayConfig:
    relay_ip = args.relay_ip
    if relay_ip is None:
        unspecified = _is_unspecified(args.listen)
        relay_ip = outward_host() if unspecified else args.listen
    return relay_config(
        run_dir,
        listening_ip=args.listen,
        relay_ip=relay_ip,
        port=args.port,
        min_port=args.min_port,
        max_port=args.max_port,
        realm=args.realm,
        shared_secret=secret,
        user_quota=args.user_quota,
        total_quota=args.total_quota,
        max_bps=args.max_bps,
        bps_capacity=args.bps_capacity,
        allow_loopback_peers=args.allow_loopback_peers,
        deny_private_peers=not args.allow_private_peers,
        allowed_peer_ips=tuple(args.allow_peer),
        external_ip=args.external_ip,
        stale_nonce_s=args.stale_nonce,
        tcp_clients=not args.no_tcp,
    )


def _is_unspecified(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_unspecified
    except ValueError:
        return False  # RelayConfig reports the bad address with its own message


def run_relay_cli(args: argparse.Namespace) -> int:
    """Start coturn, print READY, and stop it on SIGINT/SIGTERM. 0 on a requested stop."""
    run_dir: Path = args.dir or default_run_dir()
    given = read_secret(args.secret, args.secret_file, TURN_SECRET_ENV, "--secret")
    secret = given or load_or_create_secret(run_dir)
    cfg = config_from_args(args, run_dir, secret)
    relay = start_relay(cfg, run_dir, ready_timeout_s=args.ready_timeout)
    try:
        print(relay.ready_line, flush=True)
        where = "as given" if given else f"in {run_dir / SECRET_FILE}"
        print(
            f"relay config {relay.config_path}, log {cfg.log_file}; shared secret {where} "
            "(the coordinator derives node credentials from it)",
            file=sys.stderr,
        )
        return supervise(relay)
    finally:
        # A Ctrl-C before supervise() took the signals over must not orphan coturn.
        relay.stop()


def supervise(relay: RelayProcess, grace_s: float = 5.0) -> int:
    """Wait on coturn; forward SIGINT/SIGTERM to it, SIGKILL it if it lingers past grace_s."""
    asked: list[float] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        asked.append(time.monotonic())
        relay.send_signal(signum)

    previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {
        s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        while True:
            try:
                code = relay.wait(0.5)
                break
            except subprocess.TimeoutExpired:
                if asked and time.monotonic() - asked[0] > grace_s:
                    relay.proc.kill()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if asked:
        return 0
    print(
        f"sangama relay: coturn exited on its own (status {code}):\n{relay.log_tail()}",
        file=sys.stderr,
    )
    return 1
