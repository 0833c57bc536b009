"""app.serving.links.token_route and its use by the last stage's rules: a node chatting through
its own earlier stage (the desktop app: one identity serves and chats) gets its TOKENS
on its chat link, not on its worker's link. Links are plain strings."""

from __future__ import annotations

import pytest

from app.serving.links.token_route import reply_link
from app.serving.rules.sessions import (
    Begin,
    FrameReceived,
    LinkClosed,
    LinkLost,
    LinkReady,
    Resumed,
    Send,
    SessionRules,
    TokensReady,
)
from net import wire
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

# The app's node "app": its chat client's link "chat", its worker (stage 1) link "work".
OPEN = wire.Open("s1", "m", WireDtype.F32, wire.SamplingSpec(), "app", 8, 2)


def tokens(step_id: int) -> wire.Tokens:
    return wire.Tokens("s1", step_id, (7,), (), 0, False, ())


def last_stage() -> SessionRules[str]:
    """Stage 2 of 2: the app's chat links first, then its worker (on the first OPEN)."""
    rules: SessionRules[str] = SessionRules(is_last=True, upstream_is_stage=True)
    rules.handle(LinkReady("chat", "app"))
    rules.handle(LinkReady("work", "app"))
    assert rules.handle(FrameReceived("work", "app", OPEN)) == [Begin(OPEN)]
    return rules


def test_the_newest_link_unless_it_is_the_upstream_stages() -> None:
    assert reply_link(["a", "b"], "b", upstream_is_stage=False) == "b"
    assert reply_link(["a", "b"], "b", upstream_is_stage=True) == "a"
    assert reply_link(["a", "b"], "x", upstream_is_stage=True) == "b"
    assert reply_link(["b"], "b", upstream_is_stage=True) == "b"  # the only link there is
    assert reply_link(["a"], "b", upstream_is_stage=True) == "a"
    assert reply_link([], "b", upstream_is_stage=False) is None


def test_tokens_go_to_the_chat_link_not_to_the_worker_sharing_its_node_id() -> None:
    rules = last_stage()
    assert rules.handle(TokensReady(tokens(0))) == [Send("chat", tokens(0))]


def test_a_one_stage_route_answers_on_the_opening_link() -> None:
    rules: SessionRules[str] = SessionRules(is_last=True)  # first and last: the client opens
    rules.handle(LinkReady("chat", "app"))
    assert rules.handle(FrameReceived("chat", "app", OPEN)) == [Begin(OPEN)]
    assert rules.handle(TokensReady(tokens(0))) == [Send("chat", tokens(0))]


def test_the_worker_redialling_does_not_take_the_chats_tokens() -> None:
    rules = last_stage()
    assert rules.handle(LinkClosed("work", "path died")) == [
        LinkLost("s1", "path died", arm_grace=True)
    ]
    # A new link under the app's id: the chat's until the OPEN comes over it again.
    rules.handle(LinkReady("work2", "app"))
    actions = rules.handle(FrameReceived("work2", "app", OPEN))
    assert Resumed("s1", "app") in actions
    assert rules.handle(TokensReady(tokens(1))) == [Send("chat", tokens(1))]


def test_the_chat_redialling_gets_the_tokens_on_its_new_link() -> None:
    rules = last_stage()
    assert rules.handle(LinkClosed("chat", "client path died")) == [
        LinkLost("s1", "client path died", arm_grace=True)
    ]
    assert rules.handle(TokensReady(tokens(0))) == []
    actions = rules.handle(LinkReady("chat2", "app"))
    assert actions[0] == Send("chat2", tokens(0))
    assert rules.handle(TokensReady(tokens(1))) == [Send("chat2", tokens(1))]
