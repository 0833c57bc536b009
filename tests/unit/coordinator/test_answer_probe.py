"""When the coordinator probes its chain end to end, and what the operator is told."""

from __future__ import annotations

import pytest

from coordinator.server.answer_probe import (
    AnswerState,
    Failure,
    ProbeFailure,
    ProbePolicy,
    describe,
    next_state,
    no_plan_state,
    probe_due,
)

pytestmark = pytest.mark.unit

CHAIN = (("w-a", "127.0.0.1:7001"), ("w-b", "127.0.0.1:7002"), ("w-c", "127.0.0.1:7003"))
POLICY = ProbePolicy(every_s=45.0, retry_s=10.0)
OK = AnswerState(can_answer=True, since=100.0, checked_at=100.0, chain=("w-a", "w-b", "w-c"))
BAD = AnswerState(can_answer=False, since=100.0, checked_at=100.0, reason="x")


def test_the_first_chain_is_probed_at_once() -> None:
    assert probe_due(POLICY, AnswerState(), CHAIN, None, None, 5.0)


def test_a_replanned_chain_is_probed_at_once() -> None:
    moved = (CHAIN[0], ("w-b", "127.0.0.1:7999"), CHAIN[2])  # same node, new address
    assert probe_due(POLICY, OK, moved, CHAIN, last_probe_at=100.0, now=100.5)
    assert not probe_due(POLICY, OK, CHAIN, CHAIN, last_probe_at=100.0, now=100.5)


def test_an_unchanged_chain_waits_the_interval_and_less_while_it_fails() -> None:
    assert not probe_due(POLICY, OK, CHAIN, CHAIN, 100.0, 144.0)
    assert probe_due(POLICY, OK, CHAIN, CHAIN, 100.0, 145.0)
    assert probe_due(POLICY, BAD, CHAIN, CHAIN, 100.0, 110.0)
    assert not probe_due(POLICY, BAD, CHAIN, CHAIN, 100.0, 109.0)


def test_no_chain_is_never_probed() -> None:
    assert not probe_due(POLICY, AnswerState(), (), None, None, 0.0)


def test_since_names_when_it_stopped_answering_not_the_last_probe() -> None:
    failure = Failure(ProbeFailure.NO_TOKEN, "w-a", "within 20 s", ("w-b",))
    first = next_state(OK, CHAIN, failure, 200.0)
    again = next_state(first, CHAIN, failure, 260.0)
    assert (first.can_answer, first.since) == (False, 200.0)
    assert (again.since, again.checked_at) == (200.0, 260.0)
    back = next_state(again, CHAIN, None, 300.0, answer_ms=42.0)
    assert (back.can_answer, back.since, back.reason, back.answer_ms) == (True, 300.0, "", 42.0)


def test_the_reason_names_the_stage_or_link_that_failed() -> None:
    silent = describe(Failure(ProbeFailure.NO_TOKEN, "w-a", "within 20 s", ("w-b",)), CHAIN)
    assert "w-b" in silent and "no token" in silent
    links = describe(Failure(ProbeFailure.NO_TOKEN, "w-a", "within 20 s"), CHAIN)
    assert "w-a -> w-b -> w-c" in links
    dial = describe(Failure(ProbeFailure.DIAL, "w-c", "timed out"), CHAIN)
    assert dial.startswith("the last stage w-c does not accept links")
    refused = describe(Failure(ProbeFailure.REFUSED, "w-a", "full"), CHAIN)
    assert refused == "the first stage w-a refused the probe: full"
    ring = describe(Failure(ProbeFailure.NO_RING, "w-c"), CHAIN)
    assert "w-c" in ring and "w-a" in ring


def test_no_plan_cannot_answer_and_says_why() -> None:
    state = no_plan_state(OK, "waiting for workers: 1 of 2 joined", 500.0)
    assert state.can_answer is False and state.since == 500.0
    assert "1 of 2 joined" in state.reason
