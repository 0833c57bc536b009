"""The ring: the last stage sends each decode step straight to the first stage.

Without it a token's trip is client -> first stage -> ... -> last stage -> client, and the
client turns every TOKENS into the next STEP: two links and a loop turn of the client's
on every token. With it (the client names the first stage in `Open.loop`) the last stage
sends the step of the token it chose to the first stage itself and TOKENS to the client
beside it, marked `looped`: the client link leaves the token's path. Over a WAN that is
one delay a token fewer of N+1; on one machine, a process fewer woken per token.

The last stage goes round only where the client would have sent that step itself: the
generation not finished, no MTP guesses riding back, the reply answering the step just
taken. A plain ring (`Loop.guesses` 0) carries one token a step, as the client would;
with guesses the ring proposes them itself (`RingGuesses`: the client's `GuessTracker` on
the session's tokens, timed by the ring's own trips), so guessed decoding goes round
too. Everything else keeps the client's path, and a TOKENS without `looped` tells the
client to send the next step.

The links to first stages are `app.serving.links.downstream.Downstream`s: dialled lazily (the
OPEN goes first, as the first stage takes the session's STEPs only from the last stage
its OPEN names), resent after a lost path, and given up on with a typed error to the
client, who then replays the generation on another route.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from app.config import Hop
from app.errors import ClientError
from app.serving.links.downstream import Dialer, Downstream
from app.serving.worker_state import ServedSession
from app.session.guess_tracker import GuessTracker
from app.session.token_step import token_step
from core.guessing import GuessPolicy
from net import wire
from net.channel import Channel, NodeCredentials
from net.errors import ErrorCode
from net.quic.links import QuicTuning

log = logging.getLogger(__name__)


def looped_step(open_: wire.Open, step: wire.Step, reply: wire.Tokens) -> wire.Step | None:
    """The step the client would send after `reply`, when the last stage may send it to
    the first stage instead (pure): None where the client keeps the turn."""
    if not may_go_round(open_, step, reply) or step.guesses or len(reply.tokens) != 1:
        return None
    # The chosen token's step, as the client would build it.
    return token_step(
        step.session,
        step.step_id + 1,
        step.start + step.n_rows,
        reply.tokens,
        sent_at_ns=time.time_ns(),
    )


@dataclass
class _Guessed:
    tracker: GuessTracker
    sent_step: int
    """The step id of the last step the ring sent."""
    sent_at: float
    """time.perf_counter() when it went: its answer's trip."""


