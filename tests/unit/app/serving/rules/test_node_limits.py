"""app.serving.rules.node_limits and its use in the session rules: one authenticated node that
floods OPENs (or hoards sessions) is refused OVERLOADED with a retry hint, and another
node's sessions open, step and close as if nothing happened. Plain float clock, no IO."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from app.serving.rules.node_limits import MAX_TRACKED_NODES, NodeLimits, NodeLimitsPolicy
from app.serving.rules.sessions import (
    Begin,
    End,
    FrameReceived,
    LinkClosed,
    LinkLost,
    LinkReady,
    Release,
    Resumed,
    Send,
    SessionRules,
    Take,
)
from core.admission import AdmissionLedger, AdmissionPolicy
from net import wire
from net.errors import ErrorCode
from net.protocol import overload_hint
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

OPEN = wire.Open("s", "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 2)


def open_(session: str) -> wire.Open:
    return dataclasses.replace(OPEN, session=session)


def step(session: str, step_id: int) -> wire.Step:
    return wire.Step(session, step_id, step_id, (1,), None, 1, 0, WireDtype.F32)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rules_with(policy: NodeLimitsPolicy, clock: Clock, slots: int = 64) -> SessionRules[str]:
    ledger = AdmissionLedger(AdmissionPolicy(n_ctx=100_000, max_sessions=slots))
    rules: SessionRules[str] = SessionRules(False, ledger, NodeLimits(policy, clock))
    rules.handle(LinkReady("up-bad", "bad"))
    rules.handle(LinkReady("up-good", "good"))
    return rules


def refused_overloaded(actions: Sequence[object], link: str, session: str) -> tuple[int, bool]:
    """The actions of a refused OPEN: ERROR(OVERLOADED) back on `link`, the id released
    there, nothing else (no Begin, no End of anybody's session). Returns the hint."""
    assert len(actions) == 2, actions
    send, release = actions
    assert release == Release(link, session)
    assert isinstance(send, Send) and send.link == link
    assert isinstance(send.frame, wire.Error) and send.frame.code is ErrorCode.OVERLOADED
    hint, _ = overload_hint(send.frame.code, send.frame.message)
    assert hint is not None
    return hint.retry_after_ms, hint.try_another_route


def test_a_flood_of_opens_from_one_node_leaves_the_other_nodes_sessions_working() -> None:
    clock = Clock()
    rules = rules_with(NodeLimitsPolicy(open_burst=4, open_per_s=2), clock)
    assert rules.handle(FrameReceived("up-good", "good", open_("g1"))) == [Begin(open_("g1"))]
    began = refused = 0
    for i in range(200):
        actions = rules.handle(FrameReceived("up-bad", "bad", open_(f"b{i}")))
        if actions == [Begin(open_(f"b{i}"))]:
            began += 1
        else:
            retry_ms, another = refused_overloaded(actions, "up-bad", f"b{i}")
            assert retry_ms >= 1 and not another
            refused += 1
    assert (began, refused) == (4, 196)  # the burst, then nothing while the clock stands
    # The good node: its session steps, and it opens new ones, during the flood.
    assert rules.handle(FrameReceived("up-good", "good", step("g1", 0))) == [
        Take(step("g1", 0), open_("g1"))
    ]
    assert rules.handle(FrameReceived("up-good", "good", open_("g2"))) == [Begin(open_("g2"))]
    assert rules.handle(FrameReceived("up-good", "good", wire.Close("g1", "done"))) == [
        Release("up-good", "g1"),
        End("g1", True, "done"),
    ]
    # The flooder's own admitted sessions were not touched either.
    assert rules.handle(FrameReceived("up-bad", "bad", step("b0", 0))) == [
        Take(step("b0", 0), open_("b0"))
    ]
    assert sorted(rules.sessions) == ["b0", "b1", "b2", "b3", "g2"]


def test_the_bucket_refills_with_time_and_the_hint_says_when() -> None:
    clock = Clock()
    rules = rules_with(NodeLimitsPolicy(open_burst=1, open_per_s=4), clock)
    assert rules.handle(FrameReceived("up-bad", "bad", open_("b0"))) == [Begin(open_("b0"))]
    retry_ms, _ = refused_overloaded(
        rules.handle(FrameReceived("up-bad", "bad", open_("b1"))), "up-bad", "b1"
    )
    assert retry_ms == 250  # one token at 4/s
    clock.now += 0.25
    assert rules.handle(FrameReceived("up-bad", "bad", open_("b1"))) == [Begin(open_("b1"))]


def test_a_node_at_its_session_cap_is_refused_until_one_of_its_sessions_ends() -> None:
    clock = Clock()
    rules = rules_with(NodeLimitsPolicy(max_sessions_per_node=2, open_per_s=1000), clock)
    for name in ("b0", "b1"):
        assert rules.handle(FrameReceived("up-bad", "bad", open_(name))) == [Begin(open_(name))]
    retry_ms, another = refused_overloaded(
        rules.handle(FrameReceived("up-bad", "bad", open_("b2"))), "up-bad", "b2"
    )
    assert retry_ms > 0 and another
    # Another node is not held to the flooder's count.
    for name in ("g0", "g1"):
        assert rules.handle(FrameReceived("up-good", "good", open_(name))) == [Begin(open_(name))]
    rules.handle(FrameReceived("up-bad", "bad", wire.Close("b0", "done")))
    assert rules.handle(FrameReceived("up-bad", "bad", open_("b2"))) == [Begin(open_("b2"))]


def test_a_resume_is_never_rate_limited() -> None:
    clock = Clock()
    rules = rules_with(NodeLimitsPolicy(open_burst=1, open_per_s=0.001), clock)
    assert rules.handle(FrameReceived("up-bad", "bad", open_("b0"))) == [Begin(open_("b0"))]
    assert rules.handle(LinkClosed("up-bad", "path died")) == [
        LinkLost("b0", "path died", arm_grace=True)
    ]
    rules.handle(LinkReady("up-bad2", "bad"))
    actions = rules.handle(FrameReceived("up-bad2", "bad", open_("b0")))
    assert Resumed("b0", "bad") in actions


def test_an_open_refused_by_the_limits_reserves_nothing_in_admission() -> None:
    clock = Clock()
    rules = rules_with(NodeLimitsPolicy(open_burst=1, open_per_s=1), clock, slots=2)
    assert rules.handle(FrameReceived("up-bad", "bad", open_("b0"))) == [Begin(open_("b0"))]
    for i in range(1, 50):
        rules.handle(FrameReceived("up-bad", "bad", open_(f"b{i}")))
    # One slot is left for the good node: the refused flood took none.
    assert rules.handle(FrameReceived("up-good", "good", open_("g0"))) == [Begin(open_("g0"))]


def test_policy_values_are_checked() -> None:
    for bad in (
        {"max_sessions_per_node": 0},
        {"open_burst": 0.5},
        {"open_per_s": 0},
        {"open_per_s": float("nan")},
        {"open_burst": float("inf")},
    ):
        with pytest.raises(ValueError):
            NodeLimitsPolicy(**bad)


def test_memory_stays_bounded_with_many_nodes() -> None:
    clock = Clock()
    limits = NodeLimits(NodeLimitsPolicy(open_burst=2, open_per_s=1), clock)
    for i in range(MAX_TRACKED_NODES + 500):
        assert limits.check_open(f"n{i}", 0) is None
    assert len(limits._buckets) <= MAX_TRACKED_NODES
    # A clock going back refills nothing and never goes negative.
    clock.now -= 50
    assert 0.0 <= limits.tokens("n0") <= 2.0


def test_the_stage_default_lets_one_node_fill_every_slot_at_once() -> None:
    clock = Clock()
    for slots in (1, 8, 256):
        policy = NodeLimitsPolicy.for_stage(slots)
        limits = NodeLimits(policy, clock)
        assert all(limits.check_open("one", k) is None for k in range(max(slots, 32)))
        assert limits.check_open("one", 0) is not None  # then the rate holds
        assert policy.max_sessions_per_node is None and policy.open_per_s >= 8
