"""`sangama relay` against a real coturn on loopback, driven by a hand-written TURN client.

The client below speaks just enough STUN/TURN (RFC 8489 / RFC 8656) to allocate with
long-term credentials: Allocate -> 401 (realm, nonce) -> Allocate with USERNAME, REALM,
NONCE and MESSAGE-INTEGRITY keyed by MD5(username:realm:password). It shares no code with
the project, so a wrong credential derivation in net/ice/turn.py cannot hide behind it.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import secrets
import signal
import socket
import stat
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.cli.relay import (
    INSTALL_HINT,
    RelayError,
    RelayProcess,
    add_relay_arguments,
    find_turnserver,
    load_or_create_secret,
    probe_stun,
    relay_config,
    run_relay_cli,
    start_relay,
)
from net.ice.turn import (
    DEFAULT_NODE_TTL_S,
    DEFAULT_TOTAL_QUOTA,
    DEFAULT_USER_QUOTA,
    RelayConfig,
    make_credentials,
    node_credentials,
)
from tests.support.relay_proc import free_udp_tcp_port, loopback_config, relay_port_range

pytestmark = pytest.mark.integration

SECRET = "integration-shared-secret"
REALM = "relay.test"
USER_QUOTA = 2

MAGIC = 0x2112A442
ALLOCATE, REFRESH, CREATE_PERMISSION, CHANNEL_BIND = 0x0003, 0x0004, 0x0008, 0x0009
SUCCESS, ERROR = 0x0100, 0x0110
CHANNEL_NUMBER, USERNAME, MESSAGE_INTEGRITY = 0x000C, 0x0006, 0x0008
ERROR_CODE, LIFETIME = 0x0009, 0x000D
XOR_PEER_ADDRESS, REALM_ATTR, NONCE, XOR_RELAYED_ADDRESS = 0x0012, 0x0014, 0x0015, 0x0016
REQUESTED_TRANSPORT, FINGERPRINT = 0x0019, 0x8028
UDP = 17


def _coturn() -> Path:
    try:
        return find_turnserver()
    except RelayError as exc:
        pytest.skip(f"coturn cannot be used here: {exc}")


def _fake_turnserver(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "fake-turnserver"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return exe


def _loopback_config(run_dir: Path) -> RelayConfig:
    return loopback_config(run_dir, SECRET)


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    binary = _coturn()
    run_dir = tmp_path_factory.mktemp("relay")
    port = free_udp_tcp_port()
    low, high = relay_port_range(port)
    cfg = relay_config(
        run_dir,
        listening_ip="127.0.0.1",
        relay_ip="127.0.0.1",
        port=port,
        min_port=low,
        max_port=high,
        realm=REALM,
        shared_secret=SECRET,
        user_quota=USER_QUOTA,
        total_quota=20,
        max_bps=1_000_000,
        bps_capacity=20_000_000,  # room for all 20 (coturn reserves max_bps each)
        allow_loopback_peers=True,  # the peers below are on loopback, like the nodes in tests
        deny_private_peers=True,
    )
    proc = start_relay(cfg, run_dir, binary=binary)
    try:
        yield proc
    finally:
        proc.stop()


# ---------------------------------------------------------------- a minimal TURN client


@dataclass(frozen=True)
class Reply:
    kind: int
    attrs: dict[int, bytes]
    raw: bytes

    @property
    def error_code(self) -> int | None:
        value = self.attrs.get(ERROR_CODE)
        return None if value is None else (value[2] & 0x07) * 100 + value[3]


def _attr(kind: int, value: bytes) -> bytes:
    return struct.pack("!HH", kind, len(value)) + value + b"\0" * (-len(value) % 4)


def _message(method: int, attrs: bytes, txid: bytes, key: bytes | None) -> bytes:
    if key is None:
        return struct.pack("!HHI", method, len(attrs), MAGIC) + txid + attrs
    # MESSAGE-INTEGRITY covers the header with a length that already counts itself (24 bytes).
    header = struct.pack("!HHI", method, len(attrs) + 24, MAGIC) + txid
    mac = hmac.new(key, header + attrs, hashlib.sha1).digest()
    return header + attrs + _attr(MESSAGE_INTEGRITY, mac)


def _parse(data: bytes) -> Reply:
    kind, length, cookie = struct.unpack_from("!HHI", data)
    assert cookie == MAGIC and len(data) == 20 + length
    attrs: dict[int, bytes] = {}
    at = 20
    while at < len(data):
        a, n = struct.unpack_from("!HH", data, at)
        attrs.setdefault(a, data[at + 4 : at + 4 + n])
        at += 4 + n + (-n % 4)
    return Reply(kind, attrs, data)


def _integrity_ok(reply: Reply, key: bytes) -> bool:
    at = 20
    while at < len(reply.raw):
        a, n = struct.unpack_from("!HH", reply.raw, at)
        if a == MESSAGE_INTEGRITY:
            header = bytearray(reply.raw[:20])
            struct.pack_into("!H", header, 2, at - 20 + 24)
            mac = hmac.new(key, bytes(header) + reply.raw[20:at], hashlib.sha1).digest()
            return hmac.compare_digest(mac, reply.raw[at + 4 : at + 24])
        at += 4 + n + (-n % 4)
    return False


def _xor_address(value: bytes) -> tuple[str, int]:
    family, xport = struct.unpack_from("!xBH", value)
    assert family == 0x01, "IPv4 expected on loopback"
    ip = struct.unpack_from("!I", value, 4)[0] ^ MAGIC
    return socket.inet_ntoa(struct.pack("!I", ip)), xport ^ (MAGIC >> 16)


def _xor_peer(ip: str, port: int) -> bytes:
    raw = struct.unpack("!I", socket.inet_aton(ip))[0] ^ MAGIC
    return struct.pack("!xBHI", 0x01, port ^ (MAGIC >> 16), raw)


class TurnClient:
    """One UDP 5-tuple to the relay: at most one allocation, as RFC 8656 has it."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.server = server
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(2.0)
        self.realm = b""
        self.nonce = b""
        self.key: bytes | None = None
        self.username = b""

    def close(self) -> None:
        # Allocations outlive their socket on the relay; release ours so quotas stay clean.
        if self.key is not None:
            self.request(REFRESH, _attr(LIFETIME, struct.pack("!I", 0)))
        self.sock.close()

    def request(self, method: int, attrs: bytes, signed: bool = True) -> tuple[Reply, bytes]:
        txid = secrets.token_bytes(12)
        if signed:
            attrs += _attr(USERNAME, self.username) + _attr(REALM_ATTR, self.realm)
            attrs += _attr(NONCE, self.nonce)
        message = _message(method, attrs, txid, self.key if signed else None)
        for _ in range(3):  # UDP: retransmit, though loopback does not lose packets
            self.sock.sendto(message, self.server)
            try:
                while True:
                    data, _ = self.sock.recvfrom(4096)
                    if data[8:20] == txid:
                        return _parse(data), txid
            except TimeoutError:
                continue
        raise AssertionError(f"no answer from the relay at {self.server}")

    def allocate(self, username: str, password: str) -> tuple[Reply, bytes]:
        transport = _attr(REQUESTED_TRANSPORT, bytes([UDP, 0, 0, 0]))
        first, _ = self.request(ALLOCATE, transport, signed=False)
        assert first.kind == ALLOCATE | ERROR and first.error_code == 401, first
        self.realm, self.nonce = first.attrs[REALM_ATTR], first.attrs[NONCE]
        self.username = username.encode()
        self.key = hashlib.md5(
            self.username + b":" + self.realm + b":" + password.encode()
        ).digest()
        return self.request(ALLOCATE, transport + _attr(LIFETIME, struct.pack("!I", 600)))

    def permit(self, ip: str, port: int = 9) -> Reply:
        reply, _ = self.request(CREATE_PERMISSION, _attr(XOR_PEER_ADDRESS, _xor_peer(ip, port)))
        return reply

    def bind_channel(self, channel: int, ip: str, port: int = 9) -> Reply:
        attrs = _attr(CHANNEL_NUMBER, struct.pack("!HH", channel, 0))
        reply, _ = self.request(CHANNEL_BIND, attrs + _attr(XOR_PEER_ADDRESS, _xor_peer(ip, port)))
        return reply


