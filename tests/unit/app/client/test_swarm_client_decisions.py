"""app.client.swarm_client's pure decisions: which link to open next, which frame answers a step."""

from __future__ import annotations

import pytest

from app.client.generation import answer_to
from app.client.swarm_client import Dial, next_dial
from app.errors import StageFailed
from net import wire
from net.errors import ErrorCode

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("have_first", "have_last", "one_stage", "expected"),
    [
        (False, False, False, Dial.LAST),  # the way back first
        (False, True, False, Dial.FIRST),
        (True, False, False, Dial.LAST),
        (True, True, False, None),
        (False, False, True, Dial.LAST),
        (False, True, True, Dial.FIRST_IS_LAST),
        (True, True, True, None),
    ],
)
def test_next_dial(have_first: bool, have_last: bool, one_stage: bool, expected: Dial) -> None:
    assert next_dial(have_first, have_last, one_stage) == expected


def test_both_links_are_opened_last_stage_first() -> None:
    have = {"first": False, "last": False}
    order = []
    while (step := next_dial(have["first"], have["last"], False)) is not None:
        order.append(step)
        have["last" if step is Dial.LAST else "first"] = True
    assert order == [Dial.LAST, Dial.FIRST]


def tokens(step_id: int) -> wire.Tokens:
    return wire.Tokens("s", step_id, (5,), (), 0, False, ())


def test_only_the_awaited_step_answers() -> None:
    assert answer_to(tokens(3), 3) == tokens(3)
    assert answer_to(tokens(2), 3) is None  # sent again after a relink: already seen
    assert answer_to(wire.Close("s", "done"), 3) is None


def test_an_error_from_the_route_is_a_stage_failure_with_its_code() -> None:
    with pytest.raises(StageFailed) as info:
        answer_to(wire.Error("s", ErrorCode.OVERLOADED, "busy"), 3)
    assert info.value.error_code is ErrorCode.OVERLOADED and info.value.message == "busy"
