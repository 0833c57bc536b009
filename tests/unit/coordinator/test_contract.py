"""coordinator.contract: one shape per message, read back exactly as the server writes it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import pytest
from fastapi.encoders import jsonable_encoder

from coordinator import contract as c
from coordinator.client.downloads import DownloadError
from coordinator.errors import CoordinatorError, MalformedAnswer
from coordinator.server import api_models as api

pytestmark = pytest.mark.unit


def _wire(value: Any) -> Any:
    """What the server's JSON answer becomes on the client: FastAPI's encoding, parsed."""
    return json.loads(json.dumps(jsonable_encoder(value)))


def test_answers_survive_the_trip_through_json() -> None:
    hop = c.NextHop("worker-b", "10.0.0.2:7000")
    assignment = c.Assignment(
        "default", (0, 9), hop, c.manifest_path("default"), c.pieces_path("default")
    )
    beat = c.HeartbeatAnswer(assignment, ("12", "34"))
    assert c.HeartbeatAnswer.from_json(_wire(beat)) == beat
    assert c.HeartbeatAnswer.from_json(_wire(c.HeartbeatAnswer(None, ()))).assignment is None
    route = c.RouteAnswer("default", (c.RouteAnswerStage("worker-a", "10.0.0.1:7000", (0, 18)),))
    assert c.RouteAnswer.from_json(_wire(route)) == route
    expires = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    joined = c.JoinAnswer("worker-a", "worker", "CERT", "CA", "tok", expires)
    assert c.JoinAnswer.from_json(_wire(joined)) == joined
    turn = c.TurnAnswer("relay", 3478, "u", "p", 60, ("turn:relay:3478",))
    assert c.TurnAnswer.from_json(_wire(turn)) == turn
    signal = c.Signal("worker-a", "offer", "x.1", {"ufrag": "u"})
    assert c.Signal.from_json(_wire(signal)) == signal
    ca = c.CaAnswer("PEM", "ab" * 32)
    assert c.CaAnswer.from_json(_wire(ca)) == ca


def test_the_server_checks_the_same_fields_the_client_sends() -> None:
    def names(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert set(api.HeartbeatIn.model_fields) == names(c.Heartbeat)
    assert set(api.SignalIn.model_fields) == names(c.SignalPost)
    assert set(api.JoinIn.model_fields) == names(c.JoinRequest)
    assert set(api.RenewIn.model_fields) == names(c.RenewRequest)
    defaults = api.HeartbeatIn().model_dump()
    assert c.Heartbeat(**defaults) == c.Heartbeat()


@pytest.mark.parametrize(
    "doc", [[], {"model": "m"}, {"model": "m", "stages": [{"node_id": "a"}]}, "text"]
)
def test_a_malformed_answer_is_a_coordinator_error(doc: object) -> None:
    with pytest.raises(MalformedAnswer):
        c.RouteAnswer.from_json(doc)


def test_the_url_layout_fills_in() -> None:
    assert c.HEARTBEAT.format(node_id="worker-a") == "/api/v1/nodes/worker-a/heartbeat"
    assert c.pieces_path("default") == "/api/v1/models/default/pieces"


def test_a_failed_download_is_a_coordinator_error() -> None:
    # The CLI turns CoordinatorError into one clear line instead of a traceback.
    assert issubclass(DownloadError, CoordinatorError)
