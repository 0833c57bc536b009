"""The stage worker's session rules, without IO: frames and link events in, actions out.

Who owns a session (the upstream node that opened it, over one link at a time), when a
repeated OPEN resumes it over a new link and when it is refused, which steps were taken
already, when the stage refuses new sessions, and how long a session whose link died is
kept for a resume. `app.serving.rules.stage.StageCore` holds these rules, feeds them
every event and adds a stage's step decisions; their table (one `SessionRecord` per
session) is the stage's only one. Nothing here touches a socket, the engine or the clock.
A link is any hashable handle (the worker passes its `Channel`s, the tests plain
strings); the grace timer is an action (`LinkLost`) the core turns into a deadline and
an event (`GraceExpired`) it feeds back.

A session is LINKED (its upstream link, and on the last stage the client's link, are
there) or WAITING (one was lost; a grace timer runs). The rules, event by event:

    event                      condition                              actions
    -------------------------  -------------------------------------  ---------------------
    OPEN, new session          not from a node that may open here     refuse NOT_OWNER
                                 (peer_rules.opener_refusal)
                               first stage, a ring not pointing here  refuse BAD_VALUE
                                 (peer_rules.loop_refusal)
                               draining                               refuse OVERLOADED
                               node over its limits (node_limits)     refuse OVERLOADED
                                                                      (with retry hint)
                               last stage, client has no link here    refuse ROUTE_MOVED
                               admission refuses (slots, KV memory)   refuse OVERLOADED
                                                                      (with retry hint)
                               it resumes a session held here for     [Release old] Begin
                                 the same client with a matching        adopting the old
                                 history, from a stage the replay       one's KV
                                 allows (resume_rules)
                               otherwise                              Begin (and End the
                                                                      session it resumes if
                                                                      this link owns it)
    OPEN, session exists       first stage, the same OPEN from the    [Release old] Looped
                                 last stage its `loop` names            (its STEPs come on
                                                                      this link too)
                               same upstream node and same OPEN       [Release old] Resumed
                                                                      (WAITING->LINKED:
                                                                      CancelGrace)
                               first stage, the same OPEN from a      refuse ROUTE_MOVED
                                 last stage its `loop` does not name
                               another node, or another OPEN          refuse NOT_OWNER
    STEP                       unknown session, or neither the owner  refuse UNKNOWN_SESSION
                                 link nor its loop link
                               step_id <= highest taken               Resent (dropped)
                               otherwise                              Take
    CLOSE                      session exists                         [Release] End
    Refused (worker's check)   the link owns the session              Send ERROR, Fail
                               otherwise                              Send ERROR, Release
    StepRejected (rows no      the link owns the session or is its    Send ERROR (and to the
      model computes)            loop                                   client), LinkLost
                                                                      (LINKED->WAITING:
                                                                      ArmGrace; a replay
                                                                      may take its KV over)
                               otherwise                              as Refused
    LinkReady (last stage)     client of a session, on a new link     reply link = it,
                                                                      Send latest TOKENS,
                                                                      (WAITING->LINKED:
                                                                      CancelGrace)
    LinkClosed                 owner or reply link of a session       LinkLost
                                                                      (LINKED->WAITING:
                                                                      ArmGrace)
                               loop link of a session                 (forgotten: the last
                                                                      stage redials it)
    GraceExpired               session still WAITING                  [Release] End
    Failed                     session exists                         Send ERROR up (and to
                                                                      the client), End
    Drain                      -                                      no new sessions
    Shutdown                   every session                          [Release] End

"refuse X" sends ERROR(X) back on the link and, because the link's protocol state took
the session id as its own when the frame arrived, releases the id there, unless the
link owns the session: then the session fails (everyone involved hears the error).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic

from app.serving.links.token_route import reply_link
from app.serving.rules.events import (
    Action,
    Begin,
    CancelGrace,
    Drain,
    End,
    Event,
    Failed,
    FrameReceived,
    GraceExpired,
    L,
    LinkClosed,
    LinkLost,
    LinkReady,
    Looped,
    Refused,
    Release,
    Resent,
    Resumed,
    Send,
    Shutdown,
    StepRejected,
    Take,
    TokensReady,
)
from app.serving.rules.node_limits import NodeLimits
from app.serving.rules.peers import StagePlan, loop_refusal, opener_refusal
from app.serving.rules.resume import HeldSession, may_adopt, positions_kept
from app.serving.session_records import LinkState, SessionRecord
from core.admission import AdmissionLedger
from net import wire
from net.errors import ErrorCode
from net.protocol import OverloadHint, overloaded

__all__ = [
    "ERROR_MESSAGE_BYTES",
    "Action",
    "Begin",
    "CancelGrace",
    "Drain",
    "End",
    "Event",
    "Failed",
    "FrameReceived",
    "GraceExpired",
    "L",
    "LinkClosed",
    "LinkLost",
    "LinkReady",
    "LinkState",
    "Looped",
    "Refused",
    "Release",
    "Resent",
    "Resumed",
    "Send",
    "SessionRules",
    "Shutdown",
    "StepRejected",
    "Take",
    "TokensReady",
]

ERROR_MESSAGE_BYTES = 900
"""An ERROR built from a failure is cut to this, leaving room in the frame's string cap."""


