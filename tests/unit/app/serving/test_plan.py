"""app.serving.plan: what a coordinated worker does next, transition by transition."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.config import Hop
from app.node_status import ServeState
from app.serving.plan import (
    BeatTimes,
    Download,
    Load,
    NodeState,
    Release,
    Retarget,
    Serve,
    Standby,
    Stop,
    Wait,
    only_next_hop_moved,
    plan,
)
from coordinator.contract import Assignment, HeartbeatAnswer, NextHop

pytestmark = pytest.mark.unit

TIMES = BeatTimes(waiting_s=2.0, standby_s=0.5)


def stage(
    start: int, stop: int, hop: str | None = "b", address: str = "10.0.0.2:7000"
) -> Assignment:
    return Assignment(
        "m",
        (start, stop),
        None if hop is None else NextHop(hop, address),
        "/manifest",
        "/pieces",
    )


def answer(
    assignment: Assignment | None = None, standby: Assignment | None = None
) -> HeartbeatAnswer:
    return HeartbeatAnswer(assignment, (), standby)


A = stage(0, 4)
B = stage(4, 8, hop=None)


# ---------------------------------------------------------------- no stage yet


def test_with_nothing_said_a_node_without_a_stage_waits_a_heartbeat() -> None:
    assert plan(NodeState(), None, TIMES) == Wait(2.0)
    assert plan(NodeState(), answer(), TIMES) == Wait(2.0)


def test_a_standby_offer_is_got_ready() -> None:
    assert plan(NodeState(), answer(standby=B), TIMES) == Standby(B)


def test_a_spare_standing_by_asks_sooner() -> None:
    standing = NodeState(standby=B)
    assert plan(standing, answer(standby=B), TIMES) == Wait(0.5)  # the same offer again
    assert plan(standing, answer(), TIMES) == Wait(0.5)  # no offer: the pre-load is kept
    assert plan(standing, None, TIMES) == Wait(0.5)  # the coordinator did not answer


def test_another_standby_offer_replaces_the_last() -> None:
    assert plan(NodeState(standby=A), answer(standby=B), TIMES) == Standby(B)


def test_an_assignment_is_downloaded_first() -> None:
    assert plan(NodeState(), answer(A), TIMES) == Download(A, promote=False)


def test_an_assignment_wins_over_a_standby_offer() -> None:
    assert plan(NodeState(), answer(A, standby=B), TIMES) == Download(A, promote=False)


def test_the_standby_stage_assigned_is_promoted() -> None:
    assert plan(NodeState(standby=B), answer(B), TIMES) == Download(B, promote=True)
    # Same layers, another next hop (placed elsewhere since): the pre-load still serves.
    moved = replace(B, next_hop=NextHop("c", "10.0.0.3:7000"))
    assert plan(NodeState(standby=B), answer(moved), TIMES) == Download(moved, promote=True)


def test_another_stage_than_the_standby_one_frees_the_pre_load() -> None:
    assert plan(NodeState(standby=B), answer(A), TIMES) == Download(A, promote=False)


# ---------------------------------------------------------------- pieces on disk


def test_downloaded_pieces_are_loaded() -> None:
    assert plan(NodeState(pieces=A), None, TIMES) == Load(A, preloaded=False)


def test_a_pre_load_that_fits_is_started_on() -> None:
    assert plan(NodeState(pieces=A, preloaded=True), None, TIMES) == Load(A, preloaded=True)


def test_stopped_while_downloading_nothing_is_loaded() -> None:
    assert plan(NodeState(stopping=True, pieces=A, preloaded=True), None, TIMES) == Stop()


# ---------------------------------------------------------------- serving


def test_serving_goes_on_while_the_assignment_stays() -> None:
    serving = NodeState(serving=A)
    assert plan(serving, answer(A), TIMES) == Serve()
    assert plan(serving, None, TIMES) == Serve()  # the beat failed: keep serving


def test_a_new_next_hop_alone_is_a_retarget() -> None:
    moved = replace(A, next_hop=NextHop("c", "10.0.0.3:7001"))
    assert plan(NodeState(serving=A), answer(moved), TIMES) == Retarget(
        moved, Hop("c", ("10.0.0.3", 7001))
    )


def test_a_retarget_the_stage_refused_is_a_move() -> None:
    moved = replace(A, next_hop=NextHop("c", "10.0.0.3:7001"))
    refused = NodeState(serving=A, retarget_refused=True)
    assert plan(refused, answer(moved), TIMES) == Release(ServeState.MOVING)


def test_another_stage_is_a_move() -> None:
    assert plan(NodeState(serving=A), answer(B), TIMES) == Release(ServeState.MOVING)


def test_no_stage_any_more_is_a_move() -> None:
    assert plan(NodeState(serving=A), answer(None, standby=B), TIMES) == Release(ServeState.MOVING)


# ---------------------------------------------------------------- stopping


def test_stopping_releases_a_running_stage() -> None:
    assert plan(NodeState(stopping=True, serving=A), answer(B), TIMES) == Release(
        ServeState.PAUSING
    )


def test_stopping_without_a_stage_stops() -> None:
    assert plan(NodeState(stopping=True), answer(A), TIMES) == Stop()
    assert plan(NodeState(stopping=True, standby=B), None, TIMES) == Stop()


def test_a_whole_life() -> None:
    # Spare for B, promoted to B, moved to A, stopped.
    state, steps = NodeState(), []
    for heard in (answer(standby=B), answer(B), None, answer(B), answer(A)):
        action = plan(state, heard, TIMES)
        steps.append(type(action).__name__)
        if isinstance(action, Standby):
            state = replace(state, standby=action.stage)
        elif isinstance(action, Download):
            state = NodeState(pieces=action.stage, preloaded=action.promote)
        elif isinstance(action, Load):
            state = NodeState(serving=action.stage)
        elif isinstance(action, Release):
            state = NodeState()
    assert steps == ["Standby", "Download", "Load", "Serve", "Release"]
    assert plan(replace(state, stopping=True), None, TIMES) == Stop()


# ---------------------------------------------------------------- the next hop alone


def test_only_the_next_hop_moved() -> None:
    moved = replace(A, next_hop=NextHop("c", "10.0.0.3:7001"))
    assert only_next_hop_moved(A, moved) == Hop("c", ("10.0.0.3", 7001))
    assert only_next_hop_moved(A, None) is None
    assert only_next_hop_moved(A, replace(moved, max_sessions=9)) is None  # more changed
    assert only_next_hop_moved(B, B) is None  # the last stage has no next hop
    assert only_next_hop_moved(A, replace(A, next_hop=NextHop("c", "nowhere"))) is None
