"""The client's recovery policy (app/client/recovery.py): each rule of its table."""

from __future__ import annotations

import pytest

from app.client.recovery import (
    FailureKind,
    Probe,
    RecoveryAction,
    RecoveryPolicy,
    classify,
    convicted_span,
    dead_stages,
    decide,
    exact_for,
    first_layer_to_adopt,
)
from core.types import SamplingParams
from net.errors import ErrorCode

POLICY = RecoveryPolicy(max_recoveries=3)


@pytest.mark.parametrize(
    ("code", "unreachable", "kind"),
    [
        (ErrorCode.BAD_VALUE, True, FailureKind.CLIENT_FAULT),  # our fault even if one died
        (ErrorCode.NOT_OWNER, False, FailureKind.CLIENT_FAULT),
        (ErrorCode.STAGE_ERROR, True, FailureKind.UNREACHABLE),
        (None, True, FailureKind.UNREACHABLE),
        (ErrorCode.MISSING_POSITIONS, False, FailureKind.MISSING_STATE),
        (ErrorCode.UNKNOWN_SESSION, False, FailureKind.MISSING_STATE),
        (ErrorCode.ROUTE_MOVED, False, FailureKind.ROUTE_MOVED),
        (ErrorCode.OVERLOADED, False, FailureKind.STAGE),
        (None, False, FailureKind.STAGE),
    ],
)
def test_classify(code: ErrorCode | None, unreachable: bool, kind: FailureKind) -> None:
    assert classify(code, unreachable) is kind


def test_a_dead_stage_is_avoided_and_everything_so_far_replayed() -> None:
    d = decide(FailureKind.UNREACHABLE, 0, ("b", "b"), 11, POLICY)
    assert d.verdict is RecoveryAction.REROUTE and d.avoid == ("b",) and d.replay_tokens == 11


def test_a_restarted_stage_gets_a_replay_on_the_same_route() -> None:
    d = decide(FailureKind.MISSING_STATE, 1, (), 30, POLICY)
    assert d.verdict is RecoveryAction.REPLAY and d.avoid == () and d.replay_tokens == 30


def test_a_stage_failure_without_a_dead_stage_reroutes_without_avoiding_anyone() -> None:
    d = decide(FailureKind.STAGE, 0, (), 7, POLICY)
    assert d.verdict is RecoveryAction.REROUTE and d.avoid == ()


def test_a_moved_route_is_fetched_again_avoiding_no_one() -> None:
    d = decide(FailureKind.ROUTE_MOVED, 0, ("b",), 9, POLICY)
    assert d.verdict is RecoveryAction.REROUTE and d.avoid == () and d.replay_tokens == 9


def test_gives_up_on_its_own_fault_and_after_the_last_recovery() -> None:
    assert decide(FailureKind.CLIENT_FAULT, 0, (), 5, POLICY).verdict is RecoveryAction.GIVE_UP
    assert decide(FailureKind.UNREACHABLE, 3, ("b",), 5, POLICY).verdict is RecoveryAction.GIVE_UP
    assert decide(FailureKind.UNREACHABLE, 2, ("b",), 5, POLICY).verdict is RecoveryAction.REROUTE


def test_only_greedy_answers_are_exact_after_a_replay() -> None:
    assert exact_for(SamplingParams())
    assert not exact_for(SamplingParams(temperature=0.7, seed=3))


PROBES = {"a": Probe.ALIVE, "b": Probe.GONE, "c": Probe.SILENT}


def test_a_late_answer_counts_only_a_stage_whose_host_said_nothing_listens() -> None:
    # A slow stage, or one reachable only through ICE (its direct dial times out), is
    # silent to a short probe: it must not be replayed around while it may still answer.
    assert dead_stages(PROBES, failed=False) == ("b",)
    assert dead_stages({"c": Probe.SILENT}, failed=False) == ()


def test_a_failed_answer_suspects_the_silent_stages_too() -> None:
    assert dead_stages(PROBES, failed=True) == ("b", "c")
    assert dead_stages({"a": Probe.ALIVE}, failed=True) == ()


# ---------------------------------------------------------------- who keeps the KV

OLD_ROUTE = [("a", 0, 2), ("b", 2, 4), ("c", 4, 6), ("d", 6, 8)]


@pytest.mark.parametrize(
    ("new", "dead", "state_lost", "first"),
    [
        # b died, the spare s took its layers: c and d kept theirs.
        ([("a", 0, 2), ("s", 2, 4), ("c", 4, 6), ("d", 6, 8)], {"b"}, False, 4),
        # The first stage died: every stage after the spare keeps its KV.
        ([("s", 0, 2), ("b", 2, 4), ("c", 4, 6), ("d", 6, 8)], {"a"}, False, 2),
        # The last stage died: its replacement holds nothing, so nobody may skip rows.
        ([("a", 0, 2), ("b", 2, 4), ("c", 4, 6), ("s", 6, 8)], {"d"}, False, None),
        # c is back at the same place but was found dead (it rebooted, no KV): only d.
        (OLD_ROUTE, {"c"}, False, 6),
        # A stage that kept its node but moved its layers is new for this session.
        ([("a", 0, 2), ("b", 2, 5), ("c", 5, 6), ("d", 6, 8)], {"x"}, False, 6),
        # Nothing replaced, nothing dead: every stage keeps its KV.
        (OLD_ROUTE, set(), False, 0),
        # Someone lacks the positions and the client cannot tell who: the last stage.
        (OLD_ROUTE, set(), True, 6),
    ],
)
def test_the_stages_that_keep_the_kv_are_the_kept_run_ending_the_route(
    new: list[tuple[str, int, int]], dead: set[str], state_lost: bool, first: int | None
) -> None:
    assert first_layer_to_adopt(OLD_ROUTE, new, dead, state_lost) == first


def test_the_faulty_nodes_that_served_an_answer_name_its_first_suspect_token() -> None:
    served = {"a": 0, "b": 0, "c": 12, "d": 30}  # c and d joined after reroutes
    assert convicted_span(served, frozenset()) is None
    assert convicted_span(served, {"x"}) is None  # faulty, but never served it
    assert convicted_span(served, {"d", "c"}) == (12, ("c", "d"))
    # One the answer left before it was caught still counts: it computed tokens 0-11.
    assert convicted_span({"a": 0, "c": 12}, {"a"}) == (0, ("a",))
