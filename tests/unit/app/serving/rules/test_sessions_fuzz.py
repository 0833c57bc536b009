"""Stateful fuzz of the stage's session rules (app/serving/rules/sessions.py): hostile and
confused peers send OPEN, STEP and CLOSE for their own sessions and others', replay
steps, drop links and come back, while the worker fails sessions and grace timers fire.
Whatever the order, the table never raises, only the owner's link ever gets a step
through, a step id is taken at most once, refusals are typed ERRORs, and the sessions
it keeps are exactly those begun and not ended. Replays that name a session to take over
(resume OPENs, honest or with a forged digest or another client) take it only with the
true history and the same client; one that does not take it over ends it only when it
came over the link that owns it (that upstream moved on). Bounded: 60 programs of 40
events."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from app.serving.rules.sessions import (
    Begin,
    Drain,
    End,
    Failed,
    FrameReceived,
    GraceExpired,
    LinkClosed,
    LinkReady,
    Refused,
    Send,
    SessionRules,
    Take,
    TokensReady,
)
from app.session.replay_resume import history_digest
from net import wire
from net.errors import ErrorCode
from net.wire.tensors import WireDtype
from tests.support.fuzzing import fuzz_settings

PEERS = ("up-a", "up-b", "client")
LINK_PEER = {"l1": "client", "l2": "up-a", "l3": "up-b", "l4": "up-a"}
"""Each link name belongs to one node (l4 is up-a's second link, as after a redial)."""
LINKS = tuple(LINK_PEER)
SESSIONS = ("s1", "s2", "s3")
HELD = (7, 7)
"""The token ids every session's KV holds here (what the worker's history would say)."""


def _open(session: str, reply_to: str, max_tokens: int) -> wire.Open:
    return wire.Open(session, "m", WireDtype.F32, wire.SamplingSpec(), reply_to, max_tokens, 2)


class SessionTable(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table: SessionRules[str] = SessionRules(
            is_last=True, history_of=lambda s: HELD if s in self.table else None
        )
        self.reply_of: dict[str, str] = {}
        self.adoptions = 0
        self.peer_of: dict[str, str] = {}
        """Link -> the node it authenticated (a link belongs to one node for its life)."""
        self.live: set[str] = set()
        self.taken: dict[str, set[int]] = {}
        self.owner_peer: dict[str, str] = {}

    def _feed(self, event: object) -> None:
        self._check(self.table.handle(event))  # type: ignore[arg-type]

    def _check(self, actions: Sequence[object]) -> None:
        for action in actions:
            if isinstance(action, Send):
                assert isinstance(action.frame, wire.Error | wire.Tokens)
                if isinstance(action.frame, wire.Error):
                    assert isinstance(action.frame.code, ErrorCode)
            elif isinstance(action, Begin):
                assert action.open.session not in self.live
                self.live.add(action.open.session)
                self.taken[action.open.session] = set()
                self.reply_of[action.open.session] = action.open.reply_to
                if action.adopt:
                    assert action.adopt in self.live, "took over a session not held"
                    assert self.reply_of[action.adopt] == action.open.reply_to
                    assert action.open.resume_digest == history_digest(action.adopt, HELD)
                    assert action.kept == len(HELD)
                    self.live.discard(action.adopt)
            elif isinstance(action, Take):
                ids = self.taken[action.step.session]
                assert action.step.step_id not in ids, "a step id taken twice"
                ids.add(action.step.step_id)
            elif isinstance(action, End):
                self.live.discard(action.session)

    @initialize()
    def client_link(self) -> None:
        self.link_ready("l1")

    @rule(link=st.sampled_from(LINKS))
    def link_ready(self, link: str) -> None:
        self.peer_of[link] = LINK_PEER[link]
        self._feed(LinkReady(link, self.peer_of[link]))

    @rule(link=st.sampled_from(LINKS))
    def link_closed(self, link: str) -> None:
        self._feed(LinkClosed(link, "path died"))
        self.peer_of.pop(link, None)  # a later LinkReady with this name is a new connection

    @rule(
        link=st.sampled_from(LINKS),
        session=st.sampled_from(SESSIONS),
        reply_to=st.sampled_from(PEERS),
        max_tokens=st.sampled_from((4, 8)),
    )
    def open(self, link: str, session: str, reply_to: str, max_tokens: int) -> None:
        if link not in self.peer_of:
            return  # no frame arrives before a link's WELCOME
        before = session in self.table
        self._feed(FrameReceived(link, self.peer_of[link], _open(session, reply_to, max_tokens)))
        if not before and session in self.table:
            self.owner_peer[session] = self.peer_of[link]

    @rule(
        link=st.sampled_from(LINKS),
        pick=st.integers(0, 5),
        same_client=st.booleans(),
        forged=st.booleans(),
    )
    def resume_open(self, link: str, pick: int, same_client: bool, forged: bool) -> None:
        # Mostly a replay of a session held here under a name not in use, as a client's
        # replay is; otherwise any names (a replay of something gone, or of itself).
        held = sorted(self.table.sessions)
        free = [x for x in SESSIONS if x not in self.table]
        resumes = held[pick % len(held)] if held and pick < 4 else SESSIONS[pick % 3]
        session = free[0] if free and pick < 4 else SESSIONS[(pick + 1) % 3]
        if link not in self.peer_of or session == resumes:
            return
        reply_to = self.reply_of.get(resumes, "client") if same_client else "up-b"
        digest = bytes(32) if forged else history_digest(resumes, HELD)
        frame = wire.Open(session, "m", WireDtype.F32, wire.SamplingSpec(), reply_to, 4,
                          len(HELD) + 1, resumes, len(HELD), digest)  # fmt: skip
        before, was_held = session in self.table, resumes in self.table
        owner = self.table.owns(link, resumes)
        actions = self.table.handle(FrameReceived(link, self.peer_of[link], frame))
        adopted = any(isinstance(a, Begin) and a.adopt for a in actions)
        began = any(isinstance(a, Begin) for a in actions)
        if adopted:
            self.adoptions += 1
        elif began and owner:  # its own upstream moved on from it: it ends here
            assert resumes not in self.table
        else:  # a replay that may not take the session over leaves it where it was
            assert (resumes in self.table) == was_held
        self._check(actions)
        if not before and session in self.table:
            self.owner_peer[session] = self.peer_of[link]

    @rule(
        link=st.sampled_from(LINKS),
        session=st.sampled_from(SESSIONS),
        step_id=st.integers(0, 6),
    )
    def step(self, link: str, session: str, step_id: int) -> None:
        if link not in self.peer_of:
            return
        owned = self.table.owns(link, session)
        frame = wire.Step(session, step_id, step_id, (1,), None, 1, 0, WireDtype.F32)
        actions = self.table.handle(FrameReceived(link, self.peer_of[link], frame))
        if any(isinstance(a, Take) for a in actions):
            assert owned, "a step from a link that does not own the session got through"
        self._replay(actions)

    def _replay(self, actions: Sequence[object]) -> None:
        for action in actions:
            if isinstance(action, Take):
                ids = self.taken[action.step.session]
                assert action.step.step_id not in ids, "a step id taken twice"
                ids.add(action.step.step_id)
            elif isinstance(action, End):
                self.live.discard(action.session)
            elif isinstance(action, Send) and isinstance(action.frame, wire.Error):
                assert isinstance(action.frame.code, ErrorCode)

    @rule(link=st.sampled_from(LINKS), session=st.sampled_from(SESSIONS))
    def close(self, link: str, session: str) -> None:
        if link in self.peer_of:
            self._feed(FrameReceived(link, self.peer_of[link], wire.Close(session, "bye")))

    @rule(session=st.sampled_from(SESSIONS))
    def grace_expired(self, session: str) -> None:
        self._feed(GraceExpired(session))

    @rule(session=st.sampled_from(SESSIONS), step_id=st.integers(0, 6))
    def tokens_ready(self, session: str, step_id: int) -> None:
        self._feed(TokensReady(wire.Tokens(session, step_id, (3,), (), 0, False, ())))

    @rule(session=st.sampled_from(SESSIONS))
    def engine_failed(self, session: str) -> None:
        self._feed(Failed(session, ErrorCode.MISSING_POSITIONS, "cache ends at 0"))

    @rule(link=st.sampled_from(LINKS), session=st.sampled_from(SESSIONS))
    def worker_refused(self, link: str, session: str) -> None:
        self._feed(Refused(link, session, ErrorCode.BAD_SHAPE, "wrong width"))

    @rule()
    def drain(self) -> None:
        self._feed(Drain())

    @invariant()
    def sessions_are_those_begun_and_not_ended(self) -> None:
        assert set(self.table.sessions) == self.live


TestSessionTable = SessionTable.TestCase
TestSessionTable.settings = fuzz_settings(steps=40)  # bounded: tests/support/fuzzing.py
