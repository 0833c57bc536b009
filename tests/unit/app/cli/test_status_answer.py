"""`sangama status --coordinator` says whether the swarm can answer (the coordinator's
end-to-end probe, api_models.AnswerOut)."""

from __future__ import annotations

from typing import Any

import pytest

from app.cli.fleet_status import answer_line, describe

pytestmark = pytest.mark.unit


def _swarm(answer: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "nodes": [{"health": "healthy"}, {"health": "healthy"}],
        "plan": [
            {"node_id": "w-a", "layers": [0, 4]},
            {"node_id": "w-b", "layers": [4, 8]},
        ],
        "plan_error": None,
        "prediction": None,
        "prediction_note": "",
        "answer": answer,
    }


def test_a_swarm_that_cannot_answer_says_since_when_and_why() -> None:
    answer = {
        "can_answer": False,
        "since": 1_700_000_000.0,
        "checked_at": 1_700_000_030.0,
        "reason": "the last stage w-b does not accept links",
        "chain": ["w-a", "w-b"],
        "answer_ms": 0.0,
    }
    line = next(x for x in describe(_swarm(answer)) if x.startswith("answer"))
    assert "the swarm cannot answer since " in line
    assert line.endswith("because the last stage w-b does not accept links")


def test_a_swarm_that_answers_says_so_and_nothing_before_the_first_probe() -> None:
    ok = {"can_answer": True, "since": 1.0, "checked_at": 2.0, "reason": "", "chain": []}
    assert answer_line({**ok, "answer_ms": 41.6}) == "the swarm can answer (two tokens in 42 ms)"
    assert answer_line({**ok, "can_answer": None, "answer_ms": 0.0}) == ""
    assert not any(x.startswith("answer") for x in describe(_swarm(None)))