@pytest.fixture
def client(relay: RelayProcess) -> Iterator[TurnClient]:
    c = TurnClient(("127.0.0.1", relay.cfg.port))
    try:
        yield c
    finally:
        c.close()


def _credentials(node_id: str, now: float | None = None, ttl_s: int = 600) -> tuple[str, str]:
    c = make_credentials(SECRET, node_id, ttl_s, time.time() if now is None else now, ())
    return c.username, c.password


# ---------------------------------------------------------------- the relay


def test_ready_line_names_the_relay(relay: RelayProcess) -> None:
    assert relay.running()
    assert relay.ready_line == f"READY turn:127.0.0.1:{relay.cfg.port} realm={REALM}"
    assert probe_stun("127.0.0.1", relay.cfg.port)
    assert stat.S_IMODE(relay.config_path.stat().st_mode) == 0o600  # it holds the secret


def test_valid_credentials_get_an_allocation(relay: RelayProcess, client: TurnClient) -> None:
    reply, _ = client.allocate(*_credentials("node-valid"))
    assert reply.kind == ALLOCATE | SUCCESS, reply.error_code
    assert client.key is not None and _integrity_ok(reply, client.key)
    ip, port = _xor_address(reply.attrs[XOR_RELAYED_ADDRESS])
    assert ip == "127.0.0.1"
    assert relay.cfg.min_port <= port <= relay.cfg.max_port


