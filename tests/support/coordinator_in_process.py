"""A coordinator in this process, for tests that drive its HTTP API through FastAPI's
TestClient: a migrated store, a fresh CA, the tiny model's pieces and the admin token
`ADMIN`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from coordinator.releases import NODE_HEADERS
from coordinator.server.api import ADMIN_TOKEN, create_app
from coordinator.server.secret_hashes import hash_token
from coordinator.server.service import Coordinator, CoordinatorSettings, HostedModel
from coordinator.server.store import Store, migrate
from net import auth

ADMIN = "admin-token-for-tests"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}


@contextmanager
def coordinator_in_process(
    db_url: str,
    pieces: Path,
    manifest: Any,
    settings: CoordinatorSettings,
    reachable: Callable[[str], bool] | None = None,
) -> Iterator[Coordinator]:
    """`reachable`: the coordinator's probe of a node's address (None: its own dial)."""
    migrate(db_url)
    store = Store(db_url)
    hosted = HostedModel("tiny", pieces, manifest)
    ca, url = auth.create_ca("test-swarm"), "https://127.0.0.1:8443"
    coord = Coordinator(store, ca, url, hosted, settings, reachable=reachable)
    store.set_setting(ADMIN_TOKEN, hash_token(ADMIN))
    try:
        yield coord
    finally:
        store.close()


def api_client(coord: Coordinator) -> TestClient:
    """The coordinator's API as a node's release calls it."""
    return TestClient(create_app(coord), base_url="https://testserver", headers=NODE_HEADERS)
