"""A coordinator hosting two models, over its real HTTP API and SQLite: the workers split
between the two chains, each model's route, manifest and pieces, GET /api/v1/models,
the swarm view naming each stage's model, and a restart keeping both plans (and reading
the plan a one-model coordinator kept before plans were kept per model)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete

from coordinator.releases import NODE_HEADERS
from coordinator.server.api import ADMIN_TOKEN, create_app
from coordinator.server.models import HostedModel, plan_setting
from coordinator.server.plan_store import PLAN_SETTING
from coordinator.server.secret_hashes import hash_token
from coordinator.server.service import Coordinator, CoordinatorSettings
from coordinator.server.store import Setting, Store, migrate
from core.gguf_slices import slice_model
from net import auth
from tests.support.node_calls import beat, join_as, node_headers
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

ADMIN = "admin-token-for-models"
SETTINGS = CoordinatorSettings(min_stages=2)


@pytest.fixture(scope="module")
def hosted(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> list[HostedModel]:
    root = tmp_path_factory.mktemp("pieces")
    small = write_tiny_model(root / "small.gguf", n_layer=4, seed=5)
    models = []
    for name, path in (("tiny", tiny_llama), ("small", small)):
        out = root / name
        models.append(HostedModel(name, out, slice_model(path, out)))
    return models


def _coordinator(url: str, ca: auth.CertifiedKey, hosted: list[HostedModel]) -> Coordinator:
    c = Coordinator(
        Store(url),
        ca,
        "https://127.0.0.1:8443",
        hosted[0],
        SETTINGS,
        reachable=lambda _address: True,
        more_models=hosted[1:],
    )
    c.store.set_setting(ADMIN_TOKEN, hash_token(ADMIN))
    return c


@pytest.fixture
def db(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    migrate(url)
    yield url


def _free_ports(n: int) -> list[int]:
    ports = []
    for _ in range(n):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
    return ports


def test_two_models_share_one_fleet_and_keep_their_plans_across_a_restart(
    db: str, hosted: list[HostedModel]
) -> None:
    ca = auth.create_ca("models-test")
    coord = _coordinator(db, ca, hosted)
    with TestClient(create_app(coord), base_url="https://testserver", headers=NODE_HEADERS) as http:
        workers = [join_as(http, ADMIN, "worker") for _ in range(5)]
        client = join_as(http, ADMIN, "client")
        ports = _free_ports(5)
        for w, port in zip(workers, ports, strict=True):
            beat(http, w, port)
        found = {w["node_id"]: beat(http, w, p) for w, p in zip(workers, ports, strict=True)}
        by_model: dict[str, list[str]] = {}
        for node_id, a in found.items():
            if a is not None:
                by_model.setdefault(a["model"], []).append(node_id)
                assert a["manifest_url"] == f"/api/v1/models/{a['model']}/manifest"
                assert a["pieces_url"] == f"/api/v1/models/{a['model']}/pieces"
        assert sorted(by_model) == ["small", "tiny"] and all(len(v) == 2 for v in by_model.values())

        listed = http.get("/api/v1/models", headers=node_headers(client)).json()["models"]
        assert [(m["name"], m["default"], m["stages"]) for m in listed] == [
            ("tiny", True, 2),
            ("small", False, 2),
        ]
        assert [m["n_layer"] for m in listed] == [8, 4]
        assert http.get("/api/v1/models").status_code == 401  # for joined nodes only

        def route(model: str) -> Any:
            return http.get("/api/v1/route", headers=node_headers(client), params={"model": model})

        assert route("default").json() == route("tiny").json()
        small = route("small").json()
        assert small["model"] == "small" and small["stages"][-1]["layers"][1] == 4
        assert {s["node_id"] for s in small["stages"]} == set(by_model["small"])
        missing = route("huge")
        assert missing.status_code == 404
        assert missing.json()["detail"] == "this swarm serves 'tiny', 'small', not 'huge'"

        manifest = http.get("/api/v1/models/small/manifest", headers=node_headers(client)).json()
        assert manifest["facts"]["n_layer"] == 4
        piece = hosted[1].manifest.pieces[0].file
        got = http.get(f"/api/v1/models/small/pieces/{piece}", headers=node_headers(client))
        assert got.content == (hosted[1].directory / piece).read_bytes()
        assert (
            http.get("/api/v1/models/huge/manifest", headers=node_headers(client)).status_code
            == 404
        )

        swarm = http.get("/api/v1/swarm", headers={"Authorization": f"Bearer {ADMIN}"}).json()
        assert swarm["model"] == "tiny" and len(swarm["plan"]) == 2
        assert [m["name"] for m in swarm["models"]] == ["tiny", "small"]
        serves = {n["node_id"]: n["model"] for n in swarm["nodes"]}
        assert all(serves[n] == m for m, ids in by_model.items() for n in ids)
        events = http.get("/api/v1/events", headers={"Authorization": f"Bearer {ADMIN}"})
        replans = [e["detail"] for e in events.json() if e["kind"] == "replanned"]
        assert any(d.startswith("2 stages: ") for d in replans), replans  # the default's
        assert any(d.startswith("small: 2 stages: ") for d in replans), replans
        spare = next(w["node_id"] for w in workers if found[w["node_id"]] is None)
        assert serves[spare] == "" and swarm["spares"] == [spare]  # the first model's
    coord.store.close()

    # Restarted on the same database: both models keep their chains.
    store = Store(db)
    assert store.get_setting(plan_setting("tiny")) and store.get_setting(plan_setting("small"))
    store.close()
    again = _coordinator(db, ca, hosted)
    with TestClient(create_app(again), base_url="https://testserver", headers=NODE_HEADERS) as http:
        for w, p in zip(workers, ports, strict=True):
            assert beat(http, w, p) == found[w["node_id"]]
    # A database from a one-model coordinator kept the plan under the old key: the first
    # model starts from it.
    kept = again.store.get_setting(plan_setting("tiny"))
    again.store.set_setting(PLAN_SETTING, kept or "")
    with again.store.session() as s:
        s.execute(delete(Setting).where(Setting.key == plan_setting("tiny")))
    again.store.close()
    third = _coordinator(db, ca, hosted)
    first = third.hosted("default").kept
    assert first is not None and set(first.node_ids) == set(by_model["tiny"])
    third.store.close()
