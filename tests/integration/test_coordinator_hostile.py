"""A real `sangama coordinator` process, probed as an attacker would: over HTTPS, with
joined nodes and invite codes of its own, concurrently where a race is the point."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives import serialization

from coordinator import invites as inv
from coordinator.releases import NODE_HEADERS
from net import auth
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.probe_answerer import HARDWARE, ProbeAnswerer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def coord(
    tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess.start(
        tmp_path_factory.mktemp("hostile"), tiny_llama, min_stages=2
    ) as c:
        yield c


def _call(coord: CoordinatorProcess, method: str, path: str, **kw: Any) -> requests.Response:
    kw.setdefault("timeout", 30)
    # Every node names its release (coordinator.releases); an attacker's calls do too.
    kw["headers"] = {**NODE_HEADERS, **(kw.get("headers") or {})}
    return requests.request(method, f"{coord.url}{path}", verify=str(coord.ca_path), **kw)


def _csr() -> str:
    key = auth.new_private_key()
    return auth.make_csr(key, "me").public_bytes(serialization.Encoding.PEM).decode()


def _secret(coord: CoordinatorProcess, role: str = "worker", uses: int = 1) -> str:
    return inv.InviteCode.decode(str(coord.admin.create_invite(role, uses)["code"])).secret


def _join(coord: CoordinatorProcess, role: str = "worker") -> dict[str, str]:
    r = _call(
        coord, "POST", "/api/v1/join", json={"secret": _secret(coord, role), "csr_pem": _csr()}
    )
    assert r.status_code == 200, r.text
    joined = r.json()
    return {"X-Sangama-Node": joined["node_id"], "Authorization": f"Bearer {joined['token']}"}


def _beat(coord: CoordinatorProcess, node: dict[str, str], **body: Any) -> requests.Response:
    return _call(
        coord, "POST", f"/api/v1/nodes/{node['X-Sangama-Node']}/heartbeat", headers=node, json=body
    )


def _at_once(n: int, call: Callable[[int], requests.Response]) -> list[int]:
    with ThreadPoolExecutor(n) as pool:
        return [r.status_code for r in pool.map(call, range(n))]


def test_concurrent_wrong_passwords_get_no_more_tries_than_the_limit(
    coord: CoordinatorProcess,
) -> None:
    # Each names another address in X-Forwarded-For: no proxy is configured, so no
    # header is believed and all count against the one real caller.
    def login(i: int) -> requests.Response:
        headers = {"X-Forwarded-For": f"198.51.100.{i}"}
        return _call(
            coord, "POST", "/api/v1/login", json={"password": f"wrong{i}"}, headers=headers
        )

    codes = _at_once(35, login)
    assert codes.count(401) <= 5 and codes.count(429) >= 30, codes


def test_metrics_passed_on_by_a_proxy_on_this_machine_are_not_public(
    coord: CoordinatorProcess,
) -> None:
    assert _call(coord, "GET", "/metrics").status_code == 200  # a scraper on this machine
    proxied = _call(coord, "GET", "/metrics", headers={"X-Forwarded-For": "203.0.113.9"})
    assert proxied.status_code == 401


def test_heartbeats_are_checked_in_address_depth_and_rate(coord: CoordinatorProcess) -> None:
    node = _join(coord)
    for address in ("169.254.169.254:8080", "0.0.0.0:7000", "224.0.0.1:7000", "127.0.0.1:22"):
        r = _beat(coord, node, address=address, capacity_bytes=1 << 30, hardware=HARDWARE)
        assert r.status_code == 400, (address, r.text)
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(900):
        inner["x"] = {}
        inner = inner["x"]
    assert _beat(coord, node, hardware=deep).status_code in (400, 422)  # refused, not stored
    assert _beat(coord, node, stats={f"k{i}": i for i in range(5000)}).status_code == 422
    assert "nodes" in coord.admin.swarm()  # the operator's view still renders
    flood = _at_once(40, lambda _i: _beat(coord, node))
    assert flood.count(429) >= 20, flood


def test_only_addresses_that_answer_the_probe_are_placed(coord: CoordinatorProcess) -> None:
    silent = _join(coord)
    with ProbeAnswerer() as nobody:
        address = nobody.address  # a free port once it closes: nothing answers there
    r = _beat(coord, silent, address=address, capacity_bytes=1 << 30, hardware=HARDWARE)
    assert r.status_code == 200 and r.json()["assignment"] is None
    with ProbeAnswerer() as a, ProbeAnswerer() as b:
        workers = [_join(coord), _join(coord)]
        for w, answerer in zip(workers, (a, b), strict=True):
            body = {"address": answerer.address, "capacity_bytes": 1 << 30, "hardware": HARDWARE}
            assert _beat(coord, w, **body).status_code == 200
        plan = {s["node_id"] for s in coord.admin.swarm()["plan"]}
        assert plan == {w["X-Sangama-Node"] for w in workers}
        assert a.answered >= 1 and b.answered >= 1


def test_signals_go_only_along_planned_links_and_only_as_ice_offers(
    coord: CoordinatorProcess,
) -> None:
    client, idle = _join(coord, "client"), _join(coord)
    offer = {
        "kind": "offer",
        "link": "0123456789abcdef.1",
        "payload": {"ufrag": "abcd", "pwd": "p" * 22, "candidates": []},
    }
    url = f"/api/v1/signal/{idle['X-Sangama-Node']}"
    assert _call(coord, "POST", url, json=offer, headers=client).status_code == 403
    junk = {**offer, "payload": {"blob": "x" * 100_000}}
    assert _call(coord, "POST", url, json=junk, headers=client).status_code == 422
    answer = {**offer, "kind": "answer"}
    assert _call(coord, "POST", url, json=answer, headers=client).status_code == 403


# Last in this module: its 23 refused joins use up this caller's join attempts for a
# minute, and the tests above join with invites of their own.
def test_a_single_use_invite_makes_one_identity_under_24_concurrent_joins(
    coord: CoordinatorProcess,
) -> None:
    secret = _secret(coord)
    body = {"secret": secret, "csr_pem": _csr()}
    codes = _at_once(24, lambda _i: _call(coord, "POST", "/api/v1/join", json=body))
    assert codes.count(200) == 1, codes
    assert set(codes) <= {200, 403, 429}
