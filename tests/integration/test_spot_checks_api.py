"""Spot checks through the coordinator's HTTP API, in process (FastAPI TestClient): six
workers in three chains answer a check's asks by hand; who may answer what, what is
refused, and what marking a stage faulty does (out of the plan, no renewal, the
operator's evidence and clearing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient

from coordinator.server.service import Coordinator, CoordinatorSettings
from coordinator.server.spot_policy import SpotSettings
from coordinator.spot_checks import RECOMPUTE, RECORD, TOKENS, CheckRecord, CheckStep, digest
from core.gguf_slices import slice_model
from net import auth
from tests.support.coordinator_in_process import (
    ADMIN,
    ADMIN_HEADERS,
    api_client,
    coordinator_in_process,
)
from tests.support.node_calls import join_as, node_headers
from tests.support.probe_answerer import HARDWARE

pytestmark = pytest.mark.integration

SESSION = "s1"


@pytest.fixture
def coord(tiny_llama: Path, tmp_path: Path) -> Iterator[Coordinator]:
    manifest = slice_model(tiny_llama, tmp_path / "pieces")
    settings = CoordinatorSettings(
        min_stages=2, max_chains=3, stale_after_s=30, dead_after_s=60, spot=SpotSettings(0.0)
    )
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with coordinator_in_process(url, tmp_path / "pieces", manifest, settings, _reachable) as c:
        yield c


def _reachable(_address: str) -> bool:
    return True


@pytest.fixture
def http(coord: Coordinator) -> TestClient:
    return api_client(coord)


class Node:
    def __init__(self, http: TestClient, port: int) -> None:
        self.http = http
        self.joined = join_as(http, ADMIN, "worker")
        self.id = self.joined["node_id"]
        self.port = port

    def beat(self) -> dict[str, Any]:
        body = {
            "address": f"127.0.0.1:{self.port}",
            "capacity_bytes": 8 << 30,
            "hardware": HARDWARE,
            "checkable": True,
            "check_sessions": [[SESSION, 2]],
        }
        r = self.http.post(
            f"/api/v1/nodes/{self.id}/heartbeat", headers=node_headers(self.joined), json=body
        )
        assert r.status_code == 200, r.text
        answer: dict[str, Any] = r.json()
        return answer

    def asks(self) -> list[dict[str, Any]]:
        asks: list[dict[str, Any]] = self.beat()["check_asks"]
        return asks

    def post(self, ask_id: str, body: Any) -> int:
        path = f"/api/v1/nodes/{self.id}/checks/{ask_id}"
        return self.http.post(path, headers=node_headers(self.joined), json=body).status_code

    def get(self, ask_id: str) -> Any:
        path = f"/api/v1/nodes/{self.id}/checks/{ask_id}"
        return self.http.get(path, headers=node_headers(self.joined))


def _record(outputs: list[str]) -> CheckRecord:
    steps = []
    for i, out in enumerate(outputs):
        rows = bytes([i]) * 8
        steps.append(CheckStep(i, 2 * i, 2, -1, 0, False, TOKENS, 0, 0, 1, rows, digest(rows), out))
    return CheckRecord(SESSION, tuple(steps))


def test_a_check_carried_by_heartbeats_marks_a_stage_two_holders_contradict(
    http: TestClient, coord: Coordinator
) -> None:
    nodes = [Node(http, 7200 + i) for i in range(6)]
    for _ in range(2):
        for n in nodes:
            n.beat()
    assert len(coord.chains) == 3
    by_id = {n.id: n for n in nodes}
    firsts = [by_id[c.stages[0].node_id] for c in coord.chains]
    checked, a, b = firsts
    assert http.get("/api/v1/faults").status_code == 401  # the operator's only

    r = http.post(
        "/api/v1/checks",
        headers=ADMIN_HEADERS,
        json={"node_id": checked.id, "session": SESSION, "steps": 2},
    )
    assert r.status_code == 200, r.text
    (ask,) = checked.asks()
    assert (ask["kind"], ask["session"], ask["steps"]) == (RECORD, SESSION, 2)
    assert checked.asks() == []  # each ask is given once
    claimed = [digest(b"x"), digest(b"y")]
    assert a.post(ask["check_id"], {"record": _record(claimed).to_json()}) == 404  # not a's
    assert checked.post(ask["check_id"], {"record": _record(claimed[:1]).to_json()}) == 400
    assert checked.post(ask["check_id"], {"record": {"session": SESSION, "steps": "x"}}) == 400
    assert checked.post(ask["check_id"], {"record": _record(claimed).to_json()}) == 200

    # A holder of the same layers recomputes; on a mismatch the third does.
    asked = {n.id: n.asks() for n in (a, b)}
    checker = next(n for n in (a, b) if asked[n.id])
    third = b if checker is a else a
    (recompute,) = asked[checker.id]
    assert recompute["kind"] == RECOMPUTE
    assert third.get(recompute["check_id"]).status_code == 404
    inputs = checker.get(recompute["check_id"])
    assert CheckRecord.from_json(inputs.json()) == _record(claimed)
    assert checker.post(recompute["check_id"], {"digests": ["zz"]}) == 400
    theirs = [claimed[0], digest(b"other")]
    assert checker.post(recompute["check_id"], {"digests": theirs}) == 200
    (last,) = third.asks()
    assert third.post(last["check_id"], {"digests": theirs}) == 200

    faults = http.get("/api/v1/faults", headers=ADMIN_HEADERS).json()
    evidence = faults["faulty"][checked.id]
    assert (evidence["checker"], evidence["third"]) == (checker.id, third.id)
    assert (evidence["step_id"], evidence["positions"]) == (1, [2, 4])
    assert evidence["claimed"] == claimed[1] and evidence["checker_digest"] == theirs[1]
    assert faults["counts"] == {"faulty": 1}

    # Out of every chain at once, no renewal, and back once the operator clears it.
    assert all(checked.id not in c.node_ids for c in coord.chains)
    assert checked.beat()["assignment"] is None
    key = auth.new_private_key()
    csr = auth.make_csr(key, "me").public_bytes(serialization.Encoding.PEM).decode()
    renew = http.post(
        f"/api/v1/nodes/{checked.id}/renew",
        headers={"Authorization": f"Bearer {checked.joined['token']}"},
        json={"csr_pem": csr},
    )
    assert renew.status_code == 401 and "faulty" in renew.json()["detail"]
    assert http.delete(f"/api/v1/faults/{checked.id}", headers=ADMIN_HEADERS).status_code == 200
    assert http.delete(f"/api/v1/faults/{checked.id}", headers=ADMIN_HEADERS).status_code == 404
    checked.beat()
    assert any(checked.id in c.node_ids for c in coord.chains)


def test_a_swarm_with_checks_off_asks_nothing(http: TestClient, coord: Coordinator) -> None:
    nodes = [Node(http, 7300 + i) for i in range(6)]
    for _ in range(3):
        assert all(n.beat()["check_asks"] == [] for n in nodes)
    assert http.get("/api/v1/faults", headers=ADMIN_HEADERS).json()["recent"] == []
