"""What the coordinator believes of a node's own report (coordinator/server/node_claims.py)."""

from __future__ import annotations

import pytest

from coordinator.server import node_claims
from coordinator.server.node_claims import (
    MAX_REPORT_DEPTH,
    BeatLimiter,
    ClaimRefused,
    bounded_capacity,
    check_address,
    check_report,
    hardware_bytes,
    peer_bound_capacities,
)
from coordinator.server.placement import MIB, ModelSpec, NodeInfo
from coordinator.server.routes import plan_chains

pytestmark = pytest.mark.unit

GIB = 1 << 30


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254:8080",  # the cloud metadata service
        "[::ffff:169.254.169.254]:8080",
        "[fe80::1]:7000",
        "0.0.0.0:7000",
        "224.0.0.1:7000",
        "240.0.0.1:7000",
        "10.0.0.5:80",  # a privileged port
        "10.0.0.5:70000",
        "127.0.0.1:7000",  # loopback, to a coordinator that is not on loopback
        "example.com:7000",
        "7000",
        "",
    ],
)
def test_addresses_no_peer_should_be_sent_to_are_refused(address: str) -> None:
    with pytest.raises(ClaimRefused):
        check_address(address, allow_loopback=False)


def test_ordinary_addresses_pass_and_loopback_only_on_a_loopback_coordinator() -> None:
    for address in ("203.0.113.7:7000", "192.168.1.20:41000", "[2001:db8::1]:7000"):
        assert check_address(address, allow_loopback=False) == address
    assert check_address("127.0.0.1:7000", allow_loopback=True) == "127.0.0.1:7000"


def test_capacity_is_held_to_the_hardware_report() -> None:
    hardware = {"gpus": [{"total_bytes": 12 * GIB}], "system_total_bytes": 32 * GIB}
    assert hardware_bytes(hardware) == 44 * GIB
    assert hardware_bytes({}) == 0
    assert hardware_bytes({"system_total_bytes": True, "gpus": "many"}) == 0
    forged = {"gpus": [{"total_bytes": 1 << 50}] * 40, "system_total_bytes": 1 << 50}
    assert hardware_bytes(forged) < 40 << 40  # sizes and GPU count held to believable ones
    assert bounded_capacity(1 << 50, 8 * GIB, 0, []) == 8 * GIB


def test_a_claim_beyond_the_peers_counts_only_what_the_node_served() -> None:
    peers = [8 * GIB, 8 * GIB, 6 * GIB]
    assert bounded_capacity(1 << 45, 1 << 45, 0, peers) == 8 * GIB
    assert bounded_capacity(1 << 45, 1 << 45, 20 * GIB, peers) == 20 * GIB
    assert bounded_capacity(4 * GIB, 4 * GIB, 0, peers) == 4 * GIB
    # Two forgers among three honest nodes do not lift each other (the upper median).
    clamped = {"a": 8 * GIB, "b": 8 * GIB, "c": 8 * GIB, "x": 1 << 45, "y": 1 << 45}
    assert peer_bound_capacities(clamped, {}) == {k: 8 * GIB for k in clamped}


def _model() -> ModelSpec:
    layers = 12
    return ModelSpec(
        n_layer=layers,
        bytes_per_layer=(300 * MIB,) * layers,
        kv_bytes_per_token_per_layer=(1024,) * layers,
        embedding_bytes=200 * MIB,
        head_bytes=200 * MIB,
    )


@pytest.mark.parametrize("min_stages", [1, 2, 3])
def test_a_forged_capacity_claim_does_not_change_placement(min_stages: int) -> None:
    """The forger claims (and reports hardware of) a petabyte: placement is what it
    would be had it claimed what the honest nodes offer."""

    def placed(forger_claim: int) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
        clamped = {"a": 3 * GIB, "b": 3 * GIB, "c": 3 * GIB, "forger": forger_claim}
        bounded = peer_bound_capacities(clamped, {})
        infos = [NodeInfo(k, v) for k, v in sorted(bounded.items())]
        chains = plan_chains(
            _model(),
            infos,
            max_chains=1,
            rtt_ms={},
            sessions_per_stage=4,
            context_tokens=256,
            spares=0,
            min_stages=min_stages,
        )
        return [(c.node_ids, tuple(s.layers.stop for s in c.stages)) for c in chains]

    honest = placed(3 * GIB)
    forged = placed(min(1 << 50, hardware_bytes({"system_total_bytes": 1 << 50})))
    assert forged == honest
    assert len(forged[0][0]) >= 2 or min_stages == 1


def test_a_deep_or_large_report_is_refused_without_recursion() -> None:
    deep: dict[str, object] = {}
    inner = deep
    for _ in range(900):
        inner["x"] = {}
        inner = inner["x"]  # type: ignore[assignment]
    with pytest.raises(ClaimRefused, match="deeper"):
        check_report("hardware", deep)
    with pytest.raises(ClaimRefused, match="values"):
        check_report("stats", {f"k{i}": i for i in range(1000)})
    with pytest.raises(ClaimRefused, match="key"):
        check_report("stats", {"k" * 65: 1})
    with pytest.raises(ClaimRefused, match="text"):
        check_report("stats", {"k": "v" * 1001})
    ok = {"gpus": [{"name": "RTX 4090", "total_bytes": 24 * GIB}], "system_total_bytes": 1}
    assert check_report("hardware", ok) == ok
    nested = {"a": {"b": {"c": 1}}}
    assert MAX_REPORT_DEPTH >= 3 and check_report("stats", nested) == nested


def test_heartbeats_are_a_token_bucket_per_node() -> None:
    limiter = BeatLimiter(per_s=5.0, burst=10.0)
    assert all(limiter.take("w", 100.0) == 0 for _ in range(10))
    assert limiter.take("w", 100.0) > 0  # the burst is spent
    assert limiter.take("other", 100.0) == 0  # each node has its own
    assert limiter.take("w", 100.2) == 0  # one more beat after 1 / per_s
    assert limiter.take("w", 100.2) > 0


@pytest.mark.parametrize(
    ("address", "lan"),
    [
        ("192.168.3.2:7000", True),
        ("10.0.0.5:7000", True),
        ("[fd00::5]:7000", True),
        ("100.64.1.2:7000", True),  # behind a carrier's NAT
        ("203.0.113.9:7000", False),
        ("8.8.8.8:7000", False),
        ("127.0.0.1:7000", False),
        ("169.254.169.254:7000", False),
        ("not-an-address", False),
    ],
)
def test_lan_addresses_are_those_of_nodes_behind_a_home_router(address: str, lan: bool) -> None:
    assert node_claims.is_lan_address(address) is lan
