"""The API's model server: `Backend` (what the app needs) and `SwarmBackend`, which answers
through the client library (app.client), one connection to the route, many requests
over it, several at once (each request is its own session on the workers)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

from app.client.answer_client import AnswerClient
from app.client.generation import SuspectTokens
from app.client.recovering import RecoveringClient, RouteSource
from app.client.swarm_client import ChannelDialer, SwarmClient
from app.config import Route
from app.errors import ClientError, RouteUnavailable, StageFailed, StageTimeout
from core.admission import LLAMA_MAX_SEQ
from core.guessing import DEFAULT_GUESSES
from core.tokenizer import Tokenizer
from core.types import SamplingParams
from net.channel import NodeCredentials
from net.errors import ErrorCode
from net.quic.links import QuicTuning
from net.wire.tensors import WireDtype

log = logging.getLogger(__name__)

DEFAULT_CONTEXT = 2048
"""Workers' default n_ctx (`WorkerConfig.n_ctx`)."""


class Backend(Protocol):
    """What the API needs from a model server."""

    @property
    def model_name(self) -> str: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def context_length(self) -> int | None:
        """Prompt plus answer tokens a session may hold; None if unknown."""
        ...

    def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams
    ) -> AsyncIterator[list[int] | SuspectTokens]:
        """Tokens as they come, stopping at max_tokens or an end-of-generation token, and
        `SuspectTokens` where the answer is taken back to fewer tokens (a stage that
        computed them was found faulty). Raises `ClientError` when the model cannot
        answer."""
        ...


async def aclose_stream(it: object) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        await close()


def model_name_of(route: Route) -> str:
    """A model id for `/v1/models`: the file's stem for a GGUF path, else the route's name."""
    return Path(route.model).stem if route.model.endswith(".gguf") else route.model


class SwarmBackend:
    """Serves API requests through one `SwarmClient` connection, opened on first use.

    Requests run concurrently (up to `max_concurrent`, by default as many as a stage
    holds sessions, each a session of its own on the workers, which batch them; the
    workers' admission refuses what does not fit, as OVERLOADED with a retry hint).
    If the route is lost (a link dies, a stage stops answering), the connection is
    dropped and the next request reconnects, asking `refresh_route` for a new route
    first when given one (a joined client asks the coordinator). With a `route_source`
    (a joined client: the coordinator's route avoiding given nodes) a running answer
    survives a stage dying: it pauses and continues on a replacement chain
    (app.client.recovering).
    """

    def __init__(
        self,
        creds: NodeCredentials,
        route: Route,
        tokenizer: Tokenizer,
        *,
        model_name: str | None = None,
        context_length: int | None = DEFAULT_CONTEXT,
        tuning: QuicTuning = QuicTuning(),
        dialer: ChannelDialer | None = None,
        refresh_route: Callable[[], Awaitable[Route]] | None = None,
        max_concurrent: int = LLAMA_MAX_SEQ,
        wire_dtype: WireDtype = WireDtype.F32,
        first_token_timeout: float = 60.0,
        step_timeout: float = 40.0,
        route_source: RouteSource | None = None,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be >= 1")
        self.creds = creds
        self.route = route
        self._tokenizer = tokenizer
        self._model_name = model_name or model_name_of(route)
        self._context_length = context_length
        self.tuning = tuning
        self.wire_dtype = wire_dtype
        self.first_token_timeout = first_token_timeout
        self.step_timeout = step_timeout
        self._dialer = dialer
        self._refresh_route = refresh_route
        self._route_source = route_source
        self._client: AnswerClient | None = None
        self._stale = False
        self._connect_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._active = 0

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def context_length(self) -> int | None:
        return self._context_length

    def _make(self) -> AnswerClient:
        if self._route_source is not None:
            return RecoveringClient(
                self.creds,
                self.route,
                self._route_source,
                tuning=self.tuning,
                dialer=self._dialer,
                step_timeout=self.step_timeout,
                first_token_timeout=self.first_token_timeout,
                guesses=DEFAULT_GUESSES,
                vocab_size=self._tokenizer.n_vocab,
            )
        return SwarmClient(
            self.creds,
            self.route,
            self.tuning,
            first_token_timeout=self.first_token_timeout,
            step_timeout=self.step_timeout,
            dialer=self._dialer,
            guesses=DEFAULT_GUESSES,
            vocab_size=self._tokenizer.n_vocab,
        )

    async def _connected(self) -> AnswerClient:
        async with self._connect_lock:
            if self._client is None:
                if self._stale and self._refresh_route is not None:
                    self.route = await self._refresh_route()
                client = self._make()
                try:
                    await client.connect()
                except ClientError:
                    self._stale = True
                    raise
                self._client = client
                self._stale = False
            return self._client

    async def _reroute(self, client: AnswerClient) -> None:
        """Ask for a fresh route; if it differs (the coordinator re-planned around a lost
        stage), reconnect along it on the next request."""
        if self._refresh_route is None:
            return
        try:
            route = await self._refresh_route()
        except Exception as exc:  # the coordinator is unreachable too: keep the old route
            log.warning("could not refresh the route: %s", exc)
            return
        if route != self.route and self._client is client:
            self.route = route
            self._client = None
            await client.close()

    async def _drop(self, client: AnswerClient) -> None:
        if self._client is client:
            self._client = None
            self._stale = True
            await client.close()

    async def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams
    ) -> AsyncIterator[list[int] | SuspectTokens]:
        async with self._slots:
            client = await self._connected()
            events = client.generate(
                prompt_ids,
                max_tokens,
                sampling,
                self.wire_dtype,
                is_end=self._tokenizer.is_end,
            )
            self._active += 1
            try:
                async for event in events:
                    yield event if isinstance(event, SuspectTokens) else list(event.tokens)
            except (RouteUnavailable, StageTimeout):
                await self._drop(client)  # the route is gone: reconnect on the next request
                raise
            except StageFailed as exc:
                if exc.error_code is ErrorCode.STAGE_ERROR:  # e.g. a stage lost its next hop
                    await self._reroute(client)
                raise
            finally:
                self._active -= 1
                await aclose_stream(events)  # sends CLOSE when the caller stops early

    @property
    def active_sessions(self) -> int:
        """Requests being answered now (a status line for the app)."""
        return self._active

    async def aclose(self) -> None:
        async with self._connect_lock:
            if self._client is not None:
                await self._client.close()
                self._client = None
