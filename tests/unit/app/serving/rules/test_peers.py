"""app.serving.rules.peers and its use in the session rules: past the first stage only the
planned upstream (or, where it is not known, a node certified as a worker) opens
sessions; a first stage lets one node hold its share of the slots, closes sessions that
stopped stepping, and takes a ring only when it points back to itself. No IO."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from app.serving.rules.node_limits import NodeLimits, NodeLimitsPolicy
from app.serving.rules.peers import (
    StagePlan,
    idle_sessions,
    loop_refusal,
    opener_refusal,
    per_node_sessions,
)
from app.serving.rules.sessions import Begin, FrameReceived, LinkReady, Release, Send, SessionRules
from core.admission import AdmissionLedger, AdmissionPolicy
from net import wire
from net.errors import ErrorCode
from net.wire.tensors import WireDtype

pytestmark = pytest.mark.unit

OPEN = wire.Open("s", "m", WireDtype.F32, wire.SamplingSpec(), "client", 8, 2)
FIRST = StagePlan("stage0", True, addresses=frozenset({("127.0.0.1", 7001)}))
MIDDLE = StagePlan("stage1", False, upstream=frozenset({"stage0"}))
MIDDLE_UNPLANNED = StagePlan("stage1", False)


def ring(address: str = "127.0.0.1:7001", first: str = "stage0") -> wire.Loop:
    return wire.Loop(first, address, "stage2")


@pytest.mark.parametrize(
    ("plan", "peer", "role", "allowed"),
    [
        (FIRST, "client", "client", True),
        (FIRST, "stage9", "worker", True),
        (MIDDLE, "stage0", "worker", True),
        (MIDDLE, "client", "client", False),
        (MIDDLE, "stage7", "worker", False),  # a worker, but not the one before
        (MIDDLE_UNPLANNED, "stage7", "worker", True),
        (MIDDLE_UNPLANNED, "client", "client", False),
        (MIDDLE_UNPLANNED, "x", "", False),
    ],
)
def test_who_may_open_sessions(plan: StagePlan, peer: str, role: str, allowed: bool) -> None:
    assert (opener_refusal(plan, peer, role) is None) is allowed


@pytest.mark.parametrize(
    ("slots", "setting", "share"),
    [(1, 0, 1), (2, 0, 1), (8, 0, 6), (256, 0, 192), (8, 4, 4), (8, 20, 8)],
)
def test_one_node_holds_at_most_its_share(slots: int, setting: int, share: int) -> None:
    assert per_node_sessions(slots, setting) == share


def test_sessions_idle_too_long_are_closed_unless_their_rows_wait() -> None:
    last = {"fresh": 95.0, "stale": 10.0, "queued": 10.0, "edge": 40.0}
    assert idle_sessions(last, {"queued"}, now=100.0, idle_s=60.0) == ["stale", "edge"]
    assert idle_sessions({}, set(), 100.0, 1.0) == []


@pytest.mark.parametrize(
    ("plan", "loop", "allowed"),
    [
        (FIRST, ring(), True),
        (FIRST, ring("127.0.0.1:7002"), False),  # another port: someone else's service
        (FIRST, ring("10.1.2.3:7001"), False),  # another host
        (FIRST, ring(first="stage5"), False),  # another first stage
        (StagePlan("stage0", True, addresses=frozenset({("::", 7001)})), ring(), True),
        (StagePlan("stage0", True, addresses=frozenset({("::1", 7001)})), ring("[::1]:7001"), True),
        (dataclasses.replace(FIRST, addresses=frozenset()), ring(), False),
    ],
)
def test_a_ring_must_point_back_to_the_first_stage(
    plan: StagePlan, loop: wire.Loop, allowed: bool
) -> None:
    assert (loop_refusal(plan, loop) is None) is allowed


def _rules(plan: StagePlan, slots: int = 8, per_node: int | None = None) -> SessionRules[str]:
    ledger = AdmissionLedger(AdmissionPolicy(n_ctx=100_000, max_sessions=slots))
    limits = NodeLimits(NodeLimitsPolicy.for_stage(slots, per_node), lambda: 0.0)
    rules: SessionRules[str] = SessionRules(
        False, ledger, limits if plan.is_first else None, not plan.is_first, plan=plan
    )
    for link, peer in (("up", "stage0"), ("cl", "client"), ("bad", "intruder")):
        rules.handle(LinkReady(link, peer))
    return rules


def _refused(actions: Sequence[object], link: str, session: str, code: ErrorCode) -> None:
    assert len(actions) == 2, actions
    send, release = actions
    assert isinstance(send, Send) and isinstance(send.frame, wire.Error)
    assert (send.link, send.frame.session, send.frame.code) == (link, session, code)
    assert release == Release(link, session)


def test_a_middle_stage_refuses_opens_from_anyone_but_its_upstream() -> None:
    rules = _rules(MIDDLE)
    opened = dataclasses.replace(OPEN, session="a")
    _refused(
        rules.handle(FrameReceived("bad", "intruder", opened, "client")),
        "bad",
        "a",
        ErrorCode.NOT_OWNER,
    )
    assert rules.handle(FrameReceived("up", "stage0", opened, "worker")) == [Begin(opened)]


def test_a_first_stage_refuses_a_ring_to_another_address_and_takes_its_own() -> None:
    rules = _rules(FIRST)
    away = dataclasses.replace(OPEN, session="a", loop=ring("192.0.2.9:53"))
    _refused(
        rules.handle(FrameReceived("cl", "client", away, "client")),
        "cl",
        "a",
        ErrorCode.BAD_VALUE,
    )
    home = dataclasses.replace(OPEN, session="b", loop=ring())
    assert rules.handle(FrameReceived("cl", "client", home, "client")) == [Begin(home)]


def test_one_client_holding_its_share_leaves_the_rest_to_others() -> None:
    rules = _rules(FIRST, slots=8, per_node=per_node_sessions(8))
    began = 0
    for i in range(300):
        opened = dataclasses.replace(OPEN, session=f"h{i}")
        actions = rules.handle(FrameReceived("bad", "intruder", opened, "client"))
        began += sum(isinstance(a, Begin) for a in actions)
    assert began == 6
    mine = dataclasses.replace(OPEN, session="mine")
    assert rules.handle(FrameReceived("cl", "client", mine, "client")) == [Begin(mine)]
