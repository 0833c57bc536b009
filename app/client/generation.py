"""One answer's protocol without IO: the frames a client sends and what the frames it
gets back mean (h11's and aioquic's manner: the caller moves the bytes and keeps time).

A `Generation` builds the session's OPEN (sampling, limits, the ring it asks for, the
resume fields of a replay: app.session.replay_resume) and the STEPs of its prompt
(chunks, or a replay's first shapes: app.session.replay_shapes), then turns each frame
the route sends back into typed events: tokens accepted (`TokenEvent`), guesses the last
stage rejected, finished (with why), refused (with a typed `ClientError`). Where the
client has the turn (no ring, MTP guesses, a pause), it builds the next STEP with the
n-gram or MTP guesses the `GuessTracker` chooses (app.session.guess_tracker).

Clocks come in as arguments (`now`: a monotonic second count, for a trip's duration;
`wall_ns`: the wall clock a STEP carries), so every decision replays in a unit test.
`SwarmClient.generate` (app.client.swarm_client) is the asyncio shell around it.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.client.token_checks import Asked, tokens_problem
from app.config import Route
from app.errors import BadTokens, ClientError, StageFailed, stage_error
from app.session.guess_tracker import GuessTracker
from app.session.replay_resume import ResumeRef
from app.session.replay_shapes import Segment, plain_segments
from app.session.token_step import token_step
from app.session.wire_values import sampling_to_wire
from core.guessing import NGRAM, GuessPolicy
from core.types import SamplingParams
from net import wire
from net.wire.checks import MAX_RING_GUESSES
from net.wire.tensors import WireDtype

DEFAULT_CHUNK = 64
NO_GUESSES = GuessPolicy.fixed(0)


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class TokenEvent:
    """Tokens accepted: what one step's TOKENS added to the answer."""

    tokens: tuple[int, ...]
    step_id: int
    timings: tuple[wire.StageTiming, ...]
    trip_ms: float
    """Client send to TOKENS received, for this step."""
    n_accepted: int = 0
    logits: npt.NDArray[np.float32] | None = None
    """Only from workers configured with return_logits (diagnostics, tests)."""
    n_guesses: int = 0
    """Guesses the step carried (n_accepted of them stood)."""
    looped: bool = False
    """The last stage sent the next step to the first stage itself (the ring)."""


@dataclass(frozen=True)
class SuspectTokens:
    """Tokens of this answer that a stage later found faulty helped compute: the answer
    goes on from `first` (its tokens `first` .. `first + count - 1` are taken back and
    computed again on a chain without `nodes`), as if they had never been sent."""

    first: int
    """Index of the first suspect token among the answer's generated tokens."""
    count: int
    nodes: tuple[str, ...]
    """The faulty nodes (the coordinator's spot checks convicted them)."""


AnswerEvent = TokenEvent | SuspectTokens
"""What an answer's stream carries: tokens, or tokens taken back (app.client.recovering)."""


def apply_event(answer: list[int], event: AnswerEvent) -> None:
    """`answer` (its tokens so far) after `event`: its tokens added, or cut back to the
    first `event.first` where they are taken back."""
    if isinstance(event, SuspectTokens):
        del answer[event.first :]
    else:
        answer.extend(event.tokens)


async def answer_of(events: AsyncIterator[AnswerEvent]) -> list[int]:
    """The tokens an answer's stream ends with."""
    answer: list[int] = []
    async for event in events:
        apply_event(answer, event)
    return answer


@dataclass(frozen=True)
class GuessesRejected:
    """The last stage turned down guesses of the step `step_id`: every stage holds them
    past the answer until the next step's `keep_until` cuts them."""

    step_id: int
    rejected: int


class FinishReason(enum.Enum):
    END_TOKEN = "end token"
    """The model chose an end token (the answer stops right after it)."""
    MAX_TOKENS = "max tokens"
    """The answer reached `max_tokens` (counted here, or by the last stage)."""


@dataclass(frozen=True)
class Finished:
    reason: FinishReason


@dataclass(frozen=True)
class Refused:
    """The generation cannot go on: a stage's ERROR (`StageFailed`, `Overloaded`) or
    TOKENS that break the protocol (`ClientError`)."""

    error: ClientError


Event = TokenEvent | GuessesRejected | Finished | Refused


# ---------------------------------------------------------------- pure decisions