def test_wrong_password_is_refused(client: TurnClient) -> None:
    username, password = _credentials("node-wrong")
    forged = ("A" if password[0] != "A" else "B") + password[1:]
    reply, _ = client.allocate(username, forged)
    assert reply.kind == ALLOCATE | ERROR and reply.error_code == 401


def test_credentials_for_another_secret_are_refused(client: TurnClient) -> None:
    c = make_credentials("not-the-relay-secret", "node-other", 600, time.time(), ())
    reply, _ = client.allocate(c.username, c.password)
    assert reply.kind == ALLOCATE | ERROR and reply.error_code == 401


def test_expired_credentials_are_refused(client: TurnClient) -> None:
    # A true HMAC over a username whose expiry passed an hour ago.
    username, password = _credentials("node-expired", now=time.time() - 3600, ttl_s=60)
    reply, _ = client.allocate(username, password)
    assert reply.kind == ALLOCATE | ERROR and reply.error_code == 401


def test_user_quota_is_enforced(relay: RelayProcess) -> None:
    username, password = _credentials("node-quota")
    clients = [TurnClient(("127.0.0.1", relay.cfg.port)) for _ in range(USER_QUOTA + 1)]
    try:
        replies = [c.allocate(username, password)[0] for c in clients]
    finally:
        for c in clients:
            c.close()
    assert [r.kind for r in replies[:USER_QUOTA]] == [ALLOCATE | SUCCESS] * USER_QUOTA
    assert replies[-1].kind == ALLOCATE | ERROR and replies[-1].error_code == 486


@pytest.mark.parametrize("peer", ["10.1.2.3", "192.168.1.20", "172.20.0.5", "100.64.3.4"])
def test_private_peers_are_refused(client: TurnClient, peer: str) -> None:
    assert client.allocate(*_credentials(f"node-{peer}"))[0].kind == ALLOCATE | SUCCESS
    reply = client.permit(peer)
    assert reply.kind == CREATE_PERMISSION | ERROR and reply.error_code == 403


def test_a_channel_to_a_private_peer_is_refused_and_the_allocation_survives(
    client: TurnClient,
) -> None:
    # The failure in docs/architecture.md ("Links"): aioice bound a channel to a peer's
    # private address, coturn's send there failed and the allocation died. Denied, the bind
    # is a 403 and nothing is sent.
    assert client.allocate(*_credentials("node-channels"))[0].kind == ALLOCATE | SUCCESS
    refused = client.bind_channel(0x4000, "192.168.1.20")
    assert refused.kind == CHANNEL_BIND | ERROR and refused.error_code == 403
    assert client.bind_channel(0x4001, "127.0.0.1").kind == CHANNEL_BIND | SUCCESS
    assert client.bind_channel(0x4002, "127.0.0.1", 10).kind == CHANNEL_BIND | SUCCESS


def test_loopback_peers_are_allowed_when_testing(client: TurnClient) -> None:
    assert client.allocate(*_credentials("node-loop"))[0].kind == ALLOCATE | SUCCESS
    assert client.permit("127.0.0.1").kind == CREATE_PERMISSION | SUCCESS


# ---------------------------------------------------------------- lifecycle and the command


