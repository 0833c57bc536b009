"""A download's bad sources go to the operator's timeline (app.serving.assigned_stage)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.serving.assigned_stage import MAX_INCIDENTS, report_incidents
from coordinator.client.mirror import FetchReport
from coordinator.contract import SourceIncident
from coordinator.errors import CoordinatorError

pytestmark = pytest.mark.unit


class _Client:
    def __init__(self, fail: bool = False) -> None:
        self.told: list[SourceIncident] = []
        self.fail = fail

    def report_incident(self, incident: SourceIncident) -> None:
        if self.fail:
            raise CoordinatorError("coordinator unreachable")
        self.told.append(incident)


def _report(demoted: str = "", peers: tuple[tuple[str, str], ...] = ()) -> FetchReport:
    return FetchReport((Path("a"),), 0, 0, demoted, 0, tuple(p for p, _ in peers), peers)


def test_the_mirror_and_each_peer_given_up_are_told_with_why() -> None:
    client = _Client()
    fetched = _report("3 failures in a row", (("worker-a", "wrong bytes"), ("worker-b", "stall")))
    report_incidents(client, fetched)  # type: ignore[arg-type]
    assert client.told == [
        SourceIncident("mirror", "3 failures in a row"),
        SourceIncident("worker-a", "wrong bytes"),
        SourceIncident("worker-b", "stall"),
    ]


def test_a_clean_download_tells_nothing_and_many_bad_peers_are_capped() -> None:
    client = _Client()
    report_incidents(client, _report())  # type: ignore[arg-type]
    assert client.told == []
    many = tuple((f"worker-{i}", "stall") for i in range(20))
    report_incidents(client, _report(peers=many))  # type: ignore[arg-type]
    assert len(client.told) == MAX_INCIDENTS


def test_a_coordinator_that_cannot_take_the_note_loses_only_the_note() -> None:
    report_incidents(_Client(fail=True), _report("bad"))  # type: ignore[arg-type]
