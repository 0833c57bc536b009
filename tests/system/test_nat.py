"""Three workers and a client, each behind its own home router; the coordinator and the
coturn relay on the "public" side. Cone NAT: peers punch through (no relay). Symmetric
NAT: the relay carries the links. Every hop forced through the relay gives the same
tokens as the direct run. Bad TURN credentials are refused.

One cone swarm serves the direct run and then the mid-generation cut (which leaves it
relayed, so it comes right after); the symmetric and the relay-only runs need swarms of
their own. Paths are read as soon as the heartbeats report them, not after a fixed sleep.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
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
PATHS_TIMEOUT_S = 30.0
"""How long to wait for the workers' heartbeats to report the paths a test asserts (they
beat every 2 s; the path of a link is reported once the link is up)."""

Paths = dict[str, str]


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


def _drain(proc: subprocess.Popen[str], log: Path) -> None:
    """Copy a child's output after READY to `log`: a child whose pipe nobody reads blocks
    once the pipe is full, and the log says what a failed test's workers did."""

    def copy() -> None:
        assert proc.stdout is not None
        with log.open("a") as f:
            for line in proc.stdout:
                f.write(line)
                f.flush()

    threading.Thread(target=copy, daemon=True).start()


def count(paths: Paths, kind: str) -> int:
    return sorted(paths.values()).count(kind)


def _secret_file(run_dir: Path, secret: str) -> Path:
    path = run_dir / "given-secret"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path


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
        "--secret-file",
        str(_secret_file(run_dir, secret)),
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
    _drain(proc, run_dir / "sangama-relay.log")
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
def model(smollm2_path: Path) -> Path:
    # A real model with a tokenizer (the client needs one; tiny test models have none).
    # SmolLM2, not Gemma: these tests are about the links, and Gemma's 262k-token
    # vocabulary makes every start parse a huge GGUF header (first stage, client) in Python.
    return smollm2_path


@dataclass
class Swarm:
    """A running relay, coordinator and three workers, and a client identity (home 4)."""

    topo: Topology
    wd: Path
    data: Path
    procs: list[subprocess.Popen[str]]

    def stop(self) -> None:
        """Stop the swarm's processes now (the topology stays until its fixture ends)."""
        _stop(self.procs)

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

    def paths(self) -> Paths:
        """The path each worker last reported for its link to the next stage."""
        store = Store(f"sqlite:///{self.data / 'coordinator.db'}")
        with store.session() as s:
            paths = {n.node_id: n.path for n in s.query(Node).filter(Node.role == "worker")}
        store.close()
        return paths

    def paths_once(self, reported: Callable[[Paths], bool]) -> Paths:
        """The workers' paths as soon as `reported` holds for them (each worker reports its
        next-hop path with its heartbeat), or as they are after PATHS_TIMEOUT_S: the
        caller asserts on them either way. Polls instead of sleeping a fixed time."""
        deadline = time.monotonic() + PATHS_TIMEOUT_S
        while True:
            paths = self.paths()
            if reported(paths) or time.monotonic() > deadline:
                return paths
            time.sleep(0.25)


