"""The coordinator's HTTP API under schemathesis: every operation in /openapi.json, fed
generated valid and invalid input, answers without a server error and as documented.
Plus the bad requests a fuzzer does not send: oversized, malformed, mislabelled.

Everything runs in process against the ASGI app (no sockets), on SQLite and, where its
server binaries are installed, PostgreSQL (which refuses more: NUL in text, NaN in JSON).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import hypothesis
import pytest
import schemathesis
from cryptography.hazmat.primitives import serialization
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from coordinator import invites as inv
from coordinator.releases import NODE_HEADERS
from coordinator.server.api import ADMIN_TOKEN, create_app
from coordinator.server.api_models import MAX_BODY_BYTES
from coordinator.server.secret_hashes import hash_token
from coordinator.server.service import Coordinator, CoordinatorSettings, HostedModel
from coordinator.server.store import Store, migrate
from core.gguf_slices import slice_model
from net import auth
from tests.support.postgres import postgres_bin, temporary_postgres
from tests.support.probe_answerer import HARDWARE

pytestmark = pytest.mark.integration

ADMIN = "admin-token-for-fuzzing"
SEED = 20240917
MAX_EXAMPLES = 40
CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
]
Node = tuple[str, str]
"""(node id, node token)"""


@dataclass(frozen=True)
class Swarm:
    app: FastAPI
    coord: Coordinator
    worker: Node
    """Reports a usable address and capacity once, at the start: the plan's one stage."""
    fuzzed: Node
    """The worker the generated node calls speak for (its heartbeats are garbage)."""
    client: Node


def _csr() -> str:
    key = auth.new_private_key()
    return auth.make_csr(key, "me").public_bytes(serialization.Encoding.PEM).decode()


def _joined(coord: Coordinator, role: str) -> Node:
    _, code = coord.create_invite(role, 1, dt.timedelta(days=1))
    r = coord.join(inv.InviteCode.decode(code).secret, _csr())
    return r.node_id, r.token


def _node_headers(node: Node) -> dict[str, str]:
    return {"X-Sangama-Node": node[0], "Authorization": f"Bearer {node[1]}"}


def _admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def pieces(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    out = tmp_path_factory.mktemp("fuzz-pieces")
    return out, slice_model(tiny_llama, out)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('fuzz-db') / 'c.db'}"
        return
    if postgres_bin() is None:  # .ci/run installs it; only a bare dev machine lacks it
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    with temporary_postgres() as url:
        yield url


@pytest.fixture(scope="module")
def swarm(db_url: str, pieces: tuple[Path, Any]) -> Iterator[Swarm]:
    migrate(db_url)
    store = Store(db_url)
    directory, manifest = pieces
    coord = Coordinator(
        store,
        auth.create_ca("fuzz-swarm"),
        "https://127.0.0.1:8443",
        HostedModel("tiny", directory, manifest),
        CoordinatorSettings(min_stages=1, stale_after_s=600, dead_after_s=900),
        reachable=lambda _address: True,  # no worker answers the probe here
    )
    coord.set_admin_password("operator-pw")
    store.set_setting(ADMIN_TOKEN, hash_token(ADMIN))
    worker, fuzzed, client = (_joined(coord, r) for r in ("worker", "worker", "client"))
    app = create_app(coord)
    with TestClient(app, headers=NODE_HEADERS) as http:
        r = http.post(
            f"/api/v1/nodes/{worker[0]}/heartbeat",
            headers=_node_headers(worker),
            json={"address": "127.0.0.1:7001", "capacity_bytes": 8 << 30, "hardware": HARDWARE},
        )
        assert r.status_code == 200 and r.json()["assignment"] is not None, r.text
    yield Swarm(app, coord, worker, fuzzed, client)
    store.close()


@pytest.fixture
def http(swarm: Swarm) -> TestClient:
    return TestClient(swarm.app, base_url="https://testserver", headers=NODE_HEADERS)


# ---------------------------------------------------------------- generated calls

# The OpenAPI description does not depend on the coordinator's state, so it is read at
# import, from an app whose coordinator is never called; the generated calls go to the
# fixture's real app (`app=` below). schemathesis.pytest.from_fixture would be the natural
# lazy loader, but it sets `Node._nodeid`, which pytest 9.2 no longer has.
schema = schemathesis.openapi.from_asgi(
    "/openapi.json",
    create_app(cast(Coordinator, None)),
    config=schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "generation": {
                "mode": "all",  # valid and invalid input
                "max-examples": MAX_EXAMPLES,
                "database": "none",
                "deterministic": True,
            },
            "phases": {
                "examples": {"enabled": True},
                "coverage": {"enabled": True},  # boundaries, missing parts, wrong methods
                "fuzzing": {"enabled": True},
            },
        }
    ),
)


@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_no_operation_answers_with_a_server_error(case: Any, swarm: Swarm) -> None:
    tags = set(case.operation.tags or ())
    headers: dict[str, str] = {}
    if "operator" in tags:
        headers = _admin_headers()
    elif "nodes" in tags:
        # Real names in the path (the node's own id, a peer that exists, the hosted model):
        # the generated parts that remain (bodies, a piece's file name, ...) reach the service.
        params = case.path_parameters or {}
        if "node_id" in params:
            params["node_id"] = swarm.fuzzed[0]
            headers = _node_headers(swarm.fuzzed)
        else:
            headers = _node_headers(swarm.client)
        if "peer_id" in params:
            params["peer_id"] = swarm.client[0]  # the client's GET /signal reads these back
        if "name" in params:
            params["name"] = swarm.coord.model.name
        query = case.query or {}
        if 0 < _seconds(query.get("wait")) <= 25:
            query["wait"] = "0"  # a long poll only waits: seconds of nothing, no new input
    case.call_and_validate(headers=headers, checks=CHECKS, app=swarm.app)