# ---------------------------------------------------------------- the table


class SessionRules(Generic[L]):
    """Every session of one stage and the links they use."""

    def __init__(
        self,
        is_last: bool,
        admission: AdmissionLedger | None = None,
        node_limits: NodeLimits | None = None,
        upstream_is_stage: bool = False,
        history_of: Callable[[str], Sequence[int] | None] | None = None,
        first_layer: int = 0,
        plan: StagePlan | None = None,
    ) -> None:
        self.is_last = is_last
        self.plan = plan
        """Who may open sessions here and where rings may point (peer_rules); None:
        anyone, anywhere (tests of the other rules)."""
        self.history_of = history_of
        """The token ids a session's KV holds (None: not known); None here: this stage
        never takes a session's KV over (resume_rules)."""
        self.first_layer = first_layer
        """The stage's first layer: a replay's `resume_from_layer` says from which stage
        on the old session may be taken over (resume_rules.may_adopt)."""
        self.upstream_is_stage = upstream_is_stage
        """Not the first stage: sessions come from a stage, never from their client
        (the two may share a node id: app.serving.links.token_route)."""
        self.node_limits = node_limits
        """Per upstream node: sessions held and new-session OPEN rate; None: no limit."""
        self.draining = False
        self.admission = admission
        """What each session reserves of the stage's KV (core.admission); None: no limit
        here (the stage's own slot check still refuses)."""
        self._sessions: dict[str, SessionRecord[L]] = {}
        self._peers: dict[str, list[L]] = {}
        """Node id -> its links, oldest first (the last stage finds a session's client by
        them)."""

    def __contains__(self, session: object) -> bool:
        return session in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def sessions(self) -> list[str]:
        return list(self._sessions)

    @property
    def table(self) -> Mapping[str, SessionRecord[L]]:
        """The stage's one table of its sessions. Which sessions it holds, their links
        and ownership change only here; app.serving.rules.stage writes the fields
        of their steps."""
        return self._sessions

    def owns(self, link: L, session: str) -> bool:
        s = self._sessions.get(session)
        return s is not None and s.owner == link

    def reply_linked(self, session: str) -> bool:
        """Last stage: the session's TOKENS have a link to their client now."""
        s = self._sessions.get(session)
        return s is not None and s.reply is not None

    def state(self, session: str) -> LinkState | None:
        s = self._sessions.get(session)
        return None if s is None else s.state

    def handle(self, event: Event[L]) -> list[Action[L]]:
        handler: Callable[[Any, Any], list[Action[L]]] = _HANDLERS[type(event)]
        return handler(self, event)

    # ------------------------------------------------------------ frames

    def _on_frame(self, ev: FrameReceived[L]) -> list[Action[L]]:
        frame = ev.frame
        if isinstance(frame, wire.Open):
            return self._on_open(ev.link, ev.peer, frame, ev.role)
        if isinstance(frame, wire.Step):
            return self._on_step(ev.link, frame)
        if isinstance(frame, wire.Close):
            return self._end(frame.session, forward_close=True, reason=frame.reason)
        return []

    def _on_open(self, link: L, peer: str, frame: wire.Open, role: str = "") -> list[Action[L]]:
        existing = self._sessions.get(frame.session)
        if existing is not None:
            return self._resume(link, peer, existing, frame)
        if self.plan is not None:
            not_here = opener_refusal(self.plan, peer, role)
            if not_here is not None:
                return self._refuse(link, frame.session, ErrorCode.NOT_OWNER, not_here)
            if self.plan.is_first and frame.loop is not None:
                not_here = loop_refusal(self.plan, frame.loop)
                if not_here is not None:
                    return self._refuse(link, frame.session, ErrorCode.BAD_VALUE, not_here)
        if self.draining:
            return self._refuse(
                link,
                frame.session,
                ErrorCode.OVERLOADED,
                overloaded(
                    frame.session,
                    "this stage is pausing; try another route",
                    OverloadHint(retry_after_ms=0, try_another_route=True),
                ).message,
            )
        if self.node_limits is not None:
            held = sum(1 for s in self._sessions.values() if s.owner_id == peer)
            limited = self.node_limits.check_open(peer, held)
            if limited is not None:
                hint = OverloadHint(limited.retry_after_ms, limited.try_another_route)
                error = overloaded(frame.session, limited.reason, hint)
                return self._refuse(link, frame.session, ErrorCode.OVERLOADED, error.message)
        session: SessionRecord[L] = SessionRecord(frame, owner_id=peer, owner=link)
        if self.is_last:
            session.reply = self._reply_link(frame.reply_to, link)
            if session.reply is None:
                return self._refuse(
                    link,
                    frame.session,
                    # The client links its route's last stage before it opens: an OPEN
                    # without that link came down a chain whose next hop moved.
                    ErrorCode.ROUTE_MOVED,
                    f"client {frame.reply_to!r} has no link here: its route ends elsewhere",
                )
        old, kept = self._adoptable(frame)
        if self.admission is not None:
            if old is not None:  # its reservation passes to the new session
                self.admission.release(old.open.session)
            refusal = self.admission.admit(frame.session, frame.prompt_len, frame.max_tokens)
            if refusal is not None:
                if old is not None:  # it fitted before: it fits again
                    self.admission.admit(old.open.session, old.open.prompt_len,
                                         old.open.max_tokens)  # fmt: skip
                hint = OverloadHint(refusal.retry_after_ms, refusal.try_another_route)
                error = overloaded(frame.session, refusal.reason, hint)
                return self._refuse(link, frame.session, ErrorCode.OVERLOADED, error.message)
        self._sessions[frame.session] = session
        if old is None:
            return [Begin(frame), *self._superseded(link, frame)]
        del self._sessions[old.open.session]
        session.history, session.kept = old.history[:kept], kept
        gone: list[Action[L]] = []
        if old.owner is not None:
            gone.append(Release(old.owner, old.open.session))
        return [*gone, Begin(frame, adopt=old.open.session, kept=kept)]

    def _superseded(self, link: L, frame: wire.Open) -> list[Action[L]]:
        """A replay arriving over the link that owns the session it resumes, which this
        stage does not take over: the upstream moved on from that session (a stage
        before took it over, or it forwards the client's replay), so it ends here too,
        after the replay's OPEN went on (a stage further down may still take it over)."""
        prior = self._sessions.get(frame.resumes) if frame.resumes else None
        if prior is None or prior.owner != link:
            return []
        return self._end(frame.resumes, forward_close=True, reason=f"replayed as {frame.session}")

    def _adoptable(self, frame: wire.Open) -> tuple[SessionRecord[L] | None, int]:
        """The session a replay's OPEN resumes, if this stage may hand its KV over, and
        the positions kept (resume_rules.positions_kept)."""
        if self.history_of is None or not may_adopt(frame, self.first_layer, self.is_last):
            return None, 0
        old = self._sessions.get(frame.resumes)
        history = None if old is None else self.history_of(frame.resumes)
        if old is None or history is None:
            return None, 0
        kept = positions_kept(frame, HeldSession(old.open, history))
        return (old, kept) if kept else (None, 0)

    def _resume(
        self, link: L, peer: str, session: SessionRecord[L], frame: wire.Open
    ) -> list[Action[L]]:
        ring = session.open.loop
        if (
            ring is not None
            and not self.upstream_is_stage
            and peer == ring.last_node != session.owner_id
            and frame == session.open
        ):
            joined: list[Action[L]] = [Looped(frame.session, peer)]
            if session.loop is not None and session.loop != link:
                joined.append(Release(session.loop, frame.session))
            session.loop = link
            return joined
        if (
            ring is not None
            and not self.upstream_is_stage
            and peer not in (session.owner_id, ring.last_node)
            and frame == session.open
        ):
            # The session's OPEN back round the ring, from a last stage the client's route
            # does not end at: this stage's next hop moved since the route was handed out.
            return self._refuse(
                link,
                frame.session,
                ErrorCode.ROUTE_MOVED,
                f"the chain ends at {peer}, the client's route at {ring.last_node}",
            )
        # The same OPEN again from the same upstream node over a new link: its path died
        # and was replaced. The session moves to the new link; nothing else changes.
        if peer != session.owner_id or frame != session.open:
            return self._refuse(
                link, frame.session, ErrorCode.NOT_OWNER, "session already open (by another peer)"
            )
        actions: list[Action[L]] = []
        if session.owner is not None and session.owner != link:
            actions.append(Release(session.owner, frame.session))
        session.owner = link
        if self.is_last and session.reply == link:
            # The upstream redialled under the client's node id and took its reply link.
            session.reply = self._reply_link(session.open.reply_to, link)
        actions.append(Resumed(frame.session, session.owner_id))
        return actions + self._relinked(frame.session, session)

    def _on_step(self, link: L, frame: wire.Step) -> list[Action[L]]:
        session = self._sessions.get(frame.session)
        if session is None or link not in (session.owner, session.loop):
            return self._refuse(
                link, frame.session, ErrorCode.UNKNOWN_SESSION, "no such session here"
            )
        if frame.step_id <= session.last_step_id:
            return [Resent(frame)]
        session.last_step_id = frame.step_id
        return [Take(frame, session.open)]

    def _on_refused(self, ev: Refused[L]) -> list[Action[L]]:
        return self._refuse(ev.link, ev.session, ev.code, ev.message)

    def _on_step_rejected(self, ev: StepRejected[L]) -> list[Action[L]]:
        session = self._sessions.get(ev.session)
        if session is None or ev.link not in (session.owner, session.loop):
            return self._refuse(ev.link, ev.session, ev.code, ev.message)
        error = wire.Error(ev.session, ev.code, wire.truncate_utf8(ev.message, ERROR_MESSAGE_BYTES))
        actions: list[Action[L]] = [Send(ev.link, error)]
        if session.reply is not None and session.reply != ev.link:
            actions.append(Send(session.reply, error))
        # Nothing of the step reached the KV: the session waits, as for a lost link, for
        # the client's replay to take it over (resume_rules), and ends after its grace.
        if session.state is LinkState.LINKED:
            session.state, session.grace_reason = LinkState.WAITING, ev.message
            actions.append(LinkLost(ev.session, ev.message, arm_grace=True))
        return actions

    def _refuse(self, link: L, session: str, code: ErrorCode, message: str) -> list[Action[L]]:
        actions: list[Action[L]] = [Send(link, wire.Error(session, code, message))]
        if self.owns(link, session):
            return actions + self._fail(session, code, message, forward_close=True)
        if session:
            # Not this link's session (a forged or stale id): refuse, touch nothing.
            actions.append(Release(link, session))
        return actions

    # ------------------------------------------------------------ links

    def _reply_link(self, client: str, upstream: L) -> L | None:
        return reply_link(self._peers.get(client, ()), upstream, self.upstream_is_stage)

    def _on_link_ready(self, ev: LinkReady[L]) -> list[Action[L]]:
        links = self._peers.setdefault(ev.peer, [])
        if ev.link not in links:
            links.append(ev.link)
        if not self.is_last:
            return []
        # A client redialled the last stage: its sessions' TOKENS go this way now, and the
        # latest TOKENS again, in case they were lost with the old path.
        actions: list[Action[L]] = []
        for name, s in self._sessions.items():
            if s.open.reply_to != ev.peer or s.reply == ev.link:
                continue
            if self.upstream_is_stage and s.owner == ev.link:
                continue
            s.reply = ev.link
            actions += [Send(ev.link, tokens) for tokens in s.replies]
            actions += self._relinked(name, s)
        return actions

    def _on_link_closed(self, ev: LinkClosed[L]) -> list[Action[L]]:
        for peer, links in list(self._peers.items()):
            if ev.link in links:
                links.remove(ev.link)
            if not links:
                del self._peers[peer]
        actions: list[Action[L]] = []
        for name, s in self._sessions.items():
            if s.loop == ev.link:
                s.loop = None
            if s.owner != ev.link and s.reply != ev.link:
                continue
            if s.owner == ev.link:
                s.owner = None
            if s.reply == ev.link:
                s.reply = None
            arm = s.state is LinkState.LINKED
            if arm:
                s.state, s.grace_reason = LinkState.WAITING, ev.reason
            actions.append(LinkLost(name, ev.reason, arm_grace=arm))
        return actions

    def _relinked(self, name: str, session: SessionRecord[L]) -> list[Action[L]]:
        linked = session.owner is not None and (not self.is_last or session.reply is not None)
        if linked and session.state is LinkState.WAITING:
            session.state, session.grace_reason = LinkState.LINKED, ""
            return [CancelGrace(name)]
        return []

    def _on_grace_expired(self, ev: GraceExpired) -> list[Action[L]]:
        session = self._sessions.get(ev.session)
        if session is None or session.state is not LinkState.WAITING:
            return []
        reason = f"link lost and not resumed: {session.grace_reason}"
        return self._end(ev.session, forward_close=True, reason=reason)

    # ------------------------------------------------------------ ending

    def _on_failed(self, ev: Failed) -> list[Action[L]]:
        return self._fail(ev.session, ev.code, ev.message, forward_close=ev.forward_close)

    def _fail(
        self, name: str, code: ErrorCode, message: str, *, forward_close: bool
    ) -> list[Action[L]]:
        session = self._sessions.get(name)
        if session is None:
            return []
        error = wire.Error(name, code, wire.truncate_utf8(message, ERROR_MESSAGE_BYTES))
        actions: list[Action[L]] = []
        if session.owner is not None:
            actions.append(Send(session.owner, error))
        if session.reply is not None:
            actions.append(Send(session.reply, error))
        return actions + self._end(name, forward_close=forward_close, reason=message, failed=True)

    def _end(
        self, name: str, *, forward_close: bool, reason: str, failed: bool = False
    ) -> list[Action[L]]:
        session = self._sessions.pop(name, None)
        if session is None:
            return []
        if self.admission is not None:
            self.admission.release(name)
        actions: list[Action[L]] = [
            Release(link, name) for link in (session.owner, session.loop) if link is not None
        ]
        return [*actions, End(name, forward_close, reason, failed)]

    def _on_tokens(self, ev: TokensReady) -> list[Action[L]]:
        session = self._sessions.get(ev.tokens.session)
        if session is None:
            return []
        if session.replies and not session.replies[-1].looped:
            session.replies.clear()  # the client had it: this step came from its turn
        session.replies.append(ev.tokens)
        if session.reply is None:  # the client is redialling: sent when it is back
            return []
        return [Send(session.reply, ev.tokens)]

    def _on_drain(self, _ev: Drain) -> list[Action[L]]:
        self.draining = True
        return []

    def _on_shutdown(self, ev: Shutdown) -> list[Action[L]]:
        actions: list[Action[L]] = []
        for name in list(self._sessions):
            actions += self._end(name, forward_close=True, reason=ev.reason)
        return actions


_HANDLERS: dict[type, Callable[[Any, Any], list[Any]]] = {
    FrameReceived: SessionRules._on_frame,
    Refused: SessionRules._on_refused,
    StepRejected: SessionRules._on_step_rejected,
    LinkReady: SessionRules._on_link_ready,
    LinkClosed: SessionRules._on_link_closed,
    GraceExpired: SessionRules._on_grace_expired,
    Failed: SessionRules._on_failed,
    TokensReady: SessionRules._on_tokens,
    Drain: SessionRules._on_drain,
    Shutdown: SessionRules._on_shutdown,
}
