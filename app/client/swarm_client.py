"""The client library: open a session along a route, push tokens in, stream tokens out.

The client holds two channels: to the first stage (OPEN, STEP, CLOSE go there and
travel down the chain) and to the last stage (TOKENS come back on it directly). In plain
and n-gram-guessed decoding the last stage sends each next step to the first stage
itself (the ring, app.serving.links.ring) and the client only reads; a TOKENS not marked
`looped` hands the turn back to it. When the
path of either dies, the client dials again (within `relink_timeout`) and the running
generations continue: the first stage is sent each session's OPEN and unconfirmed STEPs
again (net.resend_log), the last stage sends the TOKENS since the client's last turn again
(session_rules), and duplicates are
ignored on both sides. A stage that fails or vanishes surfaces as a typed `ClientError`:
an ERROR relayed up the chain, a stage that cannot be reached again, or at worst the
step deadline.

What to send and what an answer means is one answer's `Generation`
(app.client.generation, no IO); this module moves its frames and keeps the links.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from app.client.generation import (
    DEFAULT_CHUNK,
    NO_GUESSES,
    Finished,
    Generation,
    Refused,
    TokenEvent,
    ring_loop,
)
from app.config import Route
from app.errors import RouteUnavailable, StageTimeout
from app.links.redial import dial_until
from app.session.replay_resume import ResumeRef
from app.session.replay_shapes import Segment
from core.guessing import GuessPolicy
from core.types import SamplingParams
from net import wire
from net.channel import Channel, NodeCredentials, connect_channel
from net.errors import NetError
from net.quic.links import QuicTuning
from net.resend_log import ResendLog
from net.wire.tensors import WireDtype

__all__ = [
    "DEFAULT_CHUNK",
    "NO_GUESSES",
    "ChannelDialer",
    "Dial",
    "SwarmClient",
    "TokenEvent",
    "next_dial",
]

ChannelDialer = Callable[[str, tuple[str, int]], Awaitable[Channel]]
"""(node id, address) -> an authenticated channel to it."""


@dataclass(frozen=True)
class _Failure:
    error: Exception


# ---------------------------------------------------------------- pure decisions


class Dial(Enum):
    """Which link to open next (`next_dial`)."""

    LAST = "last"
    FIRST = "first"
    FIRST_IS_LAST = "first is last"
    """A one-stage route: the first stage's link is the last stage's."""


def next_dial(have_first: bool, have_last: bool, one_stage: bool) -> Dial | None:
    """The next link to open, or None when both are there. The last stage comes first:
    the sessions' TOKENS must have a way back before the first stage is sent their
    OPEN and STEPs again."""
    if not have_last:
        return Dial.LAST
    if not have_first:
        return Dial.FIRST_IS_LAST if one_stage else Dial.FIRST
    return None


class SwarmClient:
    def __init__(
        self,
        creds: NodeCredentials,
        route: Route,
        tuning: QuicTuning = QuicTuning(),
        first_token_timeout: float = 60.0,
        step_timeout: float = 40.0,
        dialer: ChannelDialer | None = None,
        relink_timeout: float = 20.0,
        guesses: GuessPolicy = NO_GUESSES,
        ring: bool = True,
        vocab_size: int | None = None,
    ) -> None:
        self.creds = creds
        self.vocab_size = vocab_size
        """The model's vocabulary: TOKENS naming ids past it are refused
        (app.client.token_checks); None: not known."""
        self.ring = ring
        """Decoding goes round the ring (app.serving.links.ring), plain or with n-gram guesses:
        the last stage sends each next step to the first stage itself. False: this
        client sends every step."""
        self.guesses = guesses
        """Guessing ahead for generations that do not choose (core.guessing). Plain by
        default here, so a library caller gets plain decoding's exact rows unless it asks;
        what people use passes `core.guessing.DEFAULT_GUESSES` (adaptive) or their
        `--guesses` (app/cli/chat.py, the connect wiring)."""
        self.route = route
        self.tuning = tuning
        self.first_token_timeout = first_token_timeout
        self.step_timeout = step_timeout
        self.relink_timeout = relink_timeout
        self._first: Channel | None = None
        self._last: Channel | None = None
        self._queues: dict[str, asyncio.Queue[wire.Frame | _Failure]] = {}
        self._dialer = dialer
        """Opens channels (direct, then ICE through the coordinator); default: direct only."""
        self._sent = ResendLog()
        """What the first stage must be sent again if its link is replaced."""
        self._relinking: asyncio.Task[None] | None = None
        self._closing = False
        self.relinks = 0
        """Links replaced while generations were running."""

    @property
    def linked(self) -> frozenset[str]:
        """Node ids this client holds an open link to (they are alive as far as it knows)."""
        pairs = ((self._first, self.route.first), (self._last, self.route.last))
        return frozenset(st.node_id for ch, st in pairs if ch is not None and not ch.closed.done())

    async def connect(self) -> None:
        self._closing = False
        try:
            await self._open_missing(self._dial)
        except RouteUnavailable:
            await self.close()
            raise

    async def _dial(self, node_id: str, address: tuple[str, int], timeout: float = 10.0) -> Channel:
        if self._dialer is not None:
            channel = await asyncio.wait_for(self._dialer(node_id, address), timeout)
        else:
            channel = await connect_channel(address, self.creds, node_id, self.tuning, timeout)
        channel.on_frame = self._frame
        channel.on_close = self._channel_closed
        return channel

    def _frame(self, channel: Channel, frame: wire.Frame) -> None:
        session = getattr(frame, "session", None)
        if session is not None and session in self._queues:
            self._queues[session].put_nowait(frame)

    def _channel_closed(self, channel: Channel, reason: str) -> None:
        if self._closing or channel not in (self._first, self._last):
            return
        if channel is self._first:
            self._first = None
        if channel is self._last:
            self._last = None
        if not self._queues:
            return  # nothing running: the next generate() dials again
        if self._relinking is None or self._relinking.done():
            self._relinking = asyncio.get_running_loop().create_task(self._relink(reason))

    async def _relink(self, reason: str) -> None:
        """Dial the lost link(s) again and resume every running generation on them."""
        try:
            await self._open_missing(self._dial_patiently)
        except RouteUnavailable as exc:
            for q in self._queues.values():
                q.put_nowait(_Failure(RouteUnavailable(f"link lost ({reason}): {exc}")))
            return
        self.relinks += 1

    async def _open_missing(self, dial: ChannelDialer) -> None:
        """Dial whichever link is missing (the other may die meanwhile, hence the loop);
        the first stage then gets each running session's OPEN and unconfirmed STEPs again."""
        route = self.route
        try:
            while (
                step := next_dial(
                    self._first is not None, self._last is not None, len(route.stages) == 1
                )
            ) is not None:
                if step is Dial.LAST:
                    self._last = await dial(route.last.node_id, route.last.address)
                    continue
                if step is Dial.FIRST_IS_LAST:
                    self._first = self._last
                else:
                    self._first = await dial(route.first.node_id, route.first.address)
                assert self._first is not None
                for frame in self._sent.to_resend():
                    self._first.send(frame)
        except (NetError, OSError, TimeoutError) as exc:
            # A bare TimeoutError has no text: say what timed out, not an empty reason.
            raise RouteUnavailable(str(exc) or "dialling the route's stages timed out") from exc

    async def _dial_patiently(self, node_id: str, address: tuple[str, int]) -> Channel:
        """Dial again until `relink_timeout`, unless the stage is gone (see app.links.redial)."""
        return await dial_until(
            lambda time_left: self._dial(node_id, address, time_left),
            self.relink_timeout,
            f"stage {node_id}",
            stop_when_unreachable=self._dialer is None,
        )

    def _send_first(self, frame: wire.Frame) -> None:
        """To the first stage now, or, while its link is redialled, with the frames resent."""
        self._sent.record(frame)
        if self._first is not None and not self._first.closed.done():
            self._first.send(frame)
            if isinstance(frame, wire.Step):
                self._first.flush()  # now, ahead of the ACK to the last stage queued before

    async def close(self) -> None:
        self._closing = True
        if self._relinking is not None and not self._relinking.done():
            self._relinking.cancel()
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
        guesses: GuessPolicy | None = None,
        session: str | None = None,
        resume: ResumeRef | None = None,
        segments: Sequence[Segment] | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Yield tokens as the last stage sends them; stop at max_tokens or an end token.

        `session` names the new session (default: a random id); `resume`, for a replay
        after a reroute, names the session it continues, whose KV a last stage that kept
        it hands over (app.session.replay_resume). `segments`: how the prompt is cut into steps
        (default: chunks of `chunk`); a replay gives its rows the first run's shapes
        (app.session.replay_shapes).

        Each step may also carry n-gram guesses that one trip verifies
        (app.session.guess_tracker; `guesses`, default the client's own `self.guesses`); an
        event then holds every token that trip confirmed."""
        if self._relinking is not None and not self._relinking.done():
            await asyncio.shield(self._relinking)
        if self._first is None or self._last is None:
            if self._closing:
                raise RouteUnavailable("the client is closed")
            # Not connected yet, or a link died while idle.
            await self._open_missing(self._dial_patiently)
        if guesses is None:
            guesses = self.guesses
        route = self.route
        gen = Generation(
            session or uuid.uuid4().hex,
            route.model,
            self.creds.node_id,
            prompt,
            max_tokens,
            sampling=sampling,
            wire_dtype=wire_dtype,
            chunk=chunk,
            is_end=is_end,
            guesses=guesses,
            loop=ring_loop(route, self.creds.node_id, guesses, self.ring),
            resume=resume,
            segments=segments,
            vocab_size=self.vocab_size,
        )
        queue: asyncio.Queue[wire.Frame | _Failure] = asyncio.Queue()
        self._queues[gen.session] = queue
        try:
            for frame in gen.opening(time.perf_counter(), time.time_ns()):
                self._send_first(frame)
            while True:
                timeout = self.step_timeout if gen.answered else self.first_token_timeout
                frame = await self._next(queue, timeout)
                for event in gen.receive(frame, time.perf_counter()):
                    if isinstance(event, TokenEvent):
                        yield event
                    elif isinstance(event, Refused):
                        raise event.error
                    elif isinstance(event, Finished):
                        return
                if gen.has_turn:
                    step = gen.next_step(time.perf_counter(), time.time_ns())
                    if step is not None:
                        self._send_first(step)
        finally:
            del self._queues[gen.session]
            self._send_first(gen.close())

    async def _next(
        self, queue: asyncio.Queue[wire.Frame | _Failure], timeout: float
    ) -> wire.Frame:
        """The session's next frame (the Generation tells what it means); a lost route
        or the deadline raise."""
        try:
            # asyncio.timeout, not wait_for: wait_for wraps the get in a task of its
            # own, a task and two loop turns more on every token's path.
            async with asyncio.timeout(timeout):
                item = await queue.get()
        except TimeoutError:
            raise StageTimeout(f"no answer from the route within {timeout:.0f} s") from None
        if isinstance(item, _Failure):
            raise item.error
        return item
