"""The heartbeat answer carries the coordinator's probe result to every node, checked."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.encoders import jsonable_encoder

from app.node_status import swarm_answer
from coordinator import contract as c
from coordinator.errors import MalformedAnswer

pytestmark = pytest.mark.unit


def _wire(value: Any) -> Any:
    return json.loads(json.dumps(jsonable_encoder(value)))


def test_whether_the_swarm_can_answer_survives_the_trip() -> None:
    beat = c.HeartbeatAnswer(None, (), can_answer=False, answer_since=1700, answer_reason="x")
    assert c.HeartbeatAnswer.from_json(_wire(beat)) == beat
    # From a coordinator without the probe:
    older: dict[str, Any] = {"assignment": None, "revoked_serials": []}
    assert c.HeartbeatAnswer.from_json(older).can_answer is None


@pytest.mark.parametrize("bad", ["yes", 1, [True]])
def test_a_can_answer_that_is_not_a_boolean_is_refused(bad: object) -> None:
    with pytest.raises(MalformedAnswer):
        c.HeartbeatAnswer.from_json({"assignment": None, "revoked_serials": [], "can_answer": bad})


def test_the_words_a_node_shows() -> None:
    assert swarm_answer(None, 0, "") == ""
    assert swarm_answer(True, 5, "") == "can answer"
    words = swarm_answer(False, 1_700_000_000, "the last stage w-c does not accept links")
    assert words.startswith("cannot answer since ") and words.endswith("w-c does not accept links")
