"""Relay credentials from the coordinator's HTTP API are bound to the node: one username
per node and window (so coturn's per-user quota is per node), a short life, and none for
a revoked node."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient

from coordinator import invites as inv
from coordinator.contract import TurnAnswer
from coordinator.server.service import CoordinatorSettings
from core.gguf_slices import slice_model
from net import auth
from net.ice.turn import DEFAULT_NODE_TTL_S, credentials_valid
from tests.support.coordinator_in_process import ADMIN_HEADERS, api_client, coordinator_in_process

pytestmark = pytest.mark.integration

SECRET = "relay-secret"


@pytest.fixture
def http(tiny_llama: Path, tmp_path: Path) -> Iterator[TestClient]:
    manifest = slice_model(tiny_llama, tmp_path / "pieces")
    settings = dataclasses.replace(
        CoordinatorSettings(), turn_server=("203.0.113.5", 3478), turn_secret=SECRET
    )
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with coordinator_in_process(url, tmp_path / "pieces", manifest, settings) as coord:
        yield api_client(coord)


def _join(http: TestClient) -> dict[str, str]:
    admin = ADMIN_HEADERS
    r = http.post(
        "/api/v1/invites", json={"role": "worker", "uses": 1, "expires": "1d"}, headers=admin
    )
    secret = inv.InviteCode.decode(str(r.json()["code"])).secret
    key = auth.new_private_key()
    csr = auth.make_csr(key, "me").public_bytes(serialization.Encoding.PEM).decode()
    r = http.post("/api/v1/join", json={"secret": secret, "csr_pem": csr})
    assert r.status_code == 200, r.text
    joined = dict(r.json())
    return {"X-Sangama-Node": joined["node_id"], "Authorization": f"Bearer {joined['token']}"}


def test_a_node_keeps_one_short_lived_username_and_loses_it_when_revoked(
    http: TestClient,
) -> None:
    a, b = _join(http), _join(http)
    first = TurnAnswer.from_json(http.get("/api/v1/turn", headers=a).json())
    again = TurnAnswer.from_json(http.get("/api/v1/turn", headers=a).json())
    other = TurnAnswer.from_json(http.get("/api/v1/turn", headers=b).json())
    # Asking again is the same coturn user (its quota holds); another node is another.
    assert again.username == first.username != other.username
    assert first.username.endswith(":" + a["X-Sangama-Node"])
    assert DEFAULT_NODE_TTL_S <= first.ttl_s <= 2 * DEFAULT_NODE_TTL_S  # not 6 hours
    expiry = int(first.username.split(":")[0])
    assert credentials_valid(SECRET, first.username, first.password, expiry - 1)

    admin = ADMIN_HEADERS
    node = a["X-Sangama-Node"]
    assert http.post(f"/api/v1/nodes/{node}/revoke", headers=admin).status_code == 200
    refused = http.get("/api/v1/turn", headers=a)
    assert refused.status_code in (401, 403) and "username" not in refused.text
    assert http.get("/api/v1/turn", headers=b).status_code == 200