def _seconds(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return -1.0


# ---------------------------------------------------------------- hand-made bad requests

JSON = {"content-type": "application/json"}


def _detail(r: Any, status: int) -> Any:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    detail = r.json()["detail"]
    assert detail, r.text
    return detail


def test_an_oversized_body_is_refused_before_it_is_read(http: TestClient) -> None:
    big = b'{"secret": "' + b"x" * (2 << 20) + b'", "csr_pem": "y"}'
    assert "larger than" in _detail(http.post("/api/v1/join", content=big, headers=JSON), 413)


def test_a_streamed_oversized_body_is_refused_too(http: TestClient) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for _ in range(3):
            yield b" " * MAX_BODY_BYTES

    r = http.post("/api/v1/join", content=chunks(), headers=JSON)
    assert "larger than" in _detail(r, 413)


def test_a_lying_content_length_is_refused(http: TestClient) -> None:
    for length in (str(1 << 40), "12x", "-1"):
        r = http.post("/api/v1/join", content=b"{}", headers={**JSON, "content-length": length})
        assert "larger than" in _detail(r, 413)


def test_malformed_json_gets_422_with_a_message(http: TestClient) -> None:
    for body in (b"{not json", b"", b'{"secret": "a", "csr_pem": "b"', b"[1, 2]", b"null"):
        detail = _detail(http.post("/api/v1/join", content=body, headers=JSON), 422)
        assert detail[0]["msg"], detail


def test_undecodable_or_absurd_json_gets_400_with_a_message(http: TestClient) -> None:
    for body in (
        b'{"secret": "\xff\xfe"}',  # not UTF-8
        b'{"secret": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nested too deep to parse
        b'{"secret": ' + b"9" * 5000 + b"}",  # an integer too long to parse
    ):
        _detail(http.post("/api/v1/join", content=body, headers=JSON), 400)


def test_a_wrong_content_type_gets_422_with_a_message(http: TestClient) -> None:
    body = b'{"secret": "x", "csr_pem": "y"}'
    for headers in ({"content-type": "text/plain"}, {}, {"content-type": "application/xml"}):
        assert _detail(http.post("/api/v1/join", content=body, headers=headers), 422)
    r = http.post("/api/v1/join", data={"secret": "x", "csr_pem": "y"})  # a form
    assert _detail(r, 422)


def test_an_unknown_route_or_method_gets_json(http: TestClient) -> None:
    assert _detail(http.get("/api/v1/no-such-thing"), 404) == "Not Found"
    assert _detail(http.post("/no/such/thing", json={}), 404) == "Not Found"
    assert _detail(http.put("/api/v1/join", json={}), 405) == "Method Not Allowed"


def test_values_no_database_can_store_get_422(http: TestClient, swarm: Swarm) -> None:
    node = swarm.fuzzed
    beat = f"/api/v1/nodes/{node[0]}/heartbeat"
    for body in (
        b'{"hardware": {"gpu": NaN}}',
        b'{"rtt_ms": {"peer": Infinity}}',
        b'{"stats": {"x": [1, {"y": -Infinity}]}}',
    ):
        r = http.post(beat, content=body, headers={**JSON, **_node_headers(node)})
        assert "finite" in str(_detail(r, 422))
    for body_json in ({"address": "a\x00b"}, {"hardware": {"k\x00": 1}}, {"rtt_ms": {"p\x00": 1}}):
        r = http.post(beat, json=body_json, headers=_node_headers(node))
        assert "NUL" in str(_detail(r, 422))
    r = http.post(
        "/api/v1/invites", json={"role": "worker", "note": "\x00"}, headers=_admin_headers()
    )
    assert "NUL" in str(_detail(r, 422))
    for bad_id in ("a%00b", "UPPER", "-dash-first", "x" * 64):
        assert _detail(http.post(f"/api/v1/nodes/{bad_id}/revoke", headers=_admin_headers()), 422)
    for bad_invite in (0, 2**31, 2**63, -(2**63) - 1):
        r = http.delete(f"/api/v1/invites/{bad_invite}", headers=_admin_headers())
        assert _detail(r, 422)
    # And the operator's view still renders: nothing unrenderable got stored.
    assert http.get("/api/v1/swarm", headers=_admin_headers()).status_code == 200


def test_credentials_are_checked_before_anything_else(http: TestClient, swarm: Swarm) -> None:
    other = swarm.client
    r = http.post(
        f"/api/v1/nodes/{swarm.fuzzed[0]}/heartbeat", json={}, headers=_node_headers(other)
    )
    assert "itself" in _detail(r, 403)
    assert _detail(http.get("/api/v1/revoked", headers={"X-Sangama-Node": other[0]}), 401)
    r = http.get("/api/v1/revoked", headers={**_node_headers(other), "Authorization": "Bearer x"})
    assert _detail(r, 401)
    assert _detail(http.get("/api/v1/swarm", headers={"Authorization": "Bearer nope"}), 401)
