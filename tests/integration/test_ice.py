"""QUIC over ICE paths (net.ice.paths; docs/architecture.md, "Links"), and the TURN findings
behind net/ice/paths.py.

aioice ignores loopback addresses, so the peers need others: as root, a fixture makes a
veth pair with 10.203.0.1 and 10.203.0.2 (and an "unreachable" route for 10.203.77.0/24,
a private network no relay can reach) and removes them afterwards. Two IceSessions in one
process swap offers directly, then QUIC (net.quic.links.connect with the ICE path; the server
side through QuicServer.accept over the other ICE path) carries data both ways.

With coturn installed (`turnserver`), a private coturn on 10.203.0.1 with REST
shared-secret credentials serves the relayed cases: relay-only, the relay-only retry
after a default-policy failure, the allocation coturn 4.6.1 drops after one unroutable
send (the "438 Wrong nonce, then 400" in docs/architecture.md), and the pairing fix that avoids it.

The fake TURN server test needs neither root nor coturn: it shows aioice's TURN client
takes the nonce of a 438 answer, retries with it and signs later requests with it.
Only contents, orders and reasons are asserted, never how fast anything was.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from aioice import stun, turn

from net import auth, wire
from net.channel import Channel, ChannelServer, NodeCredentials, connect_channel
from net.ice.paths import (
    POLICY_ALL,
    POLICY_RELAY,
    IceConfig,
    IceOffer,
    IceSession,
    establish,
)
from net.quic.links import QuicLink, QuicServer, QuicTuning, connect

pytestmark = pytest.mark.integration

PATIENCE_S = 10.0
"""How long to wait before calling a test failed; never an expectation of speed."""
IFACE_A, IFACE_B = "sgm-ice0", "sgm-ice1"
ADDR_A, ADDR_B = "10.203.0.1", "10.203.0.2"
UNROUTABLE_NET = "10.203.77.0/24"
UNROUTABLE_PEER = ("10.203.77.5", 9)
SERVER_ID, CLIENT_ID = "stage1", "client1"
TUNING = QuicTuning(idle_timeout=PATIENCE_S, keepalive=0)


def run(coro_fn: Callable[[], Coroutine[Any, Any, None]], bound: float = PATIENCE_S * 3) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coro_fn(), bound)

    asyncio.run(bounded())


async def within(aw: Any, timeout: float = PATIENCE_S) -> Any:
    return await asyncio.wait_for(aw, timeout)


def free_udp_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- the test network


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def test_net() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("needs root: ICE ignores loopback, so the test makes a veth pair")
    if shutil.which("ip") is None:
        pytest.skip("needs the `ip` tool (iproute2) to make the test veth pair")
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("link", "del", IFACE_A)  # left over by a killed run
    try:
        _ip("link", "add", IFACE_A, "type", "veth", "peer", "name", IFACE_B)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a veth pair: {exc.stderr.decode().strip()}")
    try:
        _ip("addr", "add", f"{ADDR_A}/24", "dev", IFACE_A)
        _ip("addr", "add", f"{ADDR_B}/24", "dev", IFACE_B)
        _ip("link", "set", IFACE_A, "up")
        _ip("link", "set", IFACE_B, "up")
        _ip("route", "replace", "unreachable", UNROUTABLE_NET)
        yield
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("route", "del", "unreachable", UNROUTABLE_NET)
        _ip("link", "del", IFACE_A)


# ---------------------------------------------------------------- coturn


@dataclass(frozen=True)
class Coturn:
    host: str
    port: int
    secret: str
    log: Path
    stderr: Path

    def credentials(self, node: str) -> tuple[str, str]:
        """coturn's REST scheme: "<expiry>:<node>" and base64(HMAC-SHA1(secret, username))."""
        username = f"{int(time.time()) + 600}:{node}"
        digest = hmac.new(self.secret.encode(), username.encode(), hashlib.sha1).digest()
        return username, base64.b64encode(digest).decode()

    def config(self, node: str, **changes: Any) -> IceConfig:
        username, password = self.credentials(node)
        fields: dict[str, Any] = {
            "turn_server": (self.host, self.port),
            "turn_username": username,
            "turn_password": password,
            "use_ipv6": False,
        }
        fields.update(changes)
        return IceConfig(**fields)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stderr_text(self) -> str:
        """Where coturn 4.6.1 reports a failed relay send ("udp send: ...")."""
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""


