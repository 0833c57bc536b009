"""contract.ModelsAnswer (GET MODELS): read as strictly as every coordinator answer."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from coordinator.contract import ModelsAnswer, SwarmModel
from coordinator.errors import MalformedAnswer

pytestmark = pytest.mark.unit


def test_a_models_list_round_trips() -> None:
    answer = ModelsAnswer(
        (SwarmModel("tiny8", 8, True, 1, 2), SwarmModel("tiny4", 4, reason="waiting"))
    )
    back = ModelsAnswer.from_json(json.loads(json.dumps(asdict(answer))))
    assert back == answer and back.names == ("tiny8", "tiny4")
    # Optional fields a coordinator may leave out.
    assert ModelsAnswer.from_json({"models": [{"name": "m", "n_layer": 2}]}).models[0].chains == 0


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"models": "tiny"},
        {"models": [{"name": "../etc", "n_layer": 2}]},
        {"models": [{"name": "m", "n_layer": 0}]},
        {"models": [{"name": "m", "n_layer": 2, "default": "yes"}]},
        {"models": [{"name": "m", "n_layer": True}]},
        {"models": [{"n_layer": 2}]},
    ],
)
def test_a_malformed_list_is_refused(doc: Any) -> None:
    with pytest.raises(MalformedAnswer):
        ModelsAnswer.from_json(doc)
