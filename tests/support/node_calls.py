"""A node's calls to an in-process coordinator API (a TestClient): join with a fresh
invite, its headers, a heartbeat from a loopback address."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient

from coordinator import invites as inv
from net import auth
from tests.support.probe_answerer import HARDWARE


def join_as(http: TestClient, admin_token: str, role: str) -> dict[str, str]:
    """A new node of `role`, joined with a single-use invite the operator makes."""
    r = http.post(
        "/api/v1/invites",
        json={"role": role, "uses": 1, "expires": "1d"},
        headers={"Authorization": f"Bearer {admin_token}"},
    )
    secret = inv.InviteCode.decode(str(r.json()["code"])).secret
    key = auth.new_private_key()
    csr = auth.make_csr(key, "me").public_bytes(serialization.Encoding.PEM).decode()
    joined = http.post("/api/v1/join", json={"secret": secret, "csr_pem": csr})
    assert joined.status_code == 200, joined.text
    return dict(joined.json())


def node_headers(node: dict[str, str]) -> dict[str, str]:
    return {"X-Sangama-Node": node["node_id"], "Authorization": f"Bearer {node['token']}"}


def beat(http: TestClient, node: dict[str, str], port: int) -> Any:
    """A heartbeat from 127.0.0.1:`port` offering 8 GiB; the assignment it answers."""
    r = http.post(
        f"/api/v1/nodes/{node['node_id']}/heartbeat",
        headers=node_headers(node),
        json={"address": f"127.0.0.1:{port}", "capacity_bytes": 8 << 30, "hardware": HARDWARE},
    )
    assert r.status_code == 200, r.text
    return r.json()["assignment"]