def _stun_answers(host: str, port: int) -> bool:
    request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.2)
        try:
            s.sendto(bytes(request), (host, port))
            data = s.recv(2048)
        except OSError:
            return False
    return stun.parse_message(data).transaction_id == request.transaction_id


@pytest.fixture(scope="module")
def coturn(test_net: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coturn]:
    binary = shutil.which("turnserver")
    if binary is None:
        pytest.skip("coturn is not installed (`turnserver`; Debian package coturn)")
    run_dir = tmp_path_factory.mktemp("coturn")
    server = Coturn(
        ADDR_A,
        free_udp_port(ADDR_A),
        base64.b64encode(os.urandom(18)).decode(),
        run_dir / "turn.log",
        run_dir / "turn.stderr",
    )
    conf = run_dir / "turnserver.conf"
    conf.write_text(
        "\n".join(
            [
                f"listening-ip={server.host}",
                f"relay-ip={server.host}",
                f"listening-port={server.port}",
                "min-port=50000",
                "max-port=50999",
                "use-auth-secret",
                f"static-auth-secret={server.secret}",
                "realm=sangama.test",
                "fingerprint",
                "no-tls",
                "no-dtls",
                "no-tcp-relay",
                "no-cli",
                "no-multicast-peers",
                f"userdb={run_dir / 'turndb'}",
                f"pidfile={run_dir / 'turnserver.pid'}",
                f"log-file={server.log}",
                "simple-log",
                "verbose",
                "no-software-attribute",
                "",
            ]
        )
    )
    with server.stderr.open("wb") as stderr:
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + PATIENCE_S
        while not _stun_answers(server.host, server.port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"coturn did not start:\n{server.log_text()[-2000:]}")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# ---------------------------------------------------------------- credentials, signalling


@dataclass(frozen=True)
class Swarm:
    server: NodeCredentials
    client: NodeCredentials


def _creds(ca: auth.CertifiedKey, node_id: str, role: str) -> NodeCredentials:
    key = auth.new_private_key()
    cert = auth.issue_node_certificate(ca, node_id, key.public_key(), role)
    return NodeCredentials(
        certified=auth.CertifiedKey(certificate=cert, private_key=key),
        ca_certificate_pem=auth.certificate_pem(ca.certificate),
    )


@pytest.fixture(scope="module")
def swarm() -> Swarm:
    ca = auth.create_ca("swarm-ca")
    return Swarm(server=_creds(ca, SERVER_ID, "worker"), client=_creds(ca, CLIENT_ID, "client"))


Tamper = Callable[[int, bool, IceOffer], IceOffer]


class Signalling:
    """What the coordinator will do: hand each side's offer to the other, round by round.
    `tamper(round, from_controlling, offer)` may rewrite an offer on its way."""

    def __init__(self, tamper: Tamper | None = None) -> None:
        self._boxes: dict[bool, asyncio.Queue[IceOffer]] = {
            True: asyncio.Queue(),
            False: asyncio.Queue(),
        }
        self._rounds = {True: 0, False: 0}
        self._tamper = tamper or (lambda _round, _from, offer: offer)

    def exchange(self, controlling: bool) -> Callable[[IceOffer], Coroutine[Any, Any, IceOffer]]:
        async def swap(offer: IceOffer) -> IceOffer:
            self._rounds[controlling] += 1
            # Through JSON's shape, as the coordinator will carry it.
            sent = IceOffer.from_dict(offer.to_dict())
            tampered = self._tamper(self._rounds[controlling], controlling, sent)
            await self._boxes[not controlling].put(tampered)
            return await self._boxes[controlling].get()

        return swap

    @property
    def rounds(self) -> int:
        return max(self._rounds.values())