def test_stop_ends_coturn_and_frees_the_port(tmp_path: Path) -> None:
    binary = _coturn()
    cfg = _loopback_config(tmp_path)
    port = cfg.port
    with start_relay(cfg, tmp_path, binary=binary) as relay:
        try:
            start_relay(cfg, tmp_path / "second", binary=binary)
        except RelayError as exc:
            assert "unavailable" in str(exc)  # the port is taken: no second coturn
        else:
            pytest.fail("a second relay started on a taken port")
    assert not relay.running()
    assert not probe_stun("127.0.0.1", port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", port))


def test_a_failed_start_reports_coturns_complaint(tmp_path: Path) -> None:
    fake = _fake_turnserver(tmp_path, 'echo "CONFIG ERROR: cannot parse option" >&2; exit 3')
    with pytest.raises(RelayError, match=r"status 3(.|\n)*CONFIG ERROR: cannot parse option"):
        start_relay(_loopback_config(tmp_path / "run"), tmp_path / "run", binary=fake)


def test_a_silent_relay_is_stopped_after_the_ready_timeout(tmp_path: Path) -> None:
    fake = _fake_turnserver(tmp_path, "echo $$ > pid; exec sleep 30")
    run = tmp_path / "run"
    with pytest.raises(RelayError, match="did not answer STUN"):
        start_relay(_loopback_config(run), run, binary=fake, ready_timeout_s=0.5)
    assert not _alive(int((run / "pid").read_text()))


def test_missing_binary_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda _name: None)
    monkeypatch.setattr("os.access", lambda *_a: False)
    with pytest.raises(RelayError, match="apt-get install -y coturn"):
        find_turnserver()
    assert "systemctl disable" in INSTALL_HINT


def test_secret_is_generated_once_and_private(tmp_path: Path) -> None:
    first = load_or_create_secret(tmp_path / "run")
    assert len(first) >= 32
    assert stat.S_IMODE((tmp_path / "run" / "turn-secret").stat().st_mode) == 0o600
    assert load_or_create_secret(tmp_path / "run") == first


def test_cli_prints_ready_and_stops_on_sigterm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _coturn()
    port = free_udp_tcp_port()
    low, high = relay_port_range(port)
    parser = argparse.ArgumentParser()
    add_relay_arguments(parser)
    args = parser.parse_args(
        [
            "--dir",
            str(tmp_path),
            "--listen",
            "127.0.0.1",
            "--port",
            str(port),
            "--min-port",
            str(low),
            "--max-port",
            str(high),
            "--allow-loopback-peers",
            "--stale-nonce",
            "600",
        ]
    )

    default = signal.getsignal(signal.SIGTERM)

    def stop_when_ready() -> None:
        # Signal only once run_relay_cli has taken SIGTERM over, or it would end pytest.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and signal.getsignal(signal.SIGTERM) is default:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_when_ready, daemon=True)
    stopper.start()
    assert run_relay_cli(args) == 0
    stopper.join(5)
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"READY turn:127.0.0.1:{port} realm=sangama"]
    assert "turn-secret" in out.err
    assert "stale-nonce=600" in (tmp_path / "turnserver.conf").read_text()
    assert not probe_stun("127.0.0.1", port)
    pid = int((tmp_path / "turnserver.pid").read_text().strip() or 0)
    assert pid == 0 or not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); ask ps whether it has really gone.
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return bool(state.stdout.strip()) and not state.stdout.strip().startswith("Z")


def test_with_the_default_limits_one_member_cannot_take_every_allocation(tmp_path: Path) -> None:
    # coturn reserves max-bps out of bps-capacity per allocation: the old defaults admitted
    # ten allocations in all, and one node asking the coordinator before each allocation
    # (a new username each time) took every one. Now a node keeps one username per window
    # (node_credentials), its user quota holds, and another node still gets a relay.
    binary = _coturn()
    cfg = _loopback_config(tmp_path)  # the default quotas and bandwidth
    assert (cfg.user_quota, cfg.total_quota) == (DEFAULT_USER_QUOTA, DEFAULT_TOTAL_QUOTA)
    now = time.time()
    hog: list[TurnClient] = []
    with start_relay(cfg, tmp_path, binary=binary) as relay:
        try:
            granted = 0
            for i in range(DEFAULT_USER_QUOTA + 12):
                c = node_credentials(SECRET, "node-hog", DEFAULT_NODE_TTL_S, now + i, ())
                hog.append(TurnClient(("127.0.0.1", relay.cfg.port)))
                reply, _ = hog[-1].allocate(c.username, c.password)
                granted += reply.kind == ALLOCATE | SUCCESS
            assert granted == DEFAULT_USER_QUOTA
            other = node_credentials(SECRET, "node-other", DEFAULT_NODE_TTL_S, now, ())
            hog.append(TurnClient(("127.0.0.1", relay.cfg.port)))
            reply, _ = hog[-1].allocate(other.username, other.password)
            assert reply.kind == ALLOCATE | SUCCESS, reply.error_code
        finally:
            for turn_client in hog:
                turn_client.close()
