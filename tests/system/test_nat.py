"""Three workers and a client, each behind its own home router; the coordinator and the
coturn relay on the "public" side. Cone NAT: peers punch through (no relay). Symmetric
NAT: the relay carries the links. Every hop forced through the relay gives the same
tokens as the direct run. Bad TURN credentials are refused.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from coordinator.server.store import Node, Store
from tests.system.topology import PUBLIC_IP, Topology, home_routers, missing_requirements

_why = missing_requirements() or (None if shutil.which("turnserver") else "coturn is not installed")
# .ci/run installs everything; only a bare developer machine skips, and says why.
pytestmark = [pytest.mark.system, pytest.mark.skipif(_why is not None, reason=str(_why))]

TURN_PORT = 3478
COORD_PORT = 8443
PROMPT = "The three primary colors are"


def _ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, "-m", "app.cli", *args]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _wait_ready(proc: subprocess.Popen[str], what: str, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"{what} exited before it was ready (rc={proc.poll()})")
        if line.startswith("READY"):
            return line.strip()
    raise AssertionError(f"{what} not ready after {timeout:.0f} s")


def _relay(topo: Topology, run_dir: Path, secret: str) -> subprocess.Popen[str]:
    """`sangama relay` (coturn) on the public side, wait for READY."""
    args = [
        "relay",
        "--dir",
        str(run_dir),
        "--listen",
        PUBLIC_IP,
        "--relay-ip",
        PUBLIC_IP,
        "--port",
        str(TURN_PORT),
        "--secret",
        secret,
        "--no-tcp",
    ]
    proc = subprocess.Popen(
        _ns(topo.public, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
    )
    _wait_ready(proc, "relay")
    return proc


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture(scope="module")
def model(gemma_path: Path) -> Path:
    # The default model: the client needs a real tokenizer (tiny test models have none).
    return gemma_path


@dataclass
class Swarm:
    """A running relay, coordinator and three workers, and a client identity (home 4)."""

    topo: Topology
    wd: Path
    data: Path

    def chat_command(self, max_tokens: int) -> list[str]:
        return _ns(
            self.topo.homes[3].host,
            "chat",
            "--identity",
            str(self.wd / "client"),
            "--prompt",
            PROMPT,
            "--raw",
            "--max-tokens",
            str(max_tokens),
        )

    def chat(self, max_tokens: int) -> tuple[str, str]:
        """The client's answer and its whole output (tokens/s, timing table)."""
        chat = subprocess.run(
            self.chat_command(max_tokens),
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=180,
        )
        assert chat.returncode == 0, chat.stderr[-2000:]
        return chat.stdout.split("\n\n")[0], chat.stdout

    def paths(self) -> dict[str, str]:
        """The path each worker reported for its link to the next stage."""
        time.sleep(5)  # two heartbeats: each worker reports its next-hop path
        store = Store(f"sqlite:///{self.data / 'coordinator.db'}")
        with store.session() as s:
            paths = {n.node_id: n.path for n in s.query(Node).filter(Node.role == "worker")}
        store.close()
        return paths