async def establish_pair(
    config_a: IceConfig, config_b: IceConfig, signalling: Signalling | None = None
) -> tuple[IceSession, IceSession]:
    sig = signalling or Signalling()
    a, b = await within(
        asyncio.gather(
            establish(True, config_a, sig.exchange(True)),
            establish(False, config_b, sig.exchange(False)),
        ),
        PATIENCE_S * 2,
    )
    return a, b


async def read_exactly(queue: asyncio.Queue[bytes], n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        got += await within(queue.get())
    return bytes(got)


async def quic_both_ways(client_ice: IceSession, server_ice: IceSession, swarm: Swarm) -> None:
    """A QUIC handshake over the two ICE paths, then data in both directions."""
    accepted: list[QuicLink] = []
    server = QuicServer(swarm.server.tls(), accepted.append, TUNING)
    try:
        accepting = asyncio.create_task(
            server.accept(server_ice.path_factory, server_ice.peer_address, PATIENCE_S)
        )
        client = await connect(
            client_ice.peer_address,
            swarm.client.tls(),
            SERVER_ID,
            TUNING,
            PATIENCE_S,
            path_factory=client_ice.path_factory,
        )
        server_link = await within(accepting)
        assert accepted == [server_link]
        assert server.links == [server_link]
        to_server: asyncio.Queue[bytes] = asyncio.Queue()
        to_client: asyncio.Queue[bytes] = asyncio.Queue()
        server_link.on_data = to_server.put_nowait
        client.on_data = to_client.put_nowait
        payload = os.urandom(20_000)  # many datagrams
        client.send(payload)
        assert await read_exactly(to_server, len(payload)) == payload
        server_link.send(payload[::-1])
        assert await read_exactly(to_client, len(payload)) == payload[::-1]
        client.close("done")
        assert await within(server_link.closed) == "done"
    finally:
        server.close()
        await within(asyncio.gather(client_ice.close(), server_ice.close()))


# ---------------------------------------------------------------- aioice's nonce handling


class FakeTurn(asyncio.DatagramProtocol):
    """Just enough TURN over UDP: long-term credentials, Allocate, ChannelBind, Refresh,
    ChannelData. The first ChannelBind is answered 438 with a new nonce, as a server whose
    nonce went stale would."""

    REALM = "fake.test"

    def __init__(self, username: str, password: str) -> None:
        self.key = turn.make_integrity_key(username, self.REALM, password)
        self.nonce = b"nonce-one"
        self.seen: list[tuple[str, bytes | None]] = []
        """(method, NONCE sent) of every request, in order."""
        self.channel_data: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None
        self._rotated = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def _error(self, request: stun.Message, code: int, reason: str) -> stun.Message:
        answer = stun.Message(request.message_method, stun.Class.ERROR, request.transaction_id)
        answer.attributes.update(
            {"ERROR-CODE": (code, reason), "NONCE": self.nonce, "REALM": self.REALM}
        )
        answer.add_fingerprint()
        return answer

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        if turn.is_channel_data(data):
            channel, length = int.from_bytes(data[:2]), int.from_bytes(data[2:4])
            self.channel_data.put_nowait((channel, data[4 : 4 + length]))
            return
        request = stun.parse_message(data)
        method = request.message_method
        self.seen.append((method.name, request.attributes.get("NONCE")))
        if not request.check_message_integrity(self.key):  # also without MESSAGE-INTEGRITY
            answer = self._error(request, 401, "Unauthorized")
        elif request.attributes.get("NONCE") != self.nonce:
            answer = self._error(request, 438, "Stale Nonce")
        elif method == stun.Method.CHANNEL_BIND and not self._rotated:
            self._rotated = True
            self.nonce = b"nonce-two"
            answer = self._error(request, 438, "Stale Nonce")
        else:
            answer = stun.Message(method, stun.Class.RESPONSE, request.transaction_id)
            if method == stun.Method.ALLOCATE:
                answer.attributes["XOR-RELAYED-ADDRESS"] = ("127.0.0.1", 50_000)
                answer.attributes["XOR-MAPPED-ADDRESS"] = addr
                answer.attributes["LIFETIME"] = 600
            elif method == stun.Method.REFRESH:
                answer.attributes["LIFETIME"] = request.attributes.get("LIFETIME", 600)
            answer.add_message_integrity(self.key)
        self.transport.sendto(bytes(answer), addr)


class Recorder(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.errors: list[Exception] = []
        self.received: asyncio.Queue[bytes] = asyncio.Queue()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received.put_nowait(data)

    def error_received(self, exc: Exception) -> None:
        self.errors.append(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


def test_aioice_retries_a_438_with_the_new_nonce_and_keeps_it() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        username, password = "1:node", "secret"
        server_transport, server = await loop.create_datagram_endpoint(
            lambda: FakeTurn(username, password), local_addr=("127.0.0.1", 0)
        )
        address = server_transport.get_extra_info("sockname")[:2]
        client = Recorder()
        transport, _ = await within(
            turn.create_turn_endpoint(
                lambda: client, server_addr=address, username=username, password=password
            )
        )
        try:
            transport.sendto(b"first", ("127.0.0.2", 9))
            assert await within(server.channel_data.get()) == (0x4000, b"first")
            transport.sendto(b"second", ("127.0.0.3", 9))
            assert await within(server.channel_data.get()) == (0x4001, b"second")
            assert client.errors == []
            assert server.seen == [
                ("ALLOCATE", None),  # unauthenticated: 401 gives realm and nonce
                ("ALLOCATE", b"nonce-one"),
                ("CHANNEL_BIND", b"nonce-one"),  # 438 with nonce-two
                ("CHANNEL_BIND", b"nonce-two"),  # the retry takes the new nonce...
                ("CHANNEL_BIND", b"nonce-two"),  # ...and later requests keep it
            ]
        finally:
            transport.close()
            await within(client.lost)
            server_transport.close()
        assert server.seen[-1] == ("REFRESH", b"nonce-two")

    run(body)


# ---------------------------------------------------------------- host paths


def test_quic_over_a_host_ice_path(test_net: None, swarm: Swarm) -> None:
    async def body() -> None:
        config = IceConfig(timeout_s=PATIENCE_S, use_ipv6=False)
        a, b = await establish_pair(config, config)
        assert (a.policy, b.policy) == (POLICY_ALL, POLICY_ALL)
        assert (a.selected_path_type(), b.selected_path_type()) == ("host", "host")
        await quic_both_ways(a, b, swarm)
        assert not a.connected and not b.connected

    run(body)


def test_an_authenticated_channel_over_an_ice_path(test_net: None, swarm: Swarm) -> None:
    async def body() -> None:
        config = IceConfig(timeout_s=PATIENCE_S, use_ipv6=False)
        a, b = await establish_pair(config, config)
        announced: list[Channel] = []
        server = ChannelServer(swarm.server, announced.append, TUNING)
        try:
            accepting = asyncio.create_task(
                server.accept_path(b.path_factory, b.peer_address, PATIENCE_S)
            )
            client = await connect_channel(
                a.peer_address,
                swarm.client,
                SERVER_ID,
                TUNING,
                PATIENCE_S,
                path_factory=a.path_factory,
            )
            served = await within(accepting)
            assert announced == [served]
            assert client.peer is not None and client.peer.node_id == SERVER_ID
            assert served.peer is not None and served.peer.node_id == CLIENT_ID
            at_client: asyncio.Queue[wire.Frame] = asyncio.Queue()
            at_server: asyncio.Queue[wire.Frame] = asyncio.Queue()
            client.on_frame = lambda _ch, f: at_client.put_nowait(f)
            served.on_frame = lambda _ch, f: at_server.put_nowait(f)
            client.send(wire.Ping(7))  # each side answers a Ping with a Pong by itself
            served.send(wire.Ping(9))
            assert await within(at_client.get()) == wire.Pong(7)
            assert await within(at_server.get()) == wire.Pong(9)
            client.close("done")
            assert await within(served.closed) == "done"
        finally:
            server.close()
            await within(asyncio.gather(a.close(), b.close()))

    run(body)


def test_an_advertised_address_alone_reaches_the_node(test_net: None, swarm: Swarm) -> None:
    """A node behind a port forward advertises (public IP, port) itself. Here the "public"
    address is ADDR_A and the forward is the identity, and the peer is told nothing else."""

    async def body() -> None:
        port = free_udp_port("0.0.0.0")
        forwarded = IceConfig(
            timeout_s=PATIENCE_S, use_ipv6=False, extra_host_candidates=((ADDR_A, port),)
        )
        a = IceSession(False, forwarded)
        b = IceSession(True, IceConfig(timeout_s=PATIENCE_S, use_ipv6=False))
        try:
            offer_a, offer_b = await within(asyncio.gather(a.gather(), b.gather()))
            advertised = tuple(c for c in offer_a.candidates if f" {ADDR_A} {port} typ host" in c)
            assert len(advertised) == 1
            # b completes before a even starts: a only answers checks, so b cannot learn
            # any other address of a than the advertised one.
            await within(b.connect(IceOffer(offer_a.ufrag, offer_a.pwd, advertised)))
            pair = b.selected_pair()
            assert (pair.remote_type, pair.remote_address) == ("host", (ADDR_A, port))
            await within(a.connect(offer_b))
            await quic_both_ways(b, a, swarm)
        finally:
            await within(asyncio.gather(a.close(), b.close()))

    run(body)


# ---------------------------------------------------------------- relayed paths


def test_quic_over_a_relay_only_ice_path(coturn: Coturn, swarm: Swarm) -> None:
    async def body() -> None:
        a, b = await establish_pair(
            coturn.config("node-a", relay_only=True, timeout_s=PATIENCE_S),
            coturn.config("node-b", relay_only=True, timeout_s=PATIENCE_S),
        )
        assert (a.policy, b.policy) == (POLICY_RELAY, POLICY_RELAY)
        assert (a.selected_path_type(), b.selected_path_type()) == ("relay", "relay")
        await quic_both_ways(a, b, swarm)

    run(body)


def _unreachable_only(round_: int, _from_controlling: bool, offer: IceOffer) -> IceOffer:
    """Round 1: the peer seems to be at one address nobody answers at, so the default
    policy times out. Later rounds pass untouched."""
    if round_ > 1:
        return offer
    bogus = f"candidate:9 1 udp 2130706431 {UNROUTABLE_PEER[0]} {UNROUTABLE_PEER[1]} typ host"
    return IceOffer(offer.ufrag, offer.pwd, (bogus,))


def test_a_failed_default_policy_is_retried_relay_only(coturn: Coturn, swarm: Swarm) -> None:
    async def body() -> None:
        signalling = Signalling(tamper=_unreachable_only)
        a, b = await establish_pair(
            coturn.config("node-a", timeout_s=2.0),
            coturn.config("node-b", timeout_s=2.0),
            signalling,
        )
        assert signalling.rounds == 2
        assert (a.policy, b.policy) == (POLICY_RELAY, POLICY_RELAY)
        assert (a.selected_path_type(), b.selected_path_type()) == ("relay", "relay")
        await quic_both_ways(a, b, swarm)

    run(body)


def test_coturn_drops_an_allocation_after_one_unroutable_send(coturn: Coturn) -> None:
    """The root cause (net/ice/paths.py docstring). One ChannelData to an address the relay has no
    route to, and coturn 4.6.1 silently drops everything the allocation relays from then on;
    the next datagram a peer sends to the relayed address ends the allocation, and the
    client's next ChannelBind meets a fresh session: 438 "Wrong nonce", then, after aioice's
    correct retry with the new nonce, 400."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        username, password = coturn.credentials("probe")
        client = Recorder()
        transport, _ = await within(
            turn.create_turn_endpoint(
                lambda: client,
                server_addr=(coturn.host, coturn.port),
                username=username,
                password=password,
            )
        )
        relayed = transport.get_extra_info("sockname")
        peer_transport, peer = await loop.create_datagram_endpoint(Recorder, local_addr=(ADDR_B, 0))
        peer_address = peer_transport.get_extra_info("sockname")[:2]
        drops_before = coturn.log_text().count("reason: general")
        wrong_nonces_before = coturn.log_text().count("error 438: Wrong nonce")
        try:
            transport.sendto(b"before", peer_address)
            assert await within(peer.received.get()) == b"before"  # the relay works
            failed_sends = coturn.stderr_text().count("udp send")
            transport.sendto(b"lost", UNROUTABLE_PEER)  # after a ChannelBind, which succeeds
            while coturn.stderr_text().count("udp send") == failed_sends:
                await asyncio.sleep(0.05)  # bounded by run()
            transport.sendto(b"after", peer_address)  # the same working peer as before
            peer_transport.sendto(b"hello relay", relayed)  # permitted: bound above
            while coturn.log_text().count("reason: general") == drops_before:
                await asyncio.sleep(0.05)  # bounded by run()
            assert peer.received.empty()  # "after" was never relayed
            transport.sendto(b"again", (ADDR_B, 9))  # a new peer: a new ChannelBind
            while not client.errors:
                await asyncio.sleep(0.05)
            assert isinstance(client.errors[0], stun.TransactionFailed)
            assert client.errors[0].response.error_code == 400
            assert coturn.log_text().count("error 438: Wrong nonce") == wrong_nonces_before + 1
        finally:
            transport.close()
            peer_transport.close()

    run(body)


def test_a_relayed_candidate_is_never_sent_to_a_private_host_candidate(
    coturn: Coturn, swarm: Swarm
) -> None:
    """The fix: b offers a private host address no relay can reach beside its relayed one,
    and a (relay-only, as after a fallback) has only its relayed candidate. Unfixed aioice
    checks that pair first (it outranks relay-to-relay), coturn drops a's allocation and ICE
    fails; net.ice.paths never forms the pair, so the relay-to-relay pair connects."""

    async def body() -> None:
        def private_and_relay(_round: int, from_controlling: bool, offer: IceOffer) -> IceOffer:
            if from_controlling:
                return offer
            bogus = f"candidate:9 1 udp 2130706431 {UNROUTABLE_PEER[0]} 9 typ host"
            relayed = tuple(c for c in offer.candidates if " typ relay" in c)
            assert relayed
            return IceOffer(offer.ufrag, offer.pwd, (bogus, *relayed))

        before = coturn.log_text().count("reason: general")
        a, b = await establish_pair(
            coturn.config("node-a", relay_only=True, timeout_s=PATIENCE_S / 2),
            coturn.config("node-b", timeout_s=PATIENCE_S / 2),
            Signalling(tamper=private_and_relay),
        )
        assert (a.policy, b.policy) == (POLICY_RELAY, POLICY_ALL)
        assert (a.selected_path_type(), b.selected_path_type()) == ("relay", "relay")
        await quic_both_ways(a, b, swarm)
        assert coturn.log_text().count("reason: general") == before  # no allocation lost

    run(body)
