"""The coordinator's HTTP API, in process (FastAPI TestClient), on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient

from coordinator import invites as inv
from coordinator.contract import HeartbeatAnswer
from coordinator.releases import RELEASE_HEADER
from coordinator.server.service import Coordinator, CoordinatorSettings
from coordinator.server.store import Invite, Store, migrate
from core.gguf_slices import slice_model
from net import auth
from net.wire.versions import this_release
from tests.support.coordinator_in_process import (
    ADMIN_HEADERS,
    api_client,
    coordinator_in_process,
)
from tests.support.postgres import postgres_bin, temporary_postgres
from tests.support.probe_answerer import HARDWARE

pytestmark = pytest.mark.integration


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


@pytest.fixture
def coord(db_url: str, pieces: tuple[Path, object]) -> Iterator[Coordinator]:
    directory, manifest = pieces
    settings = CoordinatorSettings(min_stages=2, stale_after_s=30, dead_after_s=60)
    # No worker answers the probe here.
    with coordinator_in_process(db_url, directory, manifest, settings, lambda _a: True) as c:
        c.set_admin_password("operator-pw")
        yield c


@pytest.fixture
def http(coord: Coordinator) -> TestClient:
    return api_client(coord)


def _admin() -> dict[str, str]:
    return ADMIN_HEADERS


def _invite(http: TestClient, role: str = "worker", uses: int = 1) -> str:
    r = http.post(
        "/api/v1/invites", json={"role": role, "uses": uses, "expires": "1d"}, headers=_admin()
    )
    assert r.status_code == 200, r.text
    return str(r.json()["code"])


def _csr() -> str:
    key = auth.new_private_key()
    return auth.make_csr(key, "me").public_bytes(serialization.Encoding.PEM).decode()


def _join(http: TestClient, code: str) -> dict[str, str]:
    secret = inv.InviteCode.decode(code).secret
    r = http.post("/api/v1/join", json={"secret": secret, "csr_pem": _csr()})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _node_headers(joined: dict[str, str]) -> dict[str, str]:
    return {"X-Sangama-Node": joined["node_id"], "Authorization": f"Bearer {joined['token']}"}


def test_invite_join_heartbeat_placement_route_and_pieces(
    http: TestClient, coord: Coordinator
) -> None:
    code = _invite(http, uses=2)
    parsed = inv.InviteCode.decode(code)
    assert parsed.ca_fingerprint == coord.ca_fingerprint
    a, b = _join(http, code), _join(http, code)
    cert = auth.load_certificate(a["certificate_pem"].encode())
    ident = auth.verify_node_certificate(cert, coord.ca.certificate, expected_node_id=a["node_id"])
    assert ident.role == "worker"

    # One worker is not enough for min_stages=2: no assignment yet.
    r = http.post(
        f"/api/v1/nodes/{a['node_id']}/heartbeat",
        headers=_node_headers(a),
        json={"address": "127.0.0.1:7001", "capacity_bytes": 8 << 30, "hardware": HARDWARE},
    )
    assert r.status_code == 200 and r.json()["assignment"] is None
    r = http.post(
        f"/api/v1/nodes/{b['node_id']}/heartbeat",
        headers=_node_headers(b),
        json={"address": "127.0.0.1:7002", "capacity_bytes": 8 << 30, "hardware": HARDWARE},
    )
    got_b = r.json()["assignment"]
    got_a = http.get(f"/api/v1/nodes/{a['node_id']}/assignment", headers=_node_headers(a)).json()
    layers = sorted([tuple(got_a["layers"]), tuple(got_b["layers"])])
    assert layers[0][0] == 0 and layers[-1][1] == 8 and layers[0][1] == layers[1][0]
    first = got_a if got_a["layers"][0] == 0 else got_b
    assert first["next_hop"] is not None

    client = _join(http, _invite(http, role="client"))
    route = http.get("/api/v1/route", headers=_node_headers(client)).json()
    assert [tuple(s["layers"]) for s in route["stages"]] == layers

    manifest = http.get(first["manifest_url"], headers=_node_headers(client))
    assert manifest.status_code == 200 and manifest.json()["facts"]["n_layer"] == 8
    piece = http.get(
        f"{first['pieces_url']}/blk.003.gguf", headers={**_node_headers(a), "Range": "bytes=0-9"}
    )
    assert piece.status_code == 206 and len(piece.content) == 10
    assert (
        http.get(f"{first['pieces_url']}/../manifest.json", headers=_node_headers(a)).status_code
        == 404
    )
    assert http.get(f"{first['pieces_url']}/blk.003.gguf").status_code == 401

    assert http.get("/metrics").status_code == 401  # not loopback, no token: refused
    metrics = http.get("/metrics", headers=_admin()).text
    assert 'sangama_nodes{health="healthy",role="worker"} 2' in metrics
    assert "sangama_plan_stages 2" in metrics


def test_each_bad_invite_gets_its_own_clear_message(http: TestClient, coord: Coordinator) -> None:
    def join_with(secret: str) -> tuple[int, str]:
        r = http.post("/api/v1/join", json={"secret": secret, "csr_pem": _csr()})
        return r.status_code, str(r.json().get("detail", ""))

    assert join_with("forged-secret") == (403, join_with("forged-secret")[1])
    assert "not known" in join_with("forged-secret")[1]

    used = inv.InviteCode.decode(_invite(http)).secret
    assert join_with(used)[0] == 200
    status, msg = join_with(used)
    assert status == 403 and "already been used" in msg

    revoked_code = _invite(http)
    invite_id = max(i.id for i in coord.list_invites())
    assert http.delete(f"/api/v1/invites/{invite_id}", headers=_admin()).status_code == 200
    status, msg = join_with(inv.InviteCode.decode(revoked_code).secret)
    assert status == 403 and "revoked" in msg

    expired = inv.InviteCode.decode(_invite(http)).secret
    with coord.store.session() as s:
        row = s.query(Invite).filter(Invite.secret_hash == inv.hash_secret(expired)).one()
        row.expires_at = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    status, msg = join_with(expired)
    assert status == 403 and "expired" in msg


def test_operator_endpoints_need_credentials(http: TestClient) -> None:
    assert http.get("/api/v1/swarm").status_code == 401
    assert http.post("/api/v1/invites", json={"role": "worker"}).status_code == 401
    assert http.post("/api/v1/login", json={"password": "wrong"}).status_code == 401
    assert http.post("/api/v1/login", json={"password": "operator-pw"}).status_code == 200
    assert http.get("/api/v1/swarm").status_code == 200  # the session cookie now works


def test_a_revoked_node_is_locked_out_and_published(http: TestClient) -> None:
    a = _join(http, _invite(http))
    serial = str(auth.load_certificate(a["certificate_pem"].encode()).serial_number)
    assert http.post(f"/api/v1/nodes/{a['node_id']}/revoke", headers=_admin()).status_code == 200
    r = http.post(f"/api/v1/nodes/{a['node_id']}/heartbeat", headers=_node_headers(a), json={})
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    b = _join(http, _invite(http))
    assert serial in http.get("/api/v1/revoked", headers=_node_headers(b)).json()


def test_bad_input_gets_4xx_with_a_message(http: TestClient) -> None:
    big = "x" * (2 << 20)
    r = http.post("/api/v1/join", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger" in r.json()["detail"]
    r = http.post(
        "/api/v1/join", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    r = http.post("/api/v1/join", json={"secret": "x", "csr_pem": "not a csr"})
    assert r.status_code in (400, 403) and r.json()["detail"]
    r = http.post("/api/v1/invites", json={"role": "admin", "uses": 0}, headers=_admin())
    assert r.status_code == 422


def test_schema_matches_the_migrations(db_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from coordinator.server.store import Base, make_engine

    migrate(db_url)
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_signalling_carries_ice_offers_between_joined_nodes(http: TestClient) -> None:
    a, b = _join(http, _invite(http)), _join(http, _invite(http))
    for port, w in enumerate((a, b)):  # two stages: a planned link between them
        body = {"address": f"127.0.0.1:{7001 + port}", "capacity_bytes": 1 << 30}
        url = f"/api/v1/nodes/{w['node_id']}/heartbeat"
        assert http.post(url, headers=_node_headers(w), json={**body, "hardware": HARDWARE})
    candidate = "1 1 UDP 2130706431 192.0.2.7 40000 typ host"
    offer = {
        "kind": "offer",
        "link": "0123456789abcdef.1",
        "payload": {"ufrag": "abcd", "pwd": "p" * 22, "candidates": [candidate], "ice_lite": False},
    }
    r = http.post(f"/api/v1/signal/{b['node_id']}", json=offer, headers=_node_headers(a))
    assert r.status_code == 200, r.text
    got = http.get("/api/v1/signal", headers=_node_headers(b)).json()
    assert got == [{"sender": a["node_id"], **offer}]
    answer = {**offer, "kind": "answer"}
    r = http.post(f"/api/v1/signal/{a['node_id']}", json=answer, headers=_node_headers(b))
    assert r.status_code == 200, r.text
    assert http.get("/api/v1/signal", params={"wait": 0.2}, headers=_node_headers(b)).json() == []
    assert (
        http.post("/api/v1/signal/nobody", json=offer, headers=_node_headers(a)).status_code == 404
    )
    assert http.post(f"/api/v1/signal/{b['node_id']}", json=offer).status_code == 401


def test_heartbeat_reports_the_path_type(http: TestClient, coord: Coordinator) -> None:
    a = _join(http, _invite(http))
    body = {
        "address": "127.0.0.1:7001",
        "capacity_bytes": 1 << 30,
        "hardware": HARDWARE,
        "path": "relayed",
    }
    assert (
        http.post(
            f"/api/v1/nodes/{a['node_id']}/heartbeat", headers=_node_headers(a), json=body
        ).status_code
        == 200
    )
    assert {n.node_id: n.path for n in coord.nodes()}[a["node_id"]] == "relayed"
    body["path"] = "teleported"
    assert (
        http.post(
            f"/api/v1/nodes/{a['node_id']}/heartbeat", headers=_node_headers(a), json=body
        ).status_code
        == 422
    )


COMPUTE = {
    "backend": "Vulkan0 (NVIDIA GeForce RTX 4090), 6/8 layers",
    "device_bytes_used": 3 << 30,
    "device_cap_bytes": 8 << 30,
    "gpu_layers": 6,
    "n_layers": 8,
}


def _swarm_node(http: TestClient, node_id: str) -> dict[str, object]:
    nodes = http.get("/api/v1/swarm", headers=_admin()).json()["nodes"]
    return dict(next(n for n in nodes if n["node_id"] == node_id))


def test_heartbeat_says_what_runs_the_stage(http: TestClient) -> None:
    a = _join(http, _invite(http))
    url, headers = f"/api/v1/nodes/{a['node_id']}/heartbeat", _node_headers(a)
    beat = {"address": "127.0.0.1:7001", "capacity_bytes": 1 << 30, "hardware": HARDWARE}
    assert http.post(url, headers=headers, json={**beat, **COMPUTE}).status_code == 200
    node = _swarm_node(http, a["node_id"])
    assert {k: node[k] for k in COMPUTE} == COMPUTE
    # A beat without them (the stage was freed) says nothing runs here any more.
    assert http.post(url, headers=headers, json=beat).status_code == 200
    node = _swarm_node(http, a["node_id"])
    assert node["backend"] == "" and node["gpu_layers"] == node["device_bytes_used"] == 0


SESSIONS = {
    "sessions": 200,
    "max_sessions": 256,
    "kv_budget_bytes": 400 << 20,
    "kv_reserved_bytes": 310 << 20,
}


def test_heartbeat_reports_sessions_and_free_kv_and_the_assignment_sizes_the_stage(
    http: TestClient, coord: Coordinator
) -> None:
    a, b = _join(http, _invite(http)), _join(http, _invite(http))
    url, headers = f"/api/v1/nodes/{a['node_id']}/heartbeat", _node_headers(a)
    beat = {
        "address": "127.0.0.1:7001",
        "capacity_bytes": 64 << 30,
        "hardware": HARDWARE,
        **SESSIONS,
    }
    other = {"address": "127.0.0.1:7002", "capacity_bytes": 64 << 30, "hardware": HARDWARE}
    assert http.post(url, headers=headers, json=beat).status_code == 200
    b_url = f"/api/v1/nodes/{b['node_id']}/heartbeat"
    assert http.post(b_url, headers=_node_headers(b), json=other).status_code == 200
    answer = http.post(url, headers=headers, json=beat)  # two workers: a plan, a stage
    assert answer.status_code == 200
    node = _swarm_node(http, a["node_id"])
    assert {k: node[k] for k in SESSIONS} == SESSIONS
    # What placement counted KV for is what the worker is told to allocate.
    assignment = HeartbeatAnswer.from_json(answer.json()).assignment
    assert assignment is not None
    assert assignment.max_sessions == coord.settings.sessions_per_stage == 64
    assert assignment.context_tokens == coord.settings.context_tokens
    bad = http.post(url, headers=headers, json={**beat, "kv_reserved_bytes": -1})
    assert bad.status_code == 422


@pytest.mark.parametrize(
    "bad",
    [
        {"gpu_layers": 9, "n_layers": 8},
        {"gpu_layers": -1},
        {"n_layers": 1 << 40},
        {"device_bytes_used": 1 << 60},
        {"device_cap_bytes": -5},
        {"backend": "x" * 201},
        {"backend": "CPU\x00(zen4)"},
        {"backend": 3},
    ],
)
def test_heartbeat_refuses_impossible_compute_facts(
    http: TestClient, bad: dict[str, object]
) -> None:
    a = _join(http, _invite(http))
    r = http.post(
        f"/api/v1/nodes/{a['node_id']}/heartbeat",
        headers=_node_headers(a),
        json={**COMPUTE, **bad},
    )
    assert r.status_code == 422, r.text
    assert _swarm_node(http, a["node_id"])["backend"] == ""


def test_nodes_from_before_migration_0002_read_as_serving_nothing(db_url: str) -> None:
    from alembic import command
    from sqlalchemy import text

    from coordinator.server.store import Node, alembic_config, make_engine

    config = alembic_config(db_url)
    command.upgrade(config, "0001")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO nodes (node_id, role, token_hash, address, capacity_bytes,"
                " vram_cap_bytes, hardware, stats, path, revoked, created_at) VALUES ('w-1',"
                " 'worker', 'h', '', 0, 0, '{}', '{}', 'direct', false, CURRENT_TIMESTAMP)"
            )
        )
    engine.dispose()
    migrate(db_url)
    store = Store(db_url)
    with store.session() as s:
        node = s.get(Node, "w-1")
        assert node is not None
        assert (node.backend, node.device_bytes_used, node.device_cap_bytes) == ("", 0, 0)
        assert (node.gpu_layers, node.n_layers) == (0, 0)
        assert (node.sessions, node.max_sessions, node.kv_budget_bytes) == (0, 0, 0)
    store.close()
    command.downgrade(config, "0001")  # and back: the columns go, the node stays
    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT node_id FROM nodes")).scalars().all() == ["w-1"]
    engine.dispose()


def test_spare_capacity_forms_a_second_chain_and_routes_follow_the_load(
    http: TestClient, coord: Coordinator
) -> None:
    coord.settings = CoordinatorSettings(
        min_stages=2, max_chains=2, stale_after_s=30, dead_after_s=60
    )
    workers = [_join(http, _invite(http)) for _ in range(4)]

    def beat(w: dict[str, str], port: int, sessions: int) -> None:
        load = {"sessions": sessions, "max_sessions": 256, "kv_budget_bytes": 256 << 20}
        load["kv_reserved_bytes"] = sessions << 20
        body = {
            "address": f"127.0.0.1:{port}",
            "capacity_bytes": 8 << 30,
            "hardware": HARDWARE,
            **load,
        }
        url = f"/api/v1/nodes/{w['node_id']}/heartbeat"
        assert http.post(url, headers=_node_headers(w), json=body).status_code == 200

    for i, w in enumerate(workers):
        beat(w, 7100 + i, 0)
    chains = coord.chains
    assert len(chains) == 2
    assert not set(chains[0].node_ids) & set(chains[1].node_ids)
    assert all(coord.assignment(w["node_id"]) is not None for w in workers)
    # The main chain's stages run 200 sessions, the second's none: routes go there.
    port = {w["node_id"]: 7100 + i for i, w in enumerate(workers)}
    by_id = {w["node_id"]: w for w in workers}
    for nid in chains[0].node_ids:
        beat(by_id[nid], port[nid], 200)
    client = _join(http, _invite(http, role="client"))
    first = [
        s["node_id"]
        for s in http.get("/api/v1/route", headers=_node_headers(client)).json()["stages"]
    ]
    assert first == list(chains[1].node_ids)
    # Both loaded alike: the routes handed out since the last beats tip it back.
    for nid in chains[1].node_ids:
        beat(by_id[nid], port[nid], 200)
    picks = [
        tuple(
            s["node_id"]
            for s in http.get("/api/v1/route", headers=_node_headers(client)).json()["stages"]
        )
        for _ in range(4)
    ]
    assert set(picks) == {chains[0].node_ids, chains[1].node_ids}


def test_the_swarm_view_predicts_tokens_per_s_from_heartbeats(http: TestClient) -> None:
    code = _invite(http, uses=2)
    a, b = _join(http, code), _join(http, code)
    beats = {
        a["node_id"]: {
            "rtt_ms": {b["node_id"]: 4.0},
            "step_ms": [[1, 10.0], [8, 24.0]],
            "row_budget": 8,
            "max_sessions": 16,
        },
        b["node_id"]: {"rtt_ms": {a["node_id"]: 6.0}, "step_ms": [[1, 20.0]], "max_sessions": 4},
    }
    for port, joined in enumerate((a, b)):
        swarm = http.get("/api/v1/swarm", headers=_admin()).json()
        assert swarm["prediction"] is None and swarm["prediction_note"]
        body = {
            "address": f"127.0.0.1:{7001 + port}",
            "capacity_bytes": 8 << 30,
            "hardware": HARDWARE,
        }
        r = http.post(
            f"/api/v1/nodes/{joined['node_id']}/heartbeat",
            headers=_node_headers(joined),
            json={**body, **beats[joined["node_id"]]},
        )
        assert r.status_code == 200, r.text
    p = http.get("/api/v1/swarm", headers=_admin()).json()["prediction"]
    # steps 10 + 20, both ring links at half the mean round trip (5 ms), 2 hops of 0.5 +
    # 0.2 a row (coordinator/server/prediction.py)
    assert p["trip_ms"] == pytest.approx(36.4)
    assert p["one_request_tokens_per_s"] == pytest.approx(1000 / 36.4)
    assert (p["admission_limit"], p["assumed_links"], p["slowest_node"]) == (4, 0, b["node_id"])
    assert [lv["requests"] for lv in p["levels"]] == [1, 2, 4]
    # 4 at once: a steps 10 + 14 x 3/7 = 16 ms, b 20 ms, hops 2 x (0.5 + 4 x 0.2)
    assert p["levels"][-1]["tokens_per_s"] == pytest.approx(4000 / 43.6)
    assert p["peak"]["requests"] == 4


@pytest.mark.parametrize(
    "field",
    [
        {"step_ms": [[2, 1.0], [1, 2.0]]},
        {"step_ms": [[0, 1.0]]},
        {"step_ms": [[1, -1.0]]},
        {"step_ms": [[r, 1.0] for r in range(1, 18)]},
        {"row_budget": -1},
        {"rtt_ms": {"peer": -0.5}},
        {"rtt_ms": {"peer": 1e9}},
        {"rtt_ms": {"x" * 65: 1.0}},
        {"rtt_ms": {f"p{i}": 1.0 for i in range(65)}},
    ],
)
def test_heartbeat_refuses_unbounded_timings(http: TestClient, field: dict[str, object]) -> None:
    joined = _join(http, _invite(http))
    r = http.post(
        f"/api/v1/nodes/{joined['node_id']}/heartbeat", headers=_node_headers(joined), json=field
    )
    assert r.status_code == 422, r.text


def test_a_single_use_invite_is_redeemed_once_by_24_concurrent_joins(
    coord: Coordinator, http: TestClient
) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    secret = inv.InviteCode.decode(_invite(http)).secret
    csr, start = _csr(), threading.Barrier(24)

    def redeem(_i: int) -> str:
        start.wait()
        try:
            return coord.join(secret, csr).node_id
        except inv.InviteError:
            return ""

    with ThreadPoolExecutor(24) as pool:
        joined = [n for n in pool.map(redeem, range(24)) if n]
    assert len(joined) == 1
    assert [i.uses_left for i in coord.list_invites()] == [0]


def test_a_route_report_naming_many_stages_probes_few_and_keeps_only_stages(
    coord: Coordinator, http: TestClient
) -> None:
    probed: list[str] = []

    def listens(address: str) -> bool:
        probed.append(address)
        return False  # something listens everywhere: nobody is confirmed gone

    coord.liveness_probe = listens
    workers = [_join(http, _invite(http)) for _ in range(2)]
    for port, w in enumerate(workers):
        body = {"address": f"127.0.0.1:{7001 + port}", "capacity_bytes": 1 << 30}
        url = f"/api/v1/nodes/{w['node_id']}/heartbeat"
        assert http.post(url, headers=_node_headers(w), json={**body, "hardware": HARDWARE})
    client = _join(http, _invite(http, role="client"))
    staged = [w["node_id"] for w in workers]
    names = [*staged, *(f"made-up-{i}" for i in range(14))]
    for _ in range(5):
        r = http.get("/api/v1/route", params={"avoid": names}, headers=_node_headers(client))
        assert r.status_code == 404  # every stage named: no route around them yet
    assert len(probed) <= 6  # the asker's probe budget, not 2 x 5 reports
    assert coord._suspects <= set(staged)
    too_many = [*names, "one-more"]
    r = http.get("/api/v1/route", params={"avoid": too_many}, headers=_node_headers(client))
    assert r.status_code == 422


def test_releases_older_than_the_swarm_admits_are_refused_at_join_and_heartbeat(
    http: TestClient, coord: Coordinator
) -> None:
    """A node of the previous wire version (no release stated, or one below min_release)
    is refused in words the tray and CLI show; one of this release gets the newest
    release the operator announced."""
    code = _invite(http, uses=3)
    secret = inv.InviteCode.decode(code).secret
    body = {"secret": secret, "csr_pem": _csr()}
    unstated = http.post("/api/v1/join", json=body, headers={RELEASE_HEADER: ""})
    assert unstated.status_code == 426
    assert unstated.json()["detail"] == (
        f"a Sangama release from before 0.1.0 is too old for this swarm: "
        f"update to {coord.settings.min_release} or later"
    )
    coord.settings = replace(coord.settings, min_release="9.0", latest_release="9.1.0")
    old = http.post("/api/v1/join", json=body)
    assert old.status_code == 426
    assert old.json()["detail"] == (
        f"Sangama {this_release()} is too old for this swarm: update to 9.0 or later"
    )
    coord.settings = replace(coord.settings, min_release=this_release())
    a = _join(http, code)
    url = f"/api/v1/nodes/{a['node_id']}/heartbeat"
    r = http.post(url, headers=_node_headers(a), json={})
    assert r.status_code == 200, r.text
    assert (r.json()["latest_release"], r.json()["min_release"]) == ("9.1.0", this_release())
    # The same, public, for `sangama status` (coordinator.contract.Health).
    health = http.get("/api/v1/health").json()
    assert health == {"status": "ok", "latest_release": "9.1.0", "min_release": this_release()}
    refused = http.post(url, headers={**_node_headers(a), RELEASE_HEADER: "0.0.1"}, json={})
    assert refused.status_code == 426 and "Sangama 0.0.1 is too old" in refused.json()["detail"]


def test_piece_sources_list_the_peers_serving_a_piece_then_the_coordinator(
    http: TestClient, coord: Coordinator
) -> None:
    code = _invite(http, uses=3)
    a, b, c = _join(http, code), _join(http, code), _join(http, code)
    for n, (node, port) in enumerate(((a, 7001), (b, 7002))):
        beat = {"address": f"127.0.0.1:{port}", "capacity_bytes": 8 << 30, "hardware": HARDWARE}
        r = http.post(
            f"/api/v1/nodes/{node['node_id']}/heartbeat", headers=_node_headers(node), json=beat
        )
        assert r.status_code == 200, r.text
        assert n == 0 or r.json()["assignment"] is not None
    got = {
        node["node_id"]: http.get(
            f"/api/v1/nodes/{node['node_id']}/assignment", headers=_node_headers(node)
        ).json()
        for node in (a, b)
    }
    for node, port in ((a, 7101), (b, 7102)):
        layers = got[node["node_id"]]["layers"]
        beat = {
            "address": f"127.0.0.1:{port - 100}",
            "capacity_bytes": 8 << 30,
            "hardware": HARDWARE,
            "pieces_address": f"127.0.0.1:{port}",
            "pieces_layers": layers,
            "activity": "serving",
        }
        r = http.post(
            f"/api/v1/nodes/{node['node_id']}/heartbeat", headers=_node_headers(node), json=beat
        )
        assert r.status_code == 200, r.text
    holder = a if got[a["node_id"]]["layers"][0] <= 3 < got[a["node_id"]]["layers"][1] else b
    r = http.get("/api/v1/models/tiny/pieces/blk.003.gguf/sources", headers=_node_headers(c))
    assert r.status_code == 200, r.text
    sources = r.json()["sources"]
    assert [s["kind"] for s in sources] == ["peer", "coordinator"]
    assert sources[0]["node_id"] == holder["node_id"]
    # The holder itself is not its own source; other files and models are not pieces.
    own = http.get("/api/v1/models/tiny/pieces/blk.003.gguf/sources", headers=_node_headers(holder))
    assert [s["kind"] for s in own.json()["sources"]] == ["coordinator"]
    assert (
        http.get("/api/v1/models/tiny/pieces/x.part/sources", headers=_node_headers(c)).status_code
        == 404
    )
    assert http.get("/api/v1/models/tiny/pieces/blk.003.gguf/sources").status_code == 401
    # A piece server's address is held to what `address` is: never the metadata service.
    r = http.post(
        f"/api/v1/nodes/{c['node_id']}/heartbeat",
        headers=_node_headers(c),
        json={"address": "127.0.0.1:7003", "pieces_address": "169.254.169.254:8080"},
    )
    assert r.status_code == 400
    # What the coordinator's piece endpoint answered with is counted for the operator.
    before = http.get("/api/v1/swarm", headers=_admin()).json()["piece_bytes_served"]
    http.get(
        "/api/v1/models/tiny/pieces/blk.003.gguf",
        headers={**_node_headers(c), "Range": "bytes=0-9"},
    )
    after = http.get("/api/v1/swarm", headers=_admin()).json()
    assert after["piece_bytes_served"] == before + 10
    assert set(after["pieces_served_at"]) == {a["node_id"], b["node_id"]}


def test_a_bad_source_of_pieces_reaches_the_timeline_bounded_per_node(
    http: TestClient, coord: Coordinator
) -> None:
    """A node that gave up on a source (wrong bytes from a peer, a stalling mirror) says
    so; the operator's timeline shows it with the reporter, and one node cannot flood it."""
    code = _invite(http, uses=2)
    a, b = _join(http, code), _join(http, code)
    url = f"/api/v1/nodes/{a['node_id']}/incidents"
    body = {"source": b["node_id"], "reason": "wrong bytes for blk.3.gguf (sha256)"}
    r = http.post(url, headers=_node_headers(a), json=body)
    assert r.status_code == 200, r.text
    events = http.get("/api/v1/events", headers=_admin()).json()
    bad = [e for e in events if e["kind"] == "bad_source"]
    assert [(e["node_id"], e["detail"]) for e in bad] == [
        (a["node_id"], f"{b['node_id']}: wrong bytes for blk.3.gguf (sha256)")
    ]
    assert bad[0]["label"] == "bad source of pieces" and bad[0]["tone"] == "warn"
    # Not for another node; nothing unbounded.
    r = http.post(url, headers=_node_headers(b), json=body)
    assert r.status_code == 403
    r = http.post(url, headers=_node_headers(a), json={**body, "reason": "x" * 301})
    assert 400 <= r.status_code < 500 and r.status_code != 429
    # Five at once, then one a minute: the rest is refused before it is recorded.
    codes = [http.post(url, headers=_node_headers(a), json=body).status_code for _ in range(8)]
    assert codes.count(200) == 4 and codes[4:] == [429] * 4, codes
    recorded = [
        e for e in http.get("/api/v1/events", headers=_admin()).json() if e["kind"] == "bad_source"
    ]
    assert len(recorded) == 5