def ring_loop(route: Route, own_node: str, guesses: GuessPolicy, ring: bool) -> wire.Loop | None:
    """The ring an OPEN asks for (app.serving.links.ring), or None where the client sends
    every step itself."""
    loops = (
        ring
        # n-gram guesses the last stage can propose round the ring; MTP ones are its
        # head's, offered to whoever builds the step: the client keeps that turn.
        and (guesses.max_guesses == 0 or guesses.source == NGRAM)
        and guesses.max_guesses <= MAX_RING_GUESSES
        and len(route.stages) > 1
        # A last stage on this node would be taken for the client resuming its link.
        and route.last.node_id not in (own_node, route.first.node_id)
    )
    if not loops:
        return None
    first, last = route.first, route.last
    return wire.Loop(
        first.node_id,
        wire.Loop.address_text(first.address),
        last.node_id,
        guesses.max_guesses,
        guesses.adaptive,
    )


def answer_to(item: wire.Frame, step_id: int) -> wire.Tokens | None:
    """The TOKENS answering `step_id`, None for anything else (TOKENS of earlier steps,
    sent again after a relink); an ERROR for the session raises `StageFailed`."""
    if isinstance(item, wire.Error):
        raise stage_error(item.code, item.message)
    if isinstance(item, wire.Tokens) and item.step_id == step_id:
        return item
    return None


class _Phase(enum.Enum):
    NEW = "new"
    WAITING = "waiting"
    """A step is out (the client's or the ring's); its TOKENS are awaited."""
    TURN = "turn"
    """TOKENS came and the answer goes on: `next_step` is due."""
    OVER = "over"


