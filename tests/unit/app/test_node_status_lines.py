"""app.node_status.announced_lines: the stdout lines are a view of the typed status."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.node_status import NodeStatus, ServeState, announced_lines, ready_line

pytestmark = pytest.mark.unit

BASE = NodeStatus(node_id="n1", address="127.0.0.1:7000")


def test_ready_when_a_stage_starts_serving_and_only_then() -> None:
    loading = replace(BASE, state=ServeState.LOADING, layers=(0, 4), preloaded=True)
    serving = replace(loading, state=ServeState.SERVING)
    assert announced_lines(loading, serving) == ("READY n1 127.0.0.1:7000 layers 0-3",)
    assert announced_lines(serving, replace(serving, running=3)) == ()  # each heartbeat


def test_the_ready_line_names_node_address_and_layers() -> None:
    assert ready_line("n1", "[::1]:7000", (4, 5)) == "READY n1 [::1]:7000 layer 4"


def test_loading_only_for_a_stage_not_built_ahead() -> None:
    downloading = replace(BASE, state=ServeState.DOWNLOADING, layers=(4, 8))
    cold = replace(downloading, state=ServeState.LOADING)
    warm = replace(cold, preloaded=True)
    assert announced_lines(downloading, cold) == ("LOADING layers 4-7",)
    assert announced_lines(downloading, warm) == ()


def test_standby_once_the_standby_stage_has_its_pieces() -> None:
    waiting = replace(BASE, state=ServeState.WAITING)
    ready = replace(waiting, standby=(4, 8))
    assert announced_lines(waiting, ready) == ("STANDBY layers 4-7",)
    assert announced_lines(ready, ready) == ()  # the next heartbeat's report
    assert announced_lines(ready, replace(ready, standby=(0, 4))) == ("STANDBY layers 0-3",)
    assert announced_lines(None, ready) == ("STANDBY layers 4-7",)


def test_nothing_for_states_scripts_do_not_wait_for() -> None:
    for state in (ServeState.WAITING, ServeState.MOVING, ServeState.PAUSING, ServeState.PAUSED):
        assert announced_lines(BASE, replace(BASE, state=state, layers=(0, 4))) == ()