@contextmanager
def swarm_up(topo: Topology, wd: Path, model: Path, relay_only: bool) -> Iterator[Swarm]:
    """Run relay, coordinator, 3 workers (homes 1-3) and join a client (home 4)."""
    procs: list[subprocess.Popen[str]] = []
    secret = wd / "turn-secret"
    secret.write_text("system-test-secret\n")
    try:
        relay = _relay(topo, wd / "relay", "system-test-secret")
        procs.append(relay)
        data = wd / "coordinator"
        coord = subprocess.Popen(
            _ns(
                topo.public,
                "coordinator",
                "--host",
                PUBLIC_IP,
                "--port",
                str(COORD_PORT),
                "--data",
                str(data),
                "--model",
                str(model),
                "--min-stages",
                "3",
                "--admin-password",
                "pw",
                "--turn",
                f"{PUBLIC_IP}:{TURN_PORT}",
                "--turn-secret-file",
                str(secret),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(),
        )
        procs.append(coord)
        _wait_ready(coord, "coordinator")
        url = f"https://{PUBLIC_IP}:{COORD_PORT}"

        def invite(role: str) -> str:
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "app.cli",
                    "invite",
                    "create",
                    "--role",
                    role,
                    "--data",
                    str(data),
                    "--coordinator",
                    url,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            return r.stdout.strip().splitlines()[-1]

        workers = []
        for home in topo.homes[:3]:
            args = [
                "worker",
                "--join",
                invite("worker"),
                "--identity-dir",
                str(wd / home.host),
                "--listen",
                f"{home.lan_ip}:7000",
            ]
            w = subprocess.Popen(
                _ns(home.host, *args, *(["--relay-only"] if relay_only else [])),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=child_env(),
            )
            procs.append(w)
            workers.append(w)
        for i, w in enumerate(workers):
            _wait_ready(w, f"worker {i}", timeout=180)
        subprocess.run(
            _ns(topo.homes[3].host, "join", invite("client"), "--identity", str(wd / "client")),
            check=True,
            capture_output=True,
            text=True,
            env=child_env(),
        )
        yield Swarm(topo, wd, data)
    finally:
        _stop(procs)


def run_swarm(
    topo: Topology, wd: Path, model: Path, relay_only: bool, max_tokens: int = 8
) -> tuple[str, dict[str, str], str]:
    """One chat through a fresh swarm: the answer, each worker's next-hop path, the output."""
    with swarm_up(topo, wd, model, relay_only) as swarm:
        answer, output = swarm.chat(max_tokens)
        return answer, swarm.paths(), output


@pytest.fixture(scope="module")
def direct_cone(
    model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    with home_routers(["cone"] * 4) as topo:
        yield run_swarm(topo, tmp_path_factory.mktemp("cone"), model, relay_only=False)[:2]


def test_cone_nat_links_are_punched_not_relayed(direct_cone: tuple[str, dict[str, str]]) -> None:
    answer, paths = direct_cone
    assert answer.strip()
    kinds = sorted(paths.values())
    # Two links between stages (the last stage has no next hop and reports "direct").
    assert kinds.count("relayed") == 0, paths
    assert kinds.count("punched") >= 2, paths


def test_symmetric_nat_falls_back_to_the_relay(
    model: Path, tmp_path: Path, direct_cone: tuple[str, dict[str, str]]
) -> None:
    with home_routers(["symmetric"] * 4) as topo:
        answer, paths, _ = run_swarm(topo, tmp_path, model, relay_only=False)
    assert sorted(paths.values()).count("relayed") >= 2, paths
    assert answer == direct_cone[0]


def test_every_hop_through_the_relay_gives_the_same_tokens(
    model: Path, tmp_path: Path, direct_cone: tuple[str, dict[str, str]]
) -> None:
    with home_routers(["cone"] * 4) as topo:
        answer, paths, _ = run_swarm(topo, tmp_path, model, relay_only=True)
    assert sorted(paths.values()).count("relayed") >= 2, paths
    assert answer == direct_cone[0]


def cut_worker_paths(topo: Topology) -> None:
    """Each worker home's router drops everything to and from the other worker homes:
    punched paths between workers die; the relay and the client's links still work."""
    workers = topo.homes[:3]
    for home in workers:
        ex = topo.exec_prefix(home.router)
        for other in workers:
            if other is home:
                continue
            for flag in ("-s", "-d"):
                subprocess.run(
                    [*ex, "iptables", "-I", "FORWARD", flag, other.wan_ip, "-j", "DROP"],
                    check=True,
                    capture_output=True,
                )


def test_dead_punched_paths_fall_back_to_the_relay_mid_generation(
    model: Path, tmp_path: Path
) -> None:
    """Links between workers are punched; mid-answer those paths die. Each link is
    re-established through the relay and the answer goes on, the same as uncut."""
    n = 48
    with home_routers(["cone"] * 4) as topo, swarm_up(topo, tmp_path, model, False) as swarm:
        uncut, _ = swarm.chat(n)
        before = swarm.paths()
        chat = subprocess.Popen(
            swarm.chat_command(n),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
            bufsize=0,  # read(1) must not buffer ahead of communicate()
        )
        assert chat.stdout is not None
        streamed = b""
        while len(streamed) < 12:  # a few tokens in: the session is running
            byte = chat.stdout.read(1)
            assert byte, f"chat ended early: {chat.stderr.read() if chat.stderr else b''!r}"
            streamed += byte
        cut_worker_paths(topo)
        out, err = chat.communicate(timeout=180)
        assert chat.returncode == 0, err.decode(errors="replace")[-2000:]
        answer = (streamed + out).decode().split("\n\n")[0]
        after = swarm.paths()
    assert sorted(before.values()).count("punched") >= 2, before
    assert answer == uncut
    assert sorted(after.values()).count("relayed") >= 2, after


def _allocate(server: tuple[str, int], username: str, password: str) -> int:
    """A TURN Allocate with long-term credentials; return the final STUN message type."""
    import hashlib
    import hmac

    def msg(mtype: int, attrs: bytes, tid: bytes) -> bytes:
        return struct.pack("!HHI12s", mtype, len(attrs), 0x2112A442, tid) + attrs

    def attr(atype: int, value: bytes) -> bytes:
        pad = (4 - len(value) % 4) % 4
        return struct.pack("!HH", atype, len(value)) + value + b"\0" * pad

    def parse(data: bytes) -> tuple[int, dict[int, bytes]]:
        mtype, length = struct.unpack("!HH", data[:4])
        out, i = {}, 20
        while i < 20 + length:
            t, n = struct.unpack("!HH", data[i : i + 4])
            out[t] = data[i + 4 : i + 4 + n]
            i += 4 + n + (4 - n % 4) % 4
        return mtype, out

    transport = attr(0x0019, bytes([17, 0, 0, 0]))  # REQUESTED-TRANSPORT: UDP
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        s.sendto(msg(0x0003, transport, os.urandom(12)), server)
        _, attrs = parse(s.recv(2048))
        realm, nonce = attrs[0x0014], attrs[0x0015]
        key = hashlib.md5(f"{username}:{realm.decode()}:{password}".encode()).digest()
        body = (
            transport + attr(0x0006, username.encode()) + attr(0x0014, realm) + attr(0x0015, nonce)
        )
        tid = os.urandom(12)
        head = struct.pack("!HHI12s", 0x0003, len(body) + 24, 0x2112A442, tid)
        mac = hmac.new(key, head + body, hashlib.sha1).digest()
        s.sendto(msg(0x0003, body + attr(0x0008, mac), tid), server)
        mtype, _ = parse(s.recv(2048))
        return mtype


def test_turn_refuses_wrong_and_expired_credentials(tmp_path: Path) -> None:
    from net.turn import make_credentials

    with home_routers(["cone"]) as topo:
        relay = _relay(topo, tmp_path / "relay", "s3cret")
        try:
            good = make_credentials("s3cret", "w1", 600, time.time(), ())
            expired = make_credentials("s3cret", "w1", 60, time.time() - 3600, ())
            probe = (
                "import sys; sys.path.insert(0, '.');"
                "from tests.system.test_nat import _allocate;"
                f"print(_allocate(('{PUBLIC_IP}', {TURN_PORT}), sys.argv[1], sys.argv[2]))"
            )
            home = topo.homes[0].host

            def allocate(user: str, pw: str) -> int:
                r = subprocess.run(
                    ["ip", "netns", "exec", home, sys.executable, "-c", probe, user, pw],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=str(Path(__file__).parents[2]),
                )
                return int(r.stdout.strip())

            assert allocate(good.username, good.password) == 0x0103  # Allocate success
            assert allocate(good.username, "wrong-password") == 0x0113  # Allocate error
            assert allocate(expired.username, expired.password) == 0x0113
        finally:
            _stop([relay])