class RingGuesses:
    """The guesses of every session that guesses round the ring (no IO): per session the
    client's `GuessTracker`, fed the last stage's answers. Where the answered step was
    not the ring's (the prompt's last chunk, a step of the client's after a pause), the
    tracker starts again from the tokens the stage holds."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Guessed] = {}

    def next_step(
        self, session: ServedSession, step: wire.Step, reply: wire.Tokens, now: float
    ) -> wire.Step | None:
        """The step after `reply`, with the guesses the tracker chooses; None where the
        client keeps the turn (`may_go_round`)."""
        loop = session.open.loop
        if loop is None or not loop.guesses or not may_go_round(session.open, step, reply):
            return None
        name = step.session
        held = self._sessions.get(name)
        if held is not None and held.sent_step == step.step_id:
            try:
                held.tracker.reply(reply.tokens, reply.n_accepted, (now - held.sent_at) * 1e3)
            except ClientError:  # an answer that does not fit the step: start again below
                held = None
        else:
            held = None
        if held is None:
            # The stage's tokens before this step's guesses, then the answer's tokens.
            known = session.history[: step.start + step.n_rows - len(step.guesses)]
            policy = GuessPolicy(max_guesses=loop.guesses, adaptive=loop.adaptive)
            tracker = GuessTracker(known, session.open.max_tokens, policy)
            tracker.produced = session.generated - len(reply.tokens)
            tracker.went_round(reply.tokens, len(step.guesses) - reply.n_accepted)
            held = self._sessions[name] = _Guessed(tracker, -1, now)
        nxt = held.tracker.next_step()
        held.sent_step, held.sent_at = step.step_id + 1, now
        return token_step(
            step.session,
            step.step_id + 1,
            nxt.start,
            nxt.tokens,
            guesses=nxt.guesses,
            keep_until=nxt.keep_until,
            sent_at_ns=time.time_ns(),
        )

    def sent(self, session: str, step_id: int) -> bool:
        """The ring sent this step (with the guesses it carries)."""
        held = self._sessions.get(session)
        return held is not None and held.sent_step == step_id

    def forget(self, session: str) -> None:
        self._sessions.pop(session, None)


def may_go_round(open_: wire.Open, step: wire.Step, reply: wire.Tokens) -> bool:
    """Whether the last stage may send the step after `reply` itself (pure)."""
    if open_.loop is None or reply.finished or reply.guesses:
        return False
    if reply.step_id != step.step_id:
        return False
    return step.start + step.n_rows >= open_.prompt_len  # not a chunk before the last


ErrorSink = Callable[[str, ErrorCode, str], None]
"""(session, code, message): a session the ring cannot carry on."""


class Ring:
    """A last stage's links to the first stages of its sessions' routes (one per first
    stage: sessions may come through this stage from different first stages)."""

    def __init__(
        self,
        creds: NodeCredentials,
        tuning: QuicTuning,
        on_failed: ErrorSink,
        dialer: Dialer | None = None,
        relink_timeout: float = 20.0,
    ) -> None:
        self._creds = creds
        self._tuning = tuning
        self._on_failed = on_failed
        self._dialer = dialer
        self._relink_timeout = relink_timeout
        self._links: dict[str, Downstream] = {}
        """First stage node id -> the link to it."""
        self._route_of: dict[str, str] = {}
        """Session -> the first stage its steps go round to."""
        self._dirty: set[Downstream] = set()
        self._guesses = RingGuesses()

    def open(self, frame: wire.Open) -> None:
        """A session asking for the ring began here: its OPEN goes to the first stage now,
        so the link is dialled while the prompt computes."""
        if frame.loop is None:
            return
        node = frame.loop.first_node
        link = self._links.get(node)
        if link is None or link.hop.address != frame.loop.address:
            link = self._links[node] = Downstream(
                Hop(node, frame.loop.address),
                self._creds,
                self._tuning,
                partial(self._frame, node),
                partial(self._lost, node),
                dialer=self._dialer,
                relink_timeout=self._relink_timeout,
            )
        self._route_of[frame.session] = node
        link.send(frame)

    def go_round(self, session: ServedSession, step: wire.Step, reply: wire.Tokens) -> wire.Tokens:
        """Send the next step to the first stage where it may go (`looped_step`, or with
        guesses `RingGuesses`); the reply, marked `looped` if it went, and carrying the
        answered step's guess count when the ring sent that step with guesses."""
        if step.guesses and self._guesses.sent(step.session, step.step_id):
            reply = replace(reply, guessed=len(step.guesses))
        node = self._route_of.get(step.session)
        if node is None:
            return reply
        loop = session.open.loop
        if loop is not None and loop.guesses:
            onward = self._guesses.next_step(session, step, reply, time.perf_counter())
        else:
            onward = looped_step(session.open, step, reply)
        if onward is None:
            return reply
        link = self._links[node]
        link.send(onward)
        self._dirty.add(link)
        return replace(reply, looped=True)

    def flush(self) -> None:
        """The steps sent this turn leave now, ahead of the TOKENS beside them."""
        for link in self._dirty:
            link.flush()
        self._dirty.clear()

    def forget(self, session: str) -> None:
        """The session ended here; the first stage ends it by its own CLOSE."""
        node = self._route_of.pop(session, None)
        self._guesses.forget(session)
        link = None if node is None else self._links.get(node)
        if link is not None:
            link.forget(session)

    async def measure_rtts(self) -> dict[str, float]:
        """Round trip in ms to each first stage this stage's ring links reach (the
        links a token crosses back to the start of its chain), where connected."""
        found: dict[str, float] = {}
        for node, link in list(self._links.items()):
            ms = await link.measure_rtt()
            if ms is not None:
                found[node] = ms
        return found

    def update_credentials(self, creds: NodeCredentials) -> None:
        self._creds = creds
        for link in self._links.values():
            link.update_credentials(creds)

    async def close(self) -> None:
        for link in self._links.values():
            await link.close()
        self._links.clear()

    def _frame(self, node: str, _channel: Channel, frame: wire.Frame) -> None:
        if not isinstance(frame, wire.Error) or self._route_of.get(frame.session) != node:
            return
        if frame.code is ErrorCode.UNKNOWN_SESSION:
            # The first stage ended the session (its client's CLOSE got there before the
            # step of the token after the end): the CLOSE reaches here down the chain.
            log.debug("first stage %s no longer has %s", node, frame.session)
            return
        self._on_failed(frame.session, frame.code, f"first stage refused a step: {frame.message}")

    def _lost(self, node: str, reason: str) -> None:
        link = self._links.pop(node, None)
        if link is not None:
            self._dirty.discard(link)
        for session in [s for s, n in self._route_of.items() if n == node]:
            del self._route_of[session]
            self._on_failed(session, ErrorCode.STAGE_ERROR, f"ring to the first stage: {reason}")