class Generation:
    """One answer of one session, from OPEN to CLOSE (no IO, no clock of its own).

    Call `opening` once and send its frames; then for each frame of the session
    `receive`, and after events that leave the answer going on (`has_turn`), `next_step`
    (None: the ring sent the step). `close` is the CLOSE to send whatever happened."""

    def __init__(
        self,
        session: str,
        model: str,
        reply_to: str,
        prompt: Sequence[int],
        max_tokens: int,
        *,
        sampling: SamplingParams = SamplingParams(),
        wire_dtype: WireDtype = WireDtype.F32,
        chunk: int = DEFAULT_CHUNK,
        is_end: Callable[[int], bool] = lambda _t: False,
        guesses: GuessPolicy = NO_GUESSES,
        loop: wire.Loop | None = None,
        resume: ResumeRef | None = None,
        segments: Sequence[Segment] | None = None,
        vocab_size: int | None = None,
    ) -> None:
        if not prompt:
            raise ValueError("empty prompt")
        self.session = session
        self._model = model
        self._reply_to = reply_to
        self._prompt = tuple(prompt)
        self._max_tokens = max_tokens
        self._sampling = sampling
        self._wire_dtype = wire_dtype
        self._is_end = is_end
        self._vocab_size = vocab_size
        """Token ids of the model are below it (app.client.token_checks); None: unknown."""
        self.loop = loop
        """The ring the OPEN asks for (`ring_loop`); None: the client sends every step."""
        self._resume = resume
        self._segments = plain_segments(len(prompt), chunk) if segments is None else segments
        self._guessing = GuessTracker(prompt, max_tokens, guesses)
        self._phase = _Phase.NEW
        self._next_id = 0
        """The id of the next step sent; the awaited step is the one before it."""
        self._sent_at = 0.0
        """`now` when the awaited step went (or, round the ring, the previous TOKENS came)."""
        self._n_guesses = 0
        """Guesses of the client's own awaited step."""
        self._went_round = False
        """The awaited step is the ring's, not the client's."""
        self.answered = False
        """TOKENS came for at least one step (the first token's deadline is longer)."""

    @property
    def awaited_step(self) -> int:
        return self._next_id - 1

    @property
    def has_turn(self) -> bool:
        """TOKENS came and the answer goes on: call `next_step`."""
        return self._phase is _Phase.TURN

    @property
    def over(self) -> bool:
        return self._phase is _Phase.OVER

    def opening(self, now: float, wall_ns: int) -> list[wire.Frame]:
        """The OPEN and the prompt's STEPs, all at once (the stages overlap them)."""
        if self._phase is not _Phase.NEW:
            raise RuntimeError("a generation opens once")
        resume = self._resume
        frames: list[wire.Frame] = [
            wire.Open(
                session=self.session,
                model=self._model,
                wire_dtype=self._wire_dtype,
                sampling=sampling_to_wire(self._sampling),
                reply_to=self._reply_to,
                max_tokens=self._max_tokens,
                prompt_len=len(self._prompt),
                resumes="" if resume is None else resume.session,
                resume_held=0 if resume is None else resume.held,
                resume_digest=b"" if resume is None else resume.digest,
                resume_from_layer=None if resume is None else resume.from_layer,
                loop=self.loop,
            )
        ]
        for seg in self._segments:
            rows = self._prompt[seg.start : seg.start + seg.rows]
            frames.append(self._step(seg.start, rows, one_by_one=seg.one_by_one, wall_ns=wall_ns))
        self._sent_at = now
        self._phase = _Phase.WAITING
        return frames

    def receive(self, frame: wire.Frame, now: float) -> tuple[Event, ...]:
        """What a frame of the session means; () for frames that answer nothing awaited
        (TOKENS of earlier steps, sent again after a relink; a CLOSE, which stages send
        only down the chain)."""
        if self._phase is not _Phase.WAITING or getattr(frame, "session", None) != self.session:
            return ()
        try:
            answer = answer_to(frame, self.awaited_step)
        except StageFailed as exc:
            return self._refuse(exc)
        if answer is None:
            return ()
        return self._take(answer, now)

    def next_step(self, now: float, wall_ns: int) -> wire.Step | None:
        """The step after the latest TOKENS: the client's to send, or None where the ring
        sent it (its TOKENS are awaited all the same)."""
        if self._phase is not _Phase.TURN:
            raise RuntimeError("no TOKENS to answer with a step")
        self._sent_at = now
        self._phase = _Phase.WAITING
        if self._went_round:
            self._next_id += 1
            return None
        nxt = self._guessing.next_step()
        self._n_guesses = len(nxt.guesses)
        return self._step(
            nxt.start, nxt.tokens, guesses=nxt.guesses, keep_until=nxt.keep_until, wall_ns=wall_ns
        )

    def close(self) -> wire.Close:
        """The CLOSE that frees the session on every stage (sent however it ended)."""
        self._phase = _Phase.OVER
        return wire.Close(self.session, "done")

    def _take(self, frame: wire.Tokens, now: float) -> tuple[Event, ...]:
        trip_ms = (now - self._sent_at) * 1e3
        carried = frame.guessed if self._went_round else self._n_guesses
        logits = np.frombuffer(frame.logits_sample, np.float32) if frame.logits_sample else None
        asked = Asked(
            carried,
            room=self._max_tokens - self._guessing.produced,
            sampling=self._sampling,
            round_the_ring=self._went_round,
            vocab_size=self._vocab_size,
        )
        problem = tokens_problem(frame, asked, logits)
        if problem is not None:  # none of it is taken: the answer is replayed elsewhere
            return self._refuse(BadTokens(f"TOKENS of step {frame.step_id}: {problem}"))
        tokens = frame.tokens
        ended = next((i for i, t in enumerate(tokens) if self._is_end(t)), None)
        if ended is not None:  # an accepted guess may be the end: stop right there
            tokens = tokens[: ended + 1]
        event = TokenEvent(
            tokens,
            frame.step_id,
            frame.timings,
            trip_ms,
            frame.n_accepted,
            logits,
            carried,
            frame.looped,
        )
        self.answered = True
        try:
            if self._went_round:
                self._guessing.went_round(frame.tokens, frame.guessed - frame.n_accepted)
            else:
                self._guessing.reply(frame.tokens, frame.n_accepted, trip_ms, frame.guesses)
        except ClientError as exc:  # the tokens stand as sent; nothing after them does
            return (event, *self._refuse(exc))
        events: list[Event] = [event]
        if carried > frame.n_accepted:
            events.append(GuessesRejected(frame.step_id, carried - frame.n_accepted))
        if ended is not None:
            return (*events, self._finish(FinishReason.END_TOKEN))
        if self._guessing.produced >= self._max_tokens or frame.finished:
            return (*events, self._finish(FinishReason.MAX_TOKENS))
        if frame.looped and self.loop is None:
            error = ClientError(f"TOKENS of step {frame.step_id} went round unasked")
            return (*events, *self._refuse(error))
        self._went_round = frame.looped
        self._phase = _Phase.TURN
        return tuple(events)

    def _finish(self, reason: FinishReason) -> Finished:
        self._phase = _Phase.OVER
        return Finished(reason)

    def _refuse(self, error: ClientError) -> tuple[Event, ...]:
        self._phase = _Phase.OVER
        return (Refused(error),)

    def _step(
        self,
        start: int,
        tokens: tuple[int, ...],
        *,
        guesses: tuple[int, ...] = (),
        keep_until: int | None = None,
        one_by_one: bool = False,
        wall_ns: int,
    ) -> wire.Step:
        step = token_step(
            self.session,
            self._next_id,
            start,
            tokens,
            guesses=guesses,
            keep_until=keep_until,
            one_by_one=one_by_one,
            sent_at_ns=wall_ns,
        )
        self._next_id += 1
        return step
