"""How a node reaches a peer: the address as it is first, then ICE through the
coordinator (hole punching, or the TURN relay where punching cannot work).

`SignalRouter` carries ICE offers and answers through the coordinator's signalling
endpoints (a long-poll loop, as a WebRTC signalling server would); `LinkDialer` opens
channels to peers; offers from peers that dial us are answered and served through the
node's `ChannelServer.accept_path`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from coordinator.client.session import CoordinatorClient
from coordinator.client.unreachable import CoordinatorUnreachable
from coordinator.contract import TurnAnswer
from coordinator.errors import CoordinatorError
from net.channel import Channel, ChannelServer, NodeCredentials, connect_channel
from net.errors import NetError
from net.ice.paths import IceConfig, IceError, IceOffer, IceSession, establish
from net.quic.links import Addr, QuicTuning

log = logging.getLogger(__name__)

DIRECT_TIMEOUT_S = 3.0
"""A direct dial that has not completed its handshake by then is not going to."""
POLL_WAIT_S = 10.0


def path_kind(session: IceSession | None) -> str:
    """What the operator page shows: direct, punched (srflx/prflx pair) or relayed."""
    if session is None:
        return "direct"
    kind = session.selected_path_type()
    return {"relay": "relayed", "host": "direct"}.get(kind, "punched")


def advertised_candidates(advertise: str | None) -> tuple[Addr, ...]:
    """The public IP of `--advertise HOST:PORT` as an extra ICE host candidate.

    Port 0: the ICE socket binds any port and is offered at the public IP with that port,
    which reaches it through a 1:1 NAT (a datacenter VM, a DMZ host). A host name, or an
    address no peer can use (loopback, unspecified), adds nothing: the direct dial still
    tries the advertised address as it is."""
    if not advertise:
        return ()
    host = advertise.rsplit(":", 1)[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return ()
    if ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_link_local:
        return ()
    return ((str(ip), 0),)


def ice_config(client: CoordinatorClient, advertise: tuple[Addr, ...] = ()) -> IceConfig:
    """STUN/TURN servers and short-lived credentials from the coordinator (fetched once:
    a long-running node uses IceConfigSource, which renews them)."""
    return _ice_config_of(client.turn(), advertise)


def _ice_config_of(creds: TurnAnswer | None, advertise: tuple[Addr, ...]) -> IceConfig:
    if creds is None:
        return IceConfig(extra_host_candidates=advertise)
    host, port = creds.host, creds.port
    return IceConfig(
        stun_server=(host, port),
        turn_server=(host, port),
        turn_username=creds.username,
        turn_password=creds.password,
        extra_host_candidates=advertise,
    )


class IceConfigSource:
    """The node's ICE configuration with TURN credentials that it renews itself.

    The coordinator's relay credentials are short-lived (net.ice.turn.node_credentials: a
    username lives 15 to 30 minutes), so a node that fetched them once at start could
    not reach the relay later. `current()` fetches them again once half of their life has
    passed; an allocation made earlier keeps its own. Blocking: call it off the loop."""

    def __init__(
        self,
        client: CoordinatorClient,
        advertise: tuple[Addr, ...] = (),
        *,
        relay_only: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.advertise = advertise
        self.relay_only = relay_only
        self._clock = clock
        self._lock = threading.Lock()
        self._config: IceConfig | None = None
        self._renew_at = 0.0

    def current(self) -> IceConfig:
        with self._lock:
            now = self._clock()
            if self._config is None or now >= self._renew_at:
                try:
                    creds = self.client.turn()
                except CoordinatorError as exc:
                    if self._config is None:
                        raise
                    # Unreachable for now: the old credentials may still be valid.
                    log.warning("cannot renew the relay credentials: %s", exc)
                    self._renew_at = now + 30.0
                    return self._config
                config = _ice_config_of(creds, self.advertise)
                self._config = config.with_relay_only() if self.relay_only else config
                # No relay: nothing expires, but ask again now and then (one may appear).
                self._renew_at = now + (creds.ttl_s / 2 if creds is not None else 600.0)
            return self._config


async def _config_now(config: IceConfig | IceConfigSource) -> IceConfig:
    if isinstance(config, IceConfig):
        return config
    return await asyncio.get_running_loop().run_in_executor(None, config.current)


class SignalRouter:
    """Delivers signalling messages to whoever waits for them, by (kind, link, round).

    A node's messages come from one mailbox at the coordinator, handed to whichever
    request asks first: every part of one process that speaks as the node (the desktop
    app's worker and its chat) must share one router (`node_router`), or each takes
    messages meant for the other. `start` and `stop` count their users; the mailbox is
    polled from the first `start` until the last `stop`."""

    def __init__(self, client: CoordinatorClient) -> None:
        self.client = client
        self._queues: dict[tuple[str, str], asyncio.Queue[tuple[str, IceOffer]]] = {}
        self.on_new_offer: Callable[[str, str], Coroutine[Any, Any, None]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._users = 0
        self._key: tuple[int, str, str] | None = None
        """Its place in `_ROUTERS` (set by node_router)."""

    def _queue(self, kind: str, link: str) -> asyncio.Queue[tuple[str, IceOffer]]:
        return self._queues.setdefault((kind, link), asyncio.Queue())

    def start(self) -> None:
        self._users += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        self._users = max(0, self._users - 1)
        if self._users:
            return  # another part of this node still waits for its messages
        if self._key is not None and _ROUTERS.get(self._key) is self:
            del _ROUTERS[self._key]
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                messages = await loop.run_in_executor(None, self.client.signals, POLL_WAIT_S)
            except CoordinatorUnreachable as exc:
                # Expected while the coordinator restarts or is down: the heartbeat (a
                # worker) or the next request (a client) says so to the person.
                log.info("signalling: %s", exc)
                await asyncio.sleep(1.0)
                continue
            except CoordinatorError as exc:
                log.warning("signalling: %s", exc)
                await asyncio.sleep(1.0)
                continue
            for m in messages:
                try:
                    offer = IceOffer.from_dict(m.payload)
                except (IceError, KeyError, TypeError, ValueError) as exc:
                    log.warning("ignoring a malformed signal from %s: %s", m.sender, exc)
                    continue
                kind, link = m.kind, m.link
                base, _, round_ = link.rpartition(".")
                fresh = (kind, link) not in self._queues
                self._queue(kind, link).put_nowait((m.sender, offer))
                if kind == "offer" and round_ == "1" and fresh and self.on_new_offer is not None:
                    task = loop.create_task(self.on_new_offer(m.sender, base))
                    self._handlers.add(task)  # keep a reference until it finishes
                    task.add_done_callback(self._handlers.discard)

    async def receive(self, kind: str, link: str) -> tuple[str, IceOffer]:
        return await self._queue(kind, link).get()

    async def send(self, peer: str, kind: str, link: str, offer: IceOffer) -> None:
        await asyncio.get_running_loop().run_in_executor(
            None, self.client.post_signal, peer, kind, link, offer.to_dict()
        )


_ROUTERS: dict[tuple[int, str, str], SignalRouter] = {}
"""The routers in use, by (event loop, coordinator, node id): one per node per loop."""


def node_router(client: CoordinatorClient) -> SignalRouter:
    """The signalling router of the node `client` speaks for, on this event loop: the
    one already in use by another part of this process speaking as that node (the
    desktop app's chat beside its worker), else a new one. Start it, stop it when done:
    it polls until its last user stopped."""
    key = (id(asyncio.get_running_loop()), client.base_url, client.node_id)
    router = _ROUTERS.get(key)
    if router is None:  # (a router leaves the registry at its last user's stop)
        router = SignalRouter(client)
        router._key = key
        _ROUTERS[key] = router
    return router


def _exchange(
    router: SignalRouter, peer: str, link: str, dialing: bool
) -> Callable[[IceOffer], Awaitable[IceOffer]]:
    """The `exchange` ICE calls once per attempt (round 1, then 2 for the relay-only retry)."""
    rounds = 0

    async def exchange(ours: IceOffer) -> IceOffer:
        nonlocal rounds
        rounds += 1
        key = f"{link}.{rounds}"
        if dialing:
            await router.send(peer, "offer", key, ours)
            return (await router.receive("answer", key))[1]
        _, theirs = await router.receive("offer", key)
        await router.send(peer, "answer", key, ours)
        return theirs

    return exchange


class LinkDialer:
    """Opens authenticated channels to peers: direct first, then ICE."""

    def __init__(
        self,
        creds: NodeCredentials,
        router: SignalRouter | None,
        config: IceConfig | IceConfigSource,
        tuning: QuicTuning,
        direct: bool = True,
    ) -> None:
        self.creds = creds
        self.direct = direct
        self.router = router
        self.config = config
        self.tuning = tuning
        self.sessions: dict[str, IceSession] = {}

    async def dial(self, node_id: str, address: Addr) -> tuple[Channel, IceSession | None]:
        if self.direct or self.router is None:
            try:
                channel = await connect_channel(
                    address, self.creds, node_id, self.tuning, timeout=DIRECT_TIMEOUT_S
                )
                return channel, None
            except (NetError, OSError) as exc:
                if self.router is None:
                    raise
                log.info("direct link to %s failed (%s); trying ICE", node_id, exc)
        link = uuid.uuid4().hex[:16]
        config = await _config_now(self.config)
        session = await establish(True, config, _exchange(self.router, node_id, link, True))
        channel = await connect_channel(
            session.peer_address,
            self.creds,
            node_id,
            self.tuning,
            path_factory=session.path_factory,
        )
        self.sessions[node_id] = session
        log.info("link to %s over ICE (%s, %s policy)", node_id, path_kind(session), session.policy)
        return channel, session

    async def dial_with_path(self, node_id: str, address: Addr) -> tuple[Channel, str]:
        channel, session = await self.dial(node_id, address)
        return channel, path_kind(session)


def serve_ice_offers(
    router: SignalRouter, server: ChannelServer, config: IceConfig | IceConfigSource
) -> None:
    """Answer peers that dial us over ICE and serve them on the node's channel server."""

    async def on_offer(peer: str, link: str) -> None:
        try:
            current = await _config_now(config)
            session = await establish(False, current, _exchange(router, peer, link, False))
            await server.accept_path(session.path_factory, session.peer_address)
            log.info("accepted %s over ICE (%s)", peer, path_kind(session))
        except (NetError, OSError, CoordinatorError) as exc:
            log.warning("ICE link from %s failed: %s", peer, exc)

    router.on_new_offer = on_offer


async def start_links(
    client: CoordinatorClient, creds: NodeCredentials, tuning: QuicTuning
) -> tuple[LinkDialer, SignalRouter]:
    """A running signalling router and a dialer using it (stop the router when done)."""
    config = IceConfigSource(client)
    await asyncio.get_running_loop().run_in_executor(None, config.current)
    router = node_router(client)  # the worker's, when this process also serves as the node
    router.start()
    return LinkDialer(creds, router, config, tuning), router


def channel_dialer(dialer: LinkDialer) -> Callable[[str, Addr], Awaitable[Channel]]:
    async def dial(node_id: str, address: Addr) -> Channel:
        channel, _ = await dialer.dial(node_id, address)
        return channel

    return dial


__all__ = [
    "IceConfigSource",
    "LinkDialer",
    "SignalRouter",
    "channel_dialer",
    "ice_config",
    "path_kind",
    "serve_ice_offers",
]