@contextmanager
def swarm_up(
    topo: Topology, wd: Path, model: Path, relay_only: bool, slices: Path
) -> Iterator[Swarm]:
    """Run relay, coordinator, 3 workers (homes 1-3) and join a client (home 4).

    `slices` keeps the coordinator's cut of the model between swarms (hard links): the
    coordinator reuses a cut whose manifest it finds (core.models.sliced_model), as a
    restarted coordinator does, so only the first swarm pays for slicing."""
    procs: list[subprocess.Popen[str]] = []
    secret = wd / "turn-secret"
    secret.write_text("system-test-secret\n")
    try:
        relay = _relay(topo, wd / "relay", "system-test-secret")
        procs.append(relay)
        data = wd / "coordinator"
        if any(slices.iterdir()):
            shutil.copytree(slices, data / "models", copy_function=os.link)
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
        _drain(coord, wd / "coordinator.log")
        if not any(slices.iterdir()):
            shutil.copytree(data / "models", slices, dirs_exist_ok=True, copy_function=os.link)
        url = f"https://{PUBLIC_IP}:{COORD_PORT}"

        def invite(role: str, uses: int = 1) -> str:
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "app.cli",
                    "invite",
                    "create",
                    "--role",
                    role,
                    "--uses",
                    str(uses),
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
        code = invite("worker", uses=3)  # one code for the three: one CLI start, not three
        for home in topo.homes[:3]:
            args = [
                "worker",
                "--join",
                code,
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
        # The client joins while the workers load their stages (it needs only the
        # coordinator), then the workers' READY lines are awaited together.
        subprocess.run(
            _ns(topo.homes[3].host, "join", invite("client"), "--identity", str(wd / "client")),
            check=True,
            capture_output=True,
            text=True,
            env=child_env(),
        )
        for i, w in enumerate(workers):
            _wait_ready(w, f"worker {i}", timeout=180)
            _drain(w, wd / f"worker-{i}.log")
        yield Swarm(topo, wd, data, procs)
    finally:
        _stop(procs)


def relayed_links(paths: Paths) -> bool:
    return count(paths, "relayed") >= 2


def punched_links(paths: Paths) -> bool:
    return count(paths, "punched") >= 2


def run_swarm(
    topo: Topology,
    wd: Path,
    model: Path,
    relay_only: bool,
    slices: Path,
    reported: Callable[[Paths], bool],
    max_tokens: int = 8,
) -> tuple[str, Paths, str]:
    """One chat through a fresh swarm: the answer, each worker's next-hop path (once
    `reported` holds, or as they are after PATHS_TIMEOUT_S), the output."""
    with swarm_up(topo, wd, model, relay_only, slices) as swarm:
        answer, output = swarm.chat(max_tokens)
        return answer, swarm.paths_once(reported), output


@pytest.fixture(scope="module")
def slices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slices")


@pytest.fixture(scope="module")
def cone_swarm(
    model: Path, slices: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Swarm]:
    """One cone-NAT swarm for the direct run and, last, for the mid-generation cut (which
    asks for `direct_cone` first, so the direct run is always taken before the cut)."""
    wd = tmp_path_factory.mktemp("cone")
    with home_routers(["cone"] * 4) as topo, swarm_up(topo, wd, model, False, slices) as swarm:
        yield swarm


@pytest.fixture(scope="module")
def direct_cone(cone_swarm: Swarm) -> tuple[str, Paths]:
    answer, _ = cone_swarm.chat(8)
    return answer, cone_swarm.paths_once(punched_links)


def test_cone_nat_links_are_punched_not_relayed(direct_cone: tuple[str, Paths]) -> None:
    answer, paths = direct_cone
    assert answer.strip()
    # Two links between stages (the last stage has no next hop and reports "direct").
    assert count(paths, "relayed") == 0, paths
    assert count(paths, "punched") >= 2, paths


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
    cone_swarm: Swarm, direct_cone: tuple[str, Paths]
) -> None:
    """Links between workers are punched; mid-answer those paths die. Each link is
    re-established through the relay and the answer goes on, the same as uncut.
    Runs on the direct run's swarm, right after it (the cut leaves that swarm relayed):
    the punched links are minutes younger here than after the other swarms' tests."""
    n = 48
    swarm = cone_swarm
    try:
        uncut, _ = swarm.chat(n)
        before = swarm.paths_once(punched_links)
        chat = subprocess.Popen(
            swarm.chat_command(n),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
            bufsize=0,  # read(1) must not buffer ahead of communicate()
        )
        try:
            assert chat.stdout is not None
            streamed = b""
            while len(streamed) < 12:  # a few tokens in: the session is running
                byte = chat.stdout.read(1)
                assert byte, f"chat ended early: {chat.stderr.read() if chat.stderr else b''!r}"
                streamed += byte
            cut_worker_paths(swarm.topo)
            out, err = chat.communicate(timeout=180)
        finally:  # a failed assertion or a timeout above must not leave the chat running
            if chat.poll() is None:
                chat.kill()
                chat.communicate()
        assert chat.returncode == 0, err.decode(errors="replace")[-2000:]
        answer = (streamed + out).decode().split("\n\n")[0]
        after = swarm.paths_once(relayed_links)
    finally:
        swarm.stop()  # cut, the swarm serves no other test: free the CPU for the next ones
    assert count(before, "punched") >= 2, before
    assert answer == uncut
    assert count(after, "relayed") >= 2, after


def test_symmetric_nat_falls_back_to_the_relay(
    model: Path, slices: Path, tmp_path: Path, direct_cone: tuple[str, Paths]
) -> None:
    with home_routers(["symmetric"] * 4) as topo:
        answer, paths, _ = run_swarm(topo, tmp_path, model, False, slices, relayed_links)
    assert count(paths, "relayed") >= 2, paths
    assert answer == direct_cone[0]


def test_every_hop_through_the_relay_gives_the_same_tokens(
    model: Path, slices: Path, tmp_path: Path, direct_cone: tuple[str, Paths]
) -> None:
    with home_routers(["cone"] * 4) as topo:
        answer, paths, _ = run_swarm(topo, tmp_path, model, True, slices, relayed_links)
    assert count(paths, "relayed") >= 2, paths
    assert answer == direct_cone[0]


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
    from net.ice.turn import make_credentials

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
