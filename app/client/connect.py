"""Connecting a client to the swarm: the one way the chat CLI, the demos, the API and the
desktop app do it.

A joined client (it has an identity) reaches peers through links the coordinator helps
open (ICE, for peers behind NAT); a client on a known route with static credentials
(a loopback swarm, tests) dials the workers directly. Either way the result is a
`ChatConnection`: the connected client, the tokenizer for its model and what to close.

A joined client's answers survive a stage dying mid-way: its client is a
`RecoveringClient` whose route source asks the coordinator for a route avoiding the
dead stage (app.client.recovering), so the person sees a pause, not an error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.client.answer_client import AnswerClient
from app.client.recovering import DEFAULT_POLICY, RecoveringClient, RouteSource
from app.client.recovery import RecoveryPolicy
from app.client.route import fetch_route, route_avoiding
from app.client.swarm_client import ChannelDialer, SwarmClient
from app.config import Route
from app.identity import Identity
from app.links.paths import channel_dialer, start_links
from core.guessing import DEFAULT_GUESSES
from core.tokenizer import Tokenizer
from net.channel import NodeCredentials
from net.quic.links import QuicTuning

Closer = Callable[[], Awaitable[None]]


@dataclass
class ChatConnection:
    client: AnswerClient
    tokenizer: Tokenizer
    stages: int
    closers: list[Closer] = field(default_factory=list)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()
        for close in self.closers:
            with contextlib.suppress(Exception):
                await close()
        self.tokenizer.close()

    async def connected(self) -> ChatConnection:
        """Connect the client; on failure release everything gathered so far."""
        try:
            await self.client.connect()
        except BaseException:
            await self.close()
            raise
        return self


ChatConnector = Callable[[], Awaitable[ChatConnection]]


@dataclass(frozen=True)
class JoinedLinks:
    """Links to peers through the coordinator, for a client that joined the swarm."""

    dialer: ChannelDialer
    stop: Closer


async def joined_links(identity: Identity) -> JoinedLinks:
    """Start the link router for `identity` (ICE through its coordinator); `stop` ends it."""
    link_dialer, router = await start_links(identity.client(), identity.credentials(), QuicTuning())
    return JoinedLinks(channel_dialer(link_dialer), router.stop)


async def open_chat(
    creds: NodeCredentials,
    route: Route,
    tokenizer_gguf: Path,
    *,
    tuning: QuicTuning = QuicTuning(),
    dialer: ChannelDialer | None = None,
    closers: tuple[Closer, ...] = (),
    route_source: RouteSource | None = None,
    policy: RecoveryPolicy = DEFAULT_POLICY,
) -> ChatConnection:
    """Load the tokenizer and connect a client along `route` (direct dials unless a
    `dialer` is given); `closers` run when the connection closes, or at once if it fails.
    With a `route_source` (node ids to avoid -> a route without them) the client
    continues an answer on a replacement chain when a stage dies."""
    loop = asyncio.get_running_loop()
    try:
        tokenizer = await loop.run_in_executor(None, Tokenizer.from_gguf, tokenizer_gguf)
    except BaseException:
        for close in closers:
            with contextlib.suppress(Exception):
                await close()
        raise
    vocab = tokenizer.n_vocab
    client: AnswerClient = (
        SwarmClient(creds, route, tuning, dialer=dialer, guesses=DEFAULT_GUESSES, vocab_size=vocab)
        if route_source is None
        else RecoveringClient(
            creds,
            route,
            route_source,
            policy,
            tuning,
            dialer,
            guesses=DEFAULT_GUESSES,
            vocab_size=vocab,
        )
    )
    return await ChatConnection(client, tokenizer, len(route.stages), list(closers)).connected()


def avoiding_source(identity: Identity, model: str = "default") -> RouteSource:
    """The coordinator's route for `model` without the given nodes (stages found dead
    mid-answer)."""

    async def source(avoid: tuple[str, ...]) -> Route:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, route_avoiding, identity, avoid, model)

    return source


async def open_joined_chat(
    identity: Identity,
    route: Route,
    tokenizer_gguf: Path,
    policy: RecoveryPolicy = DEFAULT_POLICY,
    model: str = "default",
) -> ChatConnection:
    """A connection as the joined `identity`: links through its coordinator, answers
    continued on a route (for `model`, which `route` serves) avoiding a stage that died."""
    links = await joined_links(identity)
    return await open_chat(
        identity.credentials(),
        route,
        tokenizer_gguf,
        dialer=links.dialer,
        closers=(links.stop,),
        route_source=avoiding_source(identity, model),
        policy=policy,
    )


def identity_connector(
    identity_dir: Path, coordinator: str | None = None, model: str = "default"
) -> ChatConnector:
    """Chat through the swarm this PC joined: route from the coordinator (`coordinator`
    if set, else the one the invite named) for `model` (the swarm's default unless
    named), ICE links."""

    async def connect() -> ChatConnection:
        loop = asyncio.get_running_loop()
        identity = await loop.run_in_executor(None, Identity.load, identity_dir)
        identity = identity.with_coordinator(coordinator)
        route, tokenizer_path = await loop.run_in_executor(None, fetch_route, identity, model)
        return await open_joined_chat(identity, route, tokenizer_path, model=model)

    return connect


def direct_connector(
    creds: NodeCredentials, route: Route, tokenizer_gguf: Path, tuning: QuicTuning = QuicTuning()
) -> ChatConnector:
    """Chat over a known route with direct links (a loopback swarm, tests)."""

    async def connect() -> ChatConnection:
        return await open_chat(creds, route, tokenizer_gguf, tuning=tuning)

    return connect
