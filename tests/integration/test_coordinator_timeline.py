"""The operator's story through the coordinator API, in process (FastAPI TestClient), on
SQLite and PostgreSQL: the event timeline, node names from invite notes, renaming and
forgetting nodes, paused distinct from gone."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient

from coordinator import invites as inv
from coordinator.releases import NODE_HEADERS
from coordinator.server.api import ADMIN_TOKEN, create_app
from coordinator.server.secret_hashes import hash_token
from coordinator.server.service import Coordinator, CoordinatorSettings, HostedModel
from coordinator.server.store import Event, Node, Store, migrate
from coordinator.server.timeline import MAX_EVENTS, UnknownEventKind
from core.gguf_slices import slice_model
from net import auth
from tests.support.postgres import postgres_bin, temporary_postgres
from tests.support.probe_answerer import HARDWARE

pytestmark = pytest.mark.integration

ADMIN = "admin-token-for-tests"
MIB = 1 << 20


@pytest.fixture(scope="module")
def pieces(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("pieces")
    return out, slice_model(tiny_llama, out)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'c.db'}"
        return
    if postgres_bin() is None:  # .ci/run installs it; only a bare dev machine lacks it
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    with temporary_postgres() as url:
        yield url


def _coordinator(db_url: str, pieces: tuple[Path, object]) -> Coordinator:
    store = Store(db_url)
    directory, manifest = pieces
    c = Coordinator(
        store,
        auth.create_ca("test-swarm"),
        "https://127.0.0.1:8443",
        HostedModel("tiny", directory, manifest),  # type: ignore[arg-type]
        CoordinatorSettings(min_stages=1, stale_after_s=30, dead_after_s=60),
        reachable=lambda _address: True,  # no worker answers the probe here
    )
    store.set_setting(ADMIN_TOKEN, hash_token(ADMIN))
    return c


@pytest.fixture
def coord(db_url: str, pieces: tuple[Path, object]) -> Iterator[Coordinator]:
    migrate(db_url)
    c = _coordinator(db_url, pieces)
    yield c
    c.store.close()


@pytest.fixture
def http(coord: Coordinator) -> TestClient:
    return TestClient(create_app(coord), base_url="https://testserver", headers=NODE_HEADERS)


ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}


def _invite(http: TestClient, note: str = "", uses: int = 1) -> str:
    body = {"role": "worker", "uses": uses, "expires": "1d", "note": note}
    r = http.post("/api/v1/invites", json=body, headers=ADMIN_HEADERS)
    assert r.status_code == 200, r.text
    return str(r.json()["code"])


def _join(http: TestClient, code: str) -> dict[str, str]:
    key = auth.new_private_key()
    csr = auth.make_csr(key, "me").public_bytes(serialization.Encoding.PEM).decode()
    secret = inv.InviteCode.decode(code).secret
    r = http.post("/api/v1/join", json={"secret": secret, "csr_pem": csr})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _beat(http: TestClient, node: dict[str, str], **fields: Any) -> Any:
    headers = {"X-Sangama-Node": node["node_id"], "Authorization": f"Bearer {node['token']}"}
    body = {"address": "127.0.0.1:7001", "capacity_bytes": 8 << 30, "hardware": HARDWARE}
    r = http.post(f"/api/v1/nodes/{node['node_id']}/heartbeat", headers=headers, json=body | fields)
    assert r.status_code == 200, r.text
    return r.json()


def _events(http: TestClient, **params: Any) -> list[dict[str, Any]]:
    r = http.get("/api/v1/events", headers=ADMIN_HEADERS, params=params)
    assert r.status_code == 200, r.text
    return list(r.json())


def _swarm_node(http: TestClient, node_id: str) -> dict[str, Any] | None:
    swarm = http.get("/api/v1/swarm", headers=ADMIN_HEADERS).json()
    return next((n for n in swarm["nodes"] if n["node_id"] == node_id), None)


def _silence(coord: Coordinator, node_id: str, seconds: float) -> None:
    """The node was last heard `seconds` ago (and so was the coordinator's start)."""
    then = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    coord.started_at = min(coord.started_at, then)
    with coord.store.session() as s:
        node = s.get(Node, node_id)
        assert node is not None
        node.last_seen = then
    coord.timeline.reset_sweep()  # the next look at silences is due now


def test_a_nodes_story_joined_downloading_serving_paused_gone(
    http: TestClient, coord: Coordinator
) -> None:
    node = _join(http, _invite(http, note="Asha's PC"))
    nid = node["node_id"]
    _beat(http, node, activity="waiting")
    got = _beat(http, node, activity="downloading", download_total_bytes=100 * MIB)
    assert got["assignment"]["layers"] == [0, 8]
    view = _swarm_node(http, nid)
    assert view is not None
    assert (view["name"], view["activity"], view["download_total_bytes"]) == (
        "Asha's PC",
        "downloading",
        100 * MIB,
    )
    sixty = {"download_done_bytes": 60 * MIB, "download_total_bytes": 100 * MIB}
    _beat(http, node, activity="downloading", **sixty)
    _beat(http, node, activity="loading")
    _beat(http, node, activity="serving", backend="CPU (haswell)", n_layers=8)
    _beat(http, node, paused="on battery")
    view = _swarm_node(http, nid)
    assert view is not None and (view["state"], view["paused"]) == ("paused", "on battery")
    assert not view["forgettable"]  # paused is not gone: it may come back any minute

    # Silent past stale_after_s, still saying it pauses: paused, not stale.
    _silence(coord, nid, 40)
    view = _swarm_node(http, nid)
    assert view is not None and view["state"] == "paused"
    # Silent past dead_after_s: gone, told once however often the page looks.
    _silence(coord, nid, 70)
    view = _swarm_node(http, nid)
    assert view is not None and view["state"] == "gone" and view["forgettable"]
    _events(http)

    told = _events(http)
    story = [(e["kind"], e["node_id"], e["detail"]) for e in told if e["kind"] != "started"]
    assert story == [
        ("joined", nid, "as worker with invite #1 (Asha's PC)"),
        ("replanned", "", f"1 stage: Asha's PC ({nid}) 0-7"),
        ("downloading", nid, "layers 0-7: 0% of 100.0 MiB"),
        ("downloading", nid, "layers 0-7: 60% of 100.0 MiB"),
        ("loading", nid, "layers 0-7"),
        ("serving", nid, "layers 0-7"),
        ("paused", nid, "on battery"),
        ("no_plan", "", "waiting for workers: 0 of 1 joined"),
        ("gone", nid, "silent for 70 s: out of the plan"),
    ]
    labels = {e["kind"]: (e["label"], e["tone"]) for e in _events(http)}
    assert labels["paused"] == ("paused", "warn") and labels["gone"] == ("gone", "bad")

    # It comes back: told so, and a restarted coordinator does not tell it gone again.
    _beat(http, node, activity="serving", backend="CPU (haswell)", n_layers=8)
    back = [(e["kind"], e["detail"]) for e in _events(http)][-4:]
    assert back == [
        ("replanned", f"1 stage: Asha's PC ({nid}) 0-7"),
        ("back", "heartbeats again after 70 s of silence"),
        ("resumed", "offers to serve again"),
        ("serving", "layers 0-7"),
    ]


def test_events_survive_a_restart_and_only_the_newest_are_kept(
    db_url: str, pieces: tuple[Path, object]
) -> None:
    migrate(db_url)
    first = _coordinator(db_url, pieces)
    for i in range(MAX_EVENTS + 20):
        first.record_event("probe_failed", "worker-abc123", f"route probe {i} got no answer")
    with pytest.raises(UnknownEventKind):
        first.record_event("exploded", "worker-abc123", "not a kind")
    first.store.close()

    second = _coordinator(db_url, pieces)
    try:
        events = second.events(limit=500)
        assert len(events) == 500
        assert events[-1].kind == "started"  # the second start
        assert events[-2].detail == f"route probe {MAX_EVENTS + 19} got no answer"
        with second.store.session() as s:
            assert s.query(Event).count() == MAX_EVENTS
        newer = second.events(after=events[-3].id)
        assert [e.id for e in newer] == [events[-2].id, events[-1].id]
    finally:
        second.store.close()


def test_nodes_are_named_from_the_invite_note_and_renamed_by_the_operator(
    http: TestClient,
) -> None:
    code = _invite(http, note="  rack 3 ", uses=2)
    a, b = _join(http, code), _join(http, code)
    assert _swarm_node(http, a["node_id"])["name"] == "rack 3"  # type: ignore[index]
    assert _swarm_node(http, b["node_id"])["name"] == "rack 3 #2"  # type: ignore[index]

    path = f"/api/v1/nodes/{b['node_id']}/name"
    assert http.post(path, json={"name": "Ravi's laptop"}).status_code == 401
    r = http.post(path, json={"name": "Ravi's\tlaptop "}, headers=ADMIN_HEADERS)
    assert r.status_code == 200 and r.json() == {"name": "Ravi's laptop"}
    assert _swarm_node(http, b["node_id"])["name"] == "Ravi's laptop"  # type: ignore[index]
    too_long = http.post(path, json={"name": "x" * 65}, headers=ADMIN_HEADERS)
    assert too_long.status_code == 422
    nobody = "/api/v1/nodes/worker-000000/name"
    missing = http.post(nobody, json={"name": "x"}, headers=ADMIN_HEADERS)
    assert missing.status_code == 404
    renamed = [e for e in _events(http) if e["kind"] == "renamed"]
    assert [(e["node_id"], e["detail"]) for e in renamed] == [
        (b["node_id"], "'rack 3 #2' -> \"Ravi's laptop\"")
    ]


def test_forget_takes_gone_nodes_off_the_page_and_refuses_live_ones(
    http: TestClient, coord: Coordinator
) -> None:
    alive, dead = _join(http, _invite(http)), _join(http, _invite(http))
    _beat(http, alive)
    _beat(http, dead)
    for node in (alive, dead):
        r = http.delete(f"/api/v1/nodes/{node['node_id']}", headers=ADMIN_HEADERS)
        assert r.status_code == 409 and "healthy" in r.json()["detail"]
    assert http.delete(f"/api/v1/nodes/{dead['node_id']}").status_code == 401

    _silence(coord, dead["node_id"], 70)
    _beat(http, alive)  # keeps `alive` alive
    r = http.delete(f"/api/v1/nodes/{dead['node_id']}", headers=ADMIN_HEADERS)
    assert r.status_code == 200, r.text
    assert _swarm_node(http, dead["node_id"]) is None
    assert _swarm_node(http, alive["node_id"]) is not None
    again = http.delete(f"/api/v1/nodes/{dead['node_id']}", headers=ADMIN_HEADERS)
    assert again.status_code == 404
    # Its token no longer works, and its certificate is revoked.
    headers = {"X-Sangama-Node": dead["node_id"], "Authorization": f"Bearer {dead['token']}"}
    r = http.post(f"/api/v1/nodes/{dead['node_id']}/heartbeat", headers=headers, json={})
    assert r.status_code == 401 and "forgotten" in r.json()["detail"]
    cert = auth.load_certificate(dead["certificate_pem"].encode())
    assert str(cert.serial_number) in coord.revoked_serials()
    kinds = [(e["kind"], e["node_id"]) for e in _events(http)]
    assert ("gone", dead["node_id"]) in kinds and kinds[-1] == ("forgotten", dead["node_id"])
