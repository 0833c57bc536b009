"""app.serving.rules.sessions, the ring: the first stage takes a session's STEPs from the
last stage its OPEN names, over a link of its own, and from no one else; that link's
loss never makes the session wait. Links are plain strings, no sockets, no model."""

from __future__ import annotations

import dataclasses

import pytest

from app.serving.rules.sessions import (
    Begin,
    End,
    FrameReceived,
    LinkClosed,
    LinkLost,
    LinkReady,
    LinkState,
    Looped,
    Release,
    Resumed,
    Send,
    SessionRules,
    Take,
)
from net import wire
from net.errors import ErrorCode
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

LOOP = wire.Loop("first", "10.0.0.1:7000", "last")
OPEN = wire.Open("s1", "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 2, loop=LOOP)


def step(step_id: int) -> wire.Step:
    return wire.Step("s1", step_id, 2 + step_id, (1,), None, 1, 0, WireDtype.F32)


def first_stage(open_: wire.Open = OPEN) -> SessionRules[str]:
    """The first stage: the client "client" opened s1 over "cl"; the last stage "last"
    dialled in over "ring"."""
    rules: SessionRules[str] = SessionRules(is_last=False)
    rules.handle(LinkReady("cl", "client"))
    rules.handle(LinkReady("ring", "last"))
    assert rules.handle(FrameReceived("cl", "client", open_)) == [Begin(open_)]
    return rules


def test_the_named_last_stage_joins_and_its_steps_are_taken() -> None:
    rules = first_stage()
    assert rules.handle(FrameReceived("ring", "last", OPEN)) == [Looped("s1", "last")]
    assert rules.owns("cl", "s1") and not rules.owns("ring", "s1")  # the client still owns it
    assert rules.handle(FrameReceived("cl", "client", step(0))) == [Take(step(0), OPEN)]
    assert rules.handle(FrameReceived("ring", "last", step(1))) == [Take(step(1), OPEN)]
    assert rules.handle(FrameReceived("cl", "client", step(1)))[0].__class__.__name__ == (
        "Resent"  # one step id, taken once, whichever link brings it
    )


def test_steps_on_the_ring_link_before_it_joined_are_refused() -> None:
    rules = first_stage()
    actions = rules.handle(FrameReceived("ring", "last", step(1)))
    assert actions[0] == Send(
        "ring", wire.Error("s1", ErrorCode.UNKNOWN_SESSION, "no such session here")
    )
    assert "s1" in rules  # the client's session carries on


@pytest.mark.parametrize(
    ("peer", "frame", "code"),
    [
        # Not the node the loop names: the chain ends elsewhere than the client's route
        # (this stage's next hop moved), and the client is told to fetch a new one.
        ("mallory", OPEN, ErrorCode.ROUTE_MOVED),
        ("mallory", dataclasses.replace(OPEN, max_tokens=9), ErrorCode.NOT_OWNER),
        ("last", dataclasses.replace(OPEN, max_tokens=9), ErrorCode.NOT_OWNER),  # another OPEN
        ("last", dataclasses.replace(OPEN, loop=None), ErrorCode.NOT_OWNER),
    ],
)
def test_only_the_named_last_stage_with_the_same_open_joins(
    peer: str, frame: wire.Open, code: ErrorCode
) -> None:
    rules = first_stage()
    rules.handle(LinkReady("other", peer))
    actions = rules.handle(FrameReceived("other", peer, frame))
    assert isinstance(actions[0], Send) and isinstance(actions[0].frame, wire.Error)
    assert actions[0].frame.code is code
    assert rules.owns("cl", "s1")  # the client's session is untouched
    refused = rules.handle(FrameReceived("other", peer, step(1)))
    assert isinstance(refused[0], Send) and refused[0].link == "other"


def test_a_session_without_a_loop_takes_no_ring() -> None:
    plain = dataclasses.replace(OPEN, loop=None)
    rules = first_stage(plain)
    actions = rules.handle(FrameReceived("ring", "last", plain))
    assert isinstance(actions[0], Send) and actions[0].frame == wire.Error(
        "s1", ErrorCode.NOT_OWNER, "session already open (by another peer)"
    )


def test_a_middle_stage_takes_no_ring() -> None:
    """Only the first stage is fed from the last one: further down, the same OPEN from
    the last stage's node is a peer that does not own the session."""
    rules: SessionRules[str] = SessionRules(is_last=False, upstream_is_stage=True)
    rules.handle(LinkReady("up", "stage0"))
    rules.handle(FrameReceived("up", "stage0", OPEN))
    actions = rules.handle(FrameReceived("ring", "last", OPEN))
    assert isinstance(actions[0], Send) and actions[0].link == "ring"


def test_a_new_ring_link_replaces_the_old_one() -> None:
    rules = first_stage()
    rules.handle(FrameReceived("ring", "last", OPEN))
    rules.handle(LinkReady("ring2", "last"))
    assert rules.handle(FrameReceived("ring2", "last", OPEN)) == [
        Looped("s1", "last"),
        Release("ring", "s1"),
    ]
    assert rules.handle(FrameReceived("ring2", "last", step(1))) == [Take(step(1), OPEN)]
    assert isinstance(rules.handle(FrameReceived("ring", "last", step(2)))[0], Send)


def test_losing_the_ring_link_leaves_the_session_linked() -> None:
    rules = first_stage()
    rules.handle(FrameReceived("ring", "last", OPEN))
    assert rules.handle(LinkClosed("ring", "gone")) == []
    assert rules.state("s1") is LinkState.LINKED
    assert isinstance(rules.handle(FrameReceived("ring", "last", step(1)))[0], Send)
    lost = rules.handle(LinkClosed("cl", "client gone"))  # the client's link still counts
    assert lost == [LinkLost("s1", "client gone", arm_grace=True)]


def test_the_end_releases_both_links() -> None:
    rules = first_stage()
    rules.handle(FrameReceived("ring", "last", OPEN))
    actions = rules.handle(FrameReceived("cl", "client", wire.Close("s1", "done")))
    assert actions == [
        Release("cl", "s1"),
        Release("ring", "s1"),
        End("s1", forward_close=True, reason="done"),
    ]


def test_the_client_resuming_its_own_link_is_still_a_resume() -> None:
    rules = first_stage()
    rules.handle(FrameReceived("ring", "last", OPEN))
    rules.handle(LinkReady("cl2", "client"))
    assert rules.handle(FrameReceived("cl2", "client", OPEN)) == [
        Release("cl", "s1"),
        Resumed("s1", "client"),
    ]
    assert rules.handle(FrameReceived("ring", "last", step(1))) == [Take(step(1), OPEN)]


def _tokens(step_id: int, looped: bool) -> wire.Tokens:
    return wire.Tokens("s1", step_id, (7,), (), 0, False, (), looped=looped)


def last_stage() -> SessionRules[str]:
    rules: SessionRules[str] = SessionRules(is_last=True, upstream_is_stage=True)
    rules.handle(LinkReady("cl", "client"))
    rules.handle(LinkReady("up", "stage1"))
    assert rules.handle(FrameReceived("up", "stage1", OPEN)) == [Begin(OPEN)]
    return rules


def test_a_returning_client_gets_every_tokens_the_ring_sent_since_its_turn() -> None:
    """The ring does not wait for the client: whatever went out on a link that died
    unnoticed may be lost, so all of it goes again, in order, on the new link."""
    from app.serving.rules.sessions import TokensReady

    rules = last_stage()
    sent = [_tokens(0, False), _tokens(1, True), _tokens(2, True)]
    for t in sent:
        assert rules.handle(TokensReady(t)) == [Send("cl", t)]
    assert rules.reply_linked("s1")
    rules.handle(LinkClosed("cl", "gone"))
    assert not rules.reply_linked("s1")
    paused = _tokens(3, False)  # the worker does not go round while the client is away
    assert rules.handle(TokensReady(paused)) == []
    actions = rules.handle(LinkReady("cl3", "client"))
    # TOKENS 0 (not looped) had its answer, the client's step 1: it is not sent again.
    assert [a.frame for a in actions if isinstance(a, Send)] == [*sent[1:], paused]
    # The client answered TOKENS 3 (not looped) with its own step: all before it is known.
    assert rules.handle(TokensReady(_tokens(4, True))) == [Send("cl3", _tokens(4, True))]
    rules.handle(LinkClosed("cl3", "gone"))
    actions = rules.handle(LinkReady("cl4", "client"))
    assert [a.frame for a in actions if isinstance(a, Send)] == [_tokens(4, True)]
