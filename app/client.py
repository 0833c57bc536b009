"""The client library: open a session along a route, push tokens in, stream tokens out.

The client holds two channels: to the first stage (OPEN, STEP, CLOSE go there and
travel down the chain) and to the last stage (TOKENS come back on it directly). A
stage that fails or vanishes surfaces as a typed `ClientError` within seconds: an ERROR
relayed up the chain, a link that dies, or, at worst, the step deadline.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.config import Route
from app.errors import RouteUnavailable, StageFailed, StageTimeout
from app.wire_convert import sampling_to_wire
from core.types import SamplingParams
from net import wire
from net.channel import Channel, NodeCredentials, connect_channel
from net.errors import NetError
from net.quic import QuicTuning
from net.tensors import WireDtype

DEFAULT_CHUNK = 64


@dataclass(frozen=True)
class TokenEvent:
    tokens: tuple[int, ...]
    step_id: int
    timings: tuple[wire.StageTiming, ...]
    trip_ms: float
    """Client send to TOKENS received, for this step."""
    n_accepted: int = 0
    logits: npt.NDArray[np.float32] | None = None
    """Only from workers configured with return_logits (diagnostics, tests)."""


@dataclass(frozen=True)
class _Failure:
    error: Exception


class SwarmClient:
    def __init__(
        self,
        creds: NodeCredentials,
        route: Route,
        tuning: QuicTuning = QuicTuning(),
        first_token_timeout: float = 60.0,
        step_timeout: float = 40.0,
        dialer: Callable[[str, tuple[str, int]], Awaitable[Channel]] | None = None,
    ) -> None:
        self.creds = creds
        self.route = route
        self.tuning = tuning
        self.first_token_timeout = first_token_timeout
        self.step_timeout = step_timeout
        self._first: Channel | None = None
        self._last: Channel | None = None
        self._queues: dict[str, asyncio.Queue[wire.Frame | _Failure]] = {}
        self._dialer = dialer
        """Opens channels (direct, then ICE through the coordinator); default: direct only."""

    async def connect(self) -> None:
        try:
            self._last = await self._dial(self.route.last.node_id, self.route.last.address)
            if len(self.route.stages) == 1:
                self._first = self._last
            else:
                self._first = await self._dial(self.route.first.node_id, self.route.first.address)
        except (NetError, OSError) as exc:
            await self.close()
            raise RouteUnavailable(str(exc)) from exc

    async def _dial(self, node_id: str, address: tuple[str, int]) -> Channel:
        if self._dialer is not None:
            channel = await self._dialer(node_id, address)
        else:
            channel = await connect_channel(address, self.creds, node_id, self.tuning)
        channel.on_frame = self._frame
        channel.on_close = self._channel_closed
        return channel

    def _frame(self, channel: Channel, frame: wire.Frame) -> None:
        session = getattr(frame, "session", None)
        if session is not None and session in self._queues:
            self._queues[session].put_nowait(frame)

    def _channel_closed(self, channel: Channel, reason: str) -> None:
        peer = channel.peer.node_id if channel.peer else "?"
        for q in self._queues.values():
            q.put_nowait(_Failure(RouteUnavailable(f"link to {peer} lost: {reason}")))

    async def close(self) -> None:
        for ch in {self._first, self._last}:
            if ch is not None:
                ch.close("client done")
        self._first = self._last = None

    async def __aenter__(self) -> SwarmClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        wire_dtype: WireDtype = WireDtype.F32,
        chunk: int = DEFAULT_CHUNK,
        is_end: Callable[[int], bool] = lambda _t: False,
    ) -> AsyncIterator[TokenEvent]:
        """Yield tokens as the last stage sends them; stop at max_tokens or an end token."""
        if self._first is None or self._last is None:
            raise RouteUnavailable("not connected; call connect() first")
        if not prompt:
            raise ValueError("empty prompt")
        name = uuid.uuid4().hex
        queue: asyncio.Queue[wire.Frame | _Failure] = asyncio.Queue()
        self._queues[name] = queue
        first = self._first
        try:
            first.send(
                wire.Open(
                    session=name,
                    model=self.route.model,
                    wire_dtype=wire_dtype,
                    sampling=sampling_to_wire(sampling),
                    reply_to=self.creds.node_id,
                    max_tokens=max_tokens,
                    prompt_len=len(prompt),
                )
            )
            step_id = 0
            sent = time.perf_counter()
            for a in range(0, len(prompt), chunk):  # all chunks at once: stages overlap
                first.send(self._step(name, step_id, a, tuple(prompt[a : a + chunk])))
                step_id += 1
            pos = len(prompt)
            produced = 0
            timeout = self.first_token_timeout
            while True:
                frame = await self._next(queue, timeout)
                logits = (
                    np.frombuffer(frame.logits_sample, dtype=np.float32)
                    if frame.logits_sample
                    else None
                )
                trip_ms = (time.perf_counter() - sent) * 1e3
                event = TokenEvent(
                    frame.tokens, frame.step_id, frame.timings, trip_ms, frame.n_accepted, logits
                )
                yield event
                produced += len(frame.tokens)
                last = frame.tokens[-1]
                if produced >= max_tokens or frame.finished or is_end(last):
                    break
                timeout = self.step_timeout
                sent = time.perf_counter()
                first.send(self._step(name, step_id, pos, (last,)))
                pos += 1
                step_id += 1
        finally:
            del self._queues[name]
            if not first.closed.done():
                first.send(wire.Close(name, "done"))

    @staticmethod
    def _step(session: str, step_id: int, start: int, tokens: tuple[int, ...]) -> wire.Step:
        return wire.Step(
            session=session,
            step_id=step_id,
            start=start,
            tokens=tokens,
            hidden=None,
            n_rows=len(tokens),
            width=0,
            wire_dtype=WireDtype.F32,
            sent_at_ns=time.time_ns(),
        )

    async def _next(
        self, queue: asyncio.Queue[wire.Frame | _Failure], timeout: float
    ) -> wire.Tokens:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), timeout)
            except TimeoutError:
                raise StageTimeout(f"no answer from the route within {timeout:.0f} s") from None
            if isinstance(item, _Failure):
                raise item.error
            if isinstance(item, wire.Error):
                raise StageFailed(item.code.name, item.message)
            if isinstance(item, wire.Tokens):
                return item
