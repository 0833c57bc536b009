"""ICE path finding under QUIC links; with net.ice.values, the only aioice user
(docs/architecture.md, "Links").

Where the addresses a peer can be reached at do not work as they are, a link finds a path
with standard ICE: `aioice` gathers host, server-reflexive (STUN) and relayed (TURN)
candidates and runs the connectivity checks that punch holes. The coordinator carries the
offers between the two nodes (`IceOffer.to_dict`, `establish(exchange=...)`), and QUIC then
runs over the selected pair through `IceSession.as_datagram_path` (a `net.quic.links.DatagramPath`).

`establish` bounds ICE (aioice would wait 64 s) and, when a TURN server is configured and the
default policy fails, retries once relay-only (relay-only worked where the default policy
failed behind symmetric NAT; docs/architecture.md, "Links").

Root cause of that failure (aioice 0.13.0, coturn 4.6.1; reproduced with the reference
symmetric-NAT namespaces and in tests/integration/test_ice.py): not a nonce bug. aioice
pairs its relayed candidate with every remote candidate (ice.py:1220
`_pair_remote_candidate`), including the peer's private host address (192.168.x.y), and
that pair outranks relay-to-relay. Checking it makes aioice ChannelBind the private address
(turn.py:320-371; coturn's default config allows it) and send a check through it. The relay
has no route there, its sendto fails, and coturn 4.6.1 marks the relay socket `tobeclosed`
on any send error but ECONNRESET/ECONNREFUSED (ns_ioalib_engine_impl.c:3340-3344). From then
on it relays nothing, silently (:3271), and the next datagram a peer sends to the relayed
address ends the allocation (socket_input_handler :2742 -> :2745-2778, logged "closed (2nd
stage) ... reason: general"). The client's next ChannelBind on the same 5-tuple opens a fresh
coturn session without a nonce, which coturn answers 438 with the reason "Wrong nonce"
(ns_turn_server.c:3324, 3482-3486; a mismatched nonce is "Stale nonce", :3488-3492). aioice
handles that correctly: it takes the new NONCE, keeps the realm and retries once with a new
transaction id (turn.py:291-314), and signs later requests with the newest nonce
(turn.py:379-385). The retry reaches a session without an allocation, for which coturn's
ChannelBind handler builds no answer, so the generic path replies 400 (ns_turn_server.c:
3942-3946). The relayed candidate is dead from then on and, with symmetric NAT on both
sides, no other pair works. Relay-only worked because it gathers no host candidates, so no
private address is ever bound. Fix here: `_Connection` never pairs a relayed local
candidate with a remote host candidate in a private range (a relay on the internet cannot
reach it; a peer on the same private network is reached by the host pairs anyway). With it
the default policy connects through symmetric NAT in one round (~0.1 s in the namespaces,
instead of failing after `timeout_s` and retrying relay-only). Relays should also deny
private peers (coturn `denied-peer-ip`, net/ice/turn.py `deny_private_peers`), which turns such
a ChannelBind into a harmless 403 for peers running other ICE stacks.

The values this module works with (IceConfig, IceOffer, SelectedPair, the errors) live in
net.ice.values and are re-exported here.

aioice has no public accessor for the selected pair; `Connection._nominated` (ice.py:449,
component -> CandidatePair, read by aioice's own `sendto`, ice.py:766) is used for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable

import aioice
import aioice.ice
from aioice.candidate import candidate_foundation, candidate_priority

from net.ice.values import (
    POLICY_ALL,
    POLICY_RELAY,
    Addr,
    IceConfig,
    IceConfigError,
    IceError,
    IceFailed,
    IceOffer,
    IceTimeout,
    SelectedPair,
    parse_candidate,
)

log = logging.getLogger(__name__)

# The shapes of net.quic.links's; not imported, so that ICE does not load the QUIC library.
Receiver = Callable[[bytes, Addr], None]
Exchange = Callable[[IceOffer], Awaitable[IceOffer]]

GATHER_TIMEOUT_S = 10.0
"""aioice bounds STUN and TURN gathering at 5 s itself; this only guards against a hang."""
CLOSE_TIMEOUT_S = 5.0
"""Closing deletes TURN allocations; a dead relay must not hold a closing link for 30 s."""
RELAY_UNREACHABLE_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "fc00::/7",
        "fe80::/10",
    )
)
"""Host addresses a relay must not be asked to reach (see the module docstring)."""


# ---------------------------------------------------------------- aioice, fixed


def relay_cannot_reach(candidate: aioice.Candidate) -> bool:
    """A remote host candidate in a private range: no relay on the internet reaches it,
    and asking coturn to send there costs the allocation (module docstring)."""
    if candidate.type != "host":
        return False  # srflx and relay addresses were seen by, or live on, a server
    try:
        ip = ipaddress.ip_address(candidate.host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == net.version and ip in net for net in RELAY_UNREACHABLE_NETWORKS)


class _Connection(aioice.Connection):
    """aioice's Connection with one change: a relayed local candidate is not paired with a
    remote host candidate `relay_cannot_reach` (the root cause in the module docstring).
    Overrides the private `_pair_remote_candidate` (aioice 0.13.0 ice.py:1220), through
    which every pair of the check list is formed."""

    def _pair_remote_candidate(self, remote_candidate: aioice.Candidate) -> None:
        if not relay_cannot_reach(remote_candidate):
            super()._pair_remote_candidate(remote_candidate)
            return
        every = self._protocols
        # Synchronous, so nothing else sees the shortened list.
        self._protocols = [p for p in every if p.local_candidate.type != "relay"]
        try:
            super()._pair_remote_candidate(remote_candidate)
        finally:
            self._protocols = every


# ---------------------------------------------------------------- a session


class IceSession:
    """One ICE agent for one link: gather, exchange offers (elsewhere), connect, carry."""

    def __init__(self, controlling: bool, config: IceConfig) -> None:
        self.controlling = controlling
        self.config = config
        self._conn = _Connection(
            ice_controlling=controlling,
            components=config.components,
            stun_server=config.stun_server,
            turn_server=config.turn_server,
            turn_username=config.turn_username,
            turn_password=config.turn_password,
            use_ipv6=config.use_ipv6,
            transport_policy=(
                aioice.TransportPolicy.RELAY if config.relay_only else aioice.TransportPolicy.ALL
            ),
        )
        self._offer: IceOffer | None = None
        self._connected = False
        self._path: IcePath | None = None
        self._close_task: asyncio.Task[None] | None = None

    @property
    def policy(self) -> str:
        """The ICE policy: "all" (the default) or "relay" (relay-only)."""
        return self.config.policy

    @property
    def connected(self) -> bool:
        # aioice closes itself when the peer's consent expires, emptying `_nominated`.
        return self._connected and self._close_task is None and bool(self._conn._nominated)

    async def gather(self) -> IceOffer:
        """Gather local candidates (once) and return the offer to send to the peer."""
        if self._offer is not None:
            return self._offer
        if self._close_task is not None:
            raise IceError("ICE session is closed")
        try:
            await asyncio.wait_for(self._conn.gather_candidates(), GATHER_TIMEOUT_S)
        except TimeoutError:
            raise IceTimeout(f"candidate gathering took over {GATHER_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise IceFailed(f"candidate gathering failed: {exc}") from exc
        if not self.config.relay_only:  # relay-only hides every host address
            for host, port in self.config.extra_host_candidates:
                await self._add_extra_host_candidate(host, port)
        candidates = tuple(c.to_sdp() for c in self._conn.local_candidates)
        if not candidates:
            why = "TURN allocation failed?" if self.config.relay_only else "no usable interface?"
            raise IceFailed(f"no local ICE candidates ({why})")
        self._offer = IceOffer(self._conn.local_username, self._conn.local_password, candidates)
        log.debug("ICE %s gathered %s", self.policy, candidates)
        return self._offer

    async def _add_extra_host_candidate(self, host: str, port: int) -> None:
        # aioice binds its host sockets on ephemeral ports and offers no way to add one, so
        # this mirrors its get_component_candidates (ice.py:1137): a StunProtocol on our own
        # socket, appended to the private `_protocols` and `_local_candidates`.
        ip = ipaddress.ip_address(host)
        if ip.version == 6 and not self.config.use_ipv6:
            return
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.create_datagram_endpoint(
                lambda: aioice.ice.StunProtocol(self._conn),
                local_addr=("::" if ip.version == 6 else "0.0.0.0", port),
            )
        except OSError as exc:  # e.g. the forwarded port is held by another session
            log.warning("cannot bind advertised candidate %s:%d: %s", host, port, exc)
            return
        bound = int(transport.get_extra_info("sockname")[1])
        protocol.local_candidate = aioice.Candidate(
            foundation=candidate_foundation("host", "udp", host),
            component=1,
            transport="udp",
            # Just below the real host candidates: on a shared LAN those avoid a hairpin.
            priority=candidate_priority(1, "host", local_pref=65534),
            host=str(ip),
            port=bound,
            type="host",
        )
        self._conn._protocols.append(protocol)
        self._conn._local_candidates.append(protocol.local_candidate)

    async def connect(self, remote: IceOffer) -> None:
        """Run the connectivity checks against the peer's offer, within `timeout_s`."""
        if self._offer is None:
            raise IceError("gather() must come before connect()")
        if self._close_task is not None:
            raise IceError("ICE session is closed")
        conn = self._conn
        conn.remote_username, conn.remote_password = remote.ufrag, remote.pwd
        conn.remote_is_lite = remote.ice_lite
        for sdp in remote.candidates:
            await conn.add_remote_candidate(parse_candidate(sdp))
        # End-of-candidates: without it aioice waits for more instead of ever failing.
        await conn.add_remote_candidate(None)
        try:
            await asyncio.wait_for(conn.connect(), self.config.timeout_s)
        except TimeoutError:
            raise IceTimeout(
                f"no ICE path ({self.policy} policy) in {self.config.timeout_s:g} s"
            ) from None
        except ConnectionError as exc:
            raise IceFailed(f"ICE failed ({self.policy} policy): {exc}") from exc
        self._connected = True
        pair = self.selected_pair()
        log.info(
            "ICE connected (%s policy): %s %s -> %s %s",
            self.policy,
            pair.local_type,
            pair.local_address,
            pair.remote_type,
            pair.remote_address,
        )

    def selected_pair(self, component: int = 1) -> SelectedPair:
        """The pair datagrams leave by now. aioice records every later nominated pair too,
        so this may change after `connect` (to another working pair)."""
        if not self._connected:
            raise IceError("ICE is not connected")
        pair = self._conn._nominated.get(component)  # private: see the module docstring
        if pair is None:
            raise IceError("ICE connection lost")
        local, remote = pair.local_candidate, pair.remote_candidate
        return SelectedPair(
            local.type, (local.host, local.port), remote.type, (remote.host, remote.port)
        )

    def selected_path_type(self) -> str:
        """One of "host", "prflx", "srflx", "relay" (see SelectedPair.path_type)."""
        return self.selected_pair().path_type

    @property
    def peer_address(self) -> Addr:
        """The selected remote address: the peer address to give the QUIC link."""
        return self.selected_pair().remote_address

    def as_datagram_path(
        self, receiver: Receiver, on_error: Callable[[Exception], None] | None = None
    ) -> IcePath:
        """The connected session as a `net.quic.links.DatagramPath`; at most one per session."""
        if not self.connected:
            raise IceError("ICE is not connected")
        if self._path is not None:
            raise IceError("this ICE session already carries a path")
        self._path = IcePath(self, receiver, on_error)
        return self._path

    async def path_factory(
        self, receiver: Receiver, on_error: Callable[[Exception], None]
    ) -> IcePath:
        """`as_datagram_path` in the shape `net.quic.links.connect(path_factory=...)` and
        `QuicServer.accept` take."""
        return self.as_datagram_path(receiver, on_error)

    def _send(self, data: bytes) -> None:
        pair = self._conn._nominated.get(1)
        if pair is None or self._close_task is not None:
            return  # dropped like a lost datagram: QUIC recovers or its idle timer fires
        # Straight to the pair's transport: aioice's `send` is a coroutine per datagram. A
        # TURN transport queues the ChannelData send itself.
        pair.protocol.transport.sendto(data, pair.remote_addr)

    async def _recv(self) -> bytes:
        return await self._conn.recv()

    def close_soon(self) -> asyncio.Task[None]:
        """Start closing (sockets, TURN allocations) without waiting; idempotent."""
        if self._close_task is None:
            self._close_task = asyncio.get_running_loop().create_task(self._close())
        return self._close_task

    async def close(self) -> None:
        await asyncio.shield(self.close_soon())

    async def _close(self) -> None:
        if self._path is not None:
            self._path._stop()
        try:
            await asyncio.wait_for(self._conn.close(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.warning("ICE close took over %g s; abandoned", CLOSE_TIMEOUT_S)


class IcePath:
    """A `net.quic.links.DatagramPath` over a connected IceSession (component 1). Outgoing
    datagrams take the selected pair whatever `addr` says; incoming ones are reported as
    from the session's `peer_address`, constant for the link's lifetime."""

    def __init__(
        self,
        session: IceSession,
        receiver: Receiver,
        on_error: Callable[[Exception], None] | None,
    ) -> None:
        self._session = session
        self._receiver = receiver
        self._on_error = on_error
        self.peer_address = session.peer_address
        self._stopped = False
        self._task = asyncio.get_running_loop().create_task(self._receive_loop())

    async def _receive_loop(self) -> None:
        try:
            while True:
                # Returns without yielding while datagrams are queued: bursts stay batched.
                data = await self._session._recv()
                try:
                    self._receiver(data, self.peer_address)
                except Exception:  # one bad datagram must not end the path
                    log.exception("ICE path receiver failed")
        except ConnectionError as exc:  # closed here, or the peer's consent expired
            if not self._stopped and self._on_error is not None:
                self._on_error(exc)

    def send(self, data: bytes, addr: Addr) -> None:
        if not self._stopped:
            self._session._send(data)

    def _stop(self) -> None:
        self._stopped = True
        if not self._task.done():
            self._task.cancel()

    def close(self) -> None:
        self._stop()
        self._session.close_soon()


# ---------------------------------------------------------------- one link, end to end


async def _attempt(controlling: bool, config: IceConfig, exchange: Exchange) -> IceSession:
    session = IceSession(controlling, config)
    try:
        offer = await session.gather()
        try:
            remote = await asyncio.wait_for(exchange(offer), config.exchange_timeout_s)
        except TimeoutError:
            # Not IceTimeout: no path was tried, so a relay-only retry would not help.
            raise IceError(
                f"ICE offer exchange took over {config.exchange_timeout_s:g} s"
            ) from None
        await session.connect(remote)
    except BaseException:
        with contextlib.suppress(Exception):
            await session.close()
        raise
    return session


async def establish(controlling: bool, config: IceConfig, exchange: Exchange) -> IceSession:
    """Gather, swap offers through `exchange` (the coordinator), connect.

    If the default policy fails (or times out) and a TURN server is configured, both sides
    retry once relay-only, with fresh offers through `exchange` again; `session.policy` says
    which policy succeeded. The peer must run the same function with the opposite
    `controlling` and the same TURN configuration, or the second exchange times out.
    """
    try:
        return await _attempt(controlling, config, exchange)
    except IceFailed as exc:
        if config.relay_only or config.turn_server is None:
            raise
        log.info("ICE with the default policy failed (%s); retrying relay-only", exc)
    session = await _attempt(controlling, config.with_relay_only(), exchange)
    log.info("ICE connected on the relay-only retry")
    return session


__all__ = [
    "POLICY_ALL",
    "POLICY_RELAY",
    "Exchange",
    "IceConfig",
    "IceConfigError",
    "IceError",
    "IceFailed",
    "IceOffer",
    "IcePath",
    "IceSession",
    "IceTimeout",
    "SelectedPair",
    "establish",
    "relay_cannot_reach",
]
