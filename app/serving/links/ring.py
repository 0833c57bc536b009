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
with guesses the ring guesses them itself (`RingGuesses`: the client's `GuessTracker` on
the session's tokens, timed by the ring's own trips), so guessed decoding goes round
too. Everything else keeps the client's path, and a TOKENS without `looped` tells the
client to send the next step.

Whether a step goes round, and which, is the stage core's decision
(app.serving.rules.ring_turns, app.serving.rules.stage); this module only carries
it. The links to first stages are `app.serving.links.downstream.Downstream`s: dialled
lazily (the OPEN goes first, as the first stage takes the session's STEPs only from the
last stage its OPEN names), replayed after a lost path, and given up on with a typed
error to the client, who then replays the generation on another route.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from app.config import Hop
from app.serving.links.downstream import Dialer, Downstream
from net import wire
from net.channel import Channel, NodeCredentials
from net.quic.links import QuicTuning

RefusalSink = Callable[[str, wire.Error], None]
"""(first stage node id, its ERROR): a step or OPEN the first stage refused."""
LossSink = Callable[[str, str], None]
"""(first stage node id, reason): its link could not be re-established."""


class Ring:
    """A last stage's links to the first stages of its sessions' routes (one per first
    stage: sessions may come through this stage from different first stages). Which
    sessions go round to which first stage the stage core knows; this holds the links."""

    def __init__(
        self,
        creds: NodeCredentials,
        tuning: QuicTuning,
        on_refused: RefusalSink,
        on_lost: LossSink,
        dialer: Dialer | None = None,
        relink_timeout: float = 20.0,
    ) -> None:
        self._creds = creds
        self._tuning = tuning
        self._on_refused = on_refused
        self._on_lost = on_lost
        self._dialer = dialer
        self._relink_timeout = relink_timeout
        self._links: dict[str, Downstream] = {}
        """First stage node id -> the link to it."""
        self._dirty: set[Downstream] = set()

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
        link.send(frame)

    def send(self, node: str, step: wire.Step) -> None:
        """The step of a token, round to the first stage `node` (it leaves at `flush`)."""
        link = self._links.get(node)
        if link is None:  # lost just now: its sessions fail (on_lost)
            return
        link.send(step)
        self._dirty.add(link)

    def flush(self) -> None:
        """The steps sent this turn leave now, ahead of the TOKENS beside them."""
        for link in self._dirty:
            link.flush()
        self._dirty.clear()

    def forget(self, session: str) -> None:
        """The session ended here; the first stage ends it by its own CLOSE. (One link
        per first stage: asking each to forget costs less than keeping a table.)"""
        for link in self._links.values():
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
        if isinstance(frame, wire.Error):
            self._on_refused(node, frame)

    def _lost(self, node: str, reason: str) -> None:
        link = self._links.pop(node, None)
        if link is not None:
            self._dirty.discard(link)
        self._on_lost(node, reason)
