"""The coordinator under churn, over its real HTTP API and SQLite: a client's report of a
dead stage gets a route around it as soon as that stage is silent past stale_after_s, or
at once when its address refuses the coordinator's own probe (nothing listens: the
process is gone); a stage that still listens and heartbeats cannot be pushed out, and a
restarted coordinator keeps every assignment where it was (no re-plan storm). The
workers' addresses are real bound UDP sockets on loopback."""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient

from coordinator.releases import NODE_HEADERS
from coordinator.server.api import ADMIN_TOKEN, create_app
from coordinator.server.secret_hashes import hash_token
from coordinator.server.service import Coordinator, CoordinatorSettings, HostedModel
from coordinator.server.store import Node, Store, migrate
from core.gguf_slices import slice_model
from net import auth
from tests.support.node_calls import beat, join_as, node_headers

pytestmark = pytest.mark.integration

ADMIN = "admin-token-for-churn"
SETTINGS = CoordinatorSettings(min_stages=3, spares=1, stale_after_s=30, dead_after_s=60)


@pytest.fixture(scope="module")
def pieces(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("pieces")
    return out, slice_model(tiny_llama, out)


def _coordinator(url: str, ca: auth.CertifiedKey, pieces: tuple[Path, object]) -> Coordinator:
    directory, manifest = pieces
    c = Coordinator(
        Store(url),
        ca,
        "https://127.0.0.1:8443",
        HostedModel("tiny", directory, manifest),  # type: ignore[arg-type]
        SETTINGS,
        reachable=lambda _address: True,  # no worker answers the probe here
    )
    c.store.set_setting(ADMIN_TOKEN, hash_token(ADMIN))
    return c


@pytest.fixture
def db(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    migrate(url)
    yield url


@pytest.fixture
def ports() -> Iterator[list[socket.socket]]:
    """Four UDP sockets bound on loopback: where the workers 'listen' (a bound socket
    sends no ICMP refusal, as a live QUIC server does not)."""
    socks = []
    for _ in range(4):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    yield socks
    for s in socks:
        s.close()


def _port(s: socket.socket) -> int:
    return int(s.getsockname()[1])


def _chain(
    http: TestClient, client: dict[str, str], avoid: list[str] | None = None
) -> tuple[int, Any]:
    r = http.get("/api/v1/route", headers=node_headers(client), params={"avoid": avoid or []})
    return r.status_code, (
        [s["node_id"] for s in r.json()["stages"]] if r.status_code == 200 else r.json()
    )


def _silence(url: str, node_id: str, seconds: float) -> None:
    store = Store(url)
    with store.session() as s:
        row = s.get(Node, node_id)
        assert row is not None
        row.last_seen = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    store.close()


def test_a_reported_dead_stage_is_routed_around_and_a_restart_moves_nobody(
    db: str, pieces: tuple[Path, object], ports: list[socket.socket]
) -> None:
    ca = auth.create_ca("churn-swarm")
    coord = _coordinator(db, ca, pieces)
    http = TestClient(create_app(coord), base_url="https://testserver", headers=NODE_HEADERS)
    workers = [join_as(http, ADMIN, "worker") for _ in range(3)]
    for i, w in enumerate(workers):
        beat(http, w, _port(ports[i]))
    spare = join_as(http, ADMIN, "worker")
    assert beat(http, spare, _port(ports[3])) is None  # the chain exists: the spare
    client = join_as(http, ADMIN, "client")
    status, chain = _chain(http, client)
    assert status == 200 and isinstance(chain, list) and len(chain) == 3
    middle = chain[1]

    # A client reports the middle stage dead while it still heartbeats: refused, kept.
    status, answer = _chain(http, client, [middle])
    assert status == 404 and "avoiding" in str(answer)
    assert _chain(http, client)[1] == chain

    # Silent past stale_after_s (but not yet dead_after_s) and reported: out at once, the
    # spare takes exactly its place; the other stages keep theirs.
    _silence(db, middle, SETTINGS.stale_after_s + 1)
    coord.started_at -= dt.timedelta(minutes=5)  # it has been up long enough to tell
    status, rerouted = _chain(http, client, [middle])
    assert status == 200 and isinstance(rerouted, list)
    assert rerouted == [chain[0], spare["node_id"], chain[2]]
    before = {
        w["node_id"]: beat(http, w, _port(ports[i]))
        for i, w in enumerate(workers)
        if w["node_id"] != middle
    }
    coord.store.close()

    # The coordinator restarts (same database): every assignment stays where it was.
    again = _coordinator(db, ca, pieces)
    http2 = TestClient(create_app(again), base_url="https://testserver", headers=NODE_HEADERS)
    after = {
        w["node_id"]: beat(http2, w, _port(ports[i]))
        for i, w in enumerate(workers)
        if w["node_id"] != middle
    }
    assert after == before
    assert _chain(http2, client)[1] == rerouted
    again.store.close()


def test_a_reported_stage_whose_port_refuses_leaves_at_once(
    db: str, pieces: tuple[Path, object], ports: list[socket.socket]
) -> None:
    coord = _coordinator(db, auth.create_ca("gone-swarm"), pieces)
    coord.started_at -= dt.timedelta(minutes=5)
    http = TestClient(create_app(coord), base_url="https://testserver", headers=NODE_HEADERS)
    workers = [join_as(http, ADMIN, "worker") for _ in range(3)]
    for i, w in enumerate(workers):
        beat(http, w, _port(ports[i]))
    spare = join_as(http, ADMIN, "worker")
    beat(http, spare, _port(ports[3]))
    client = join_as(http, ADMIN, "client")
    chain = _chain(http, client)[1]
    assert isinstance(chain, list) and len(chain) == 3
    at = {w["node_id"]: i for i, w in enumerate(workers)}
    # A healthy stage reported dead: it still listens and heartbeats, so it stays.
    first = chain[0]
    status, answer = _chain(http, client, [first])
    assert status == 404 and "avoiding" in str(answer)
    # The middle one's process is gone (its port closed) a moment after its last
    # heartbeat: far from stale, yet the coordinator's probe is refused and the spare
    # takes exactly its place at once.
    middle = chain[1]
    ports[at[middle]].close()
    status, rerouted = _chain(http, client, [middle])
    assert status == 200 and rerouted == [chain[0], spare["node_id"], chain[2]]
    # Back (a reboot: it heartbeats again), it is no longer held out.
    again = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ports[at[middle]] = again
    again.bind(("127.0.0.1", 0))
    beat(http, next(w for w in workers if w["node_id"] == middle), _port(again))
    assert middle not in coord._gone
    coord.store.close()


def test_hostile_callers_are_limited_and_metrics_are_private(
    db: str, pieces: tuple[Path, object]
) -> None:
    coord = _coordinator(db, auth.create_ca("hostile-swarm"), pieces)
    coord.set_admin_password("right-pw")
    http = TestClient(create_app(coord), base_url="https://testserver", headers=NODE_HEADERS)
    # /metrics: refused to an anonymous remote caller, served with the operator's token.
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
    # Operator login: 5 wrong passwords, then even the right one waits (429, Retry-After).
    for _ in range(5):
        assert http.post("/api/v1/login", json={"password": "guess"}).status_code == 401
    limited = http.post("/api/v1/login", json={"password": "right-pw"})
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) > 0
    # Invite guessing: 10 made-up secrets, then refused before any lookup.
    key = auth.new_private_key()
    csr = auth.make_csr(key, "me").public_bytes(serialization.Encoding.PEM).decode()
    codes = [
        http.post("/api/v1/join", json={"secret": f"guess-{i}", "csr_pem": csr}).status_code
        for i in range(11)
    ]
    assert codes == [403] * 10 + [429]
    coord.store.close()
