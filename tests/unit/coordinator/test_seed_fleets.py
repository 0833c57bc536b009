"""The model Sangama exists for, placed on the seeds' fleets at true sizes: Qwen3.5-397B-A17B
Q4_K_M read from a header-only GGUF (true shapes and quant types, no data), with KV
cache, recurrent state and the MTP block's cache counted for 96 sessions of 2,048
positions, as the seeds ran them.

Every boundary of qwen35moe is taken as exact (allowed_cuts=None): the engine runs a
stage of recurrent layers alone, so core.gguf_layout allows every cut for the hybrid
qwen architectures."""

from __future__ import annotations

import dataclasses

import pytest

from coordinator.errors import NotEnoughMemory
from coordinator.server.placement import PROCESS_OVERHEAD_BYTES, ModelSpec, NodeInfo, Plan, plan
from core.gguf_header import facts_from_header, read_header
from core.model_sizes import RECURRENT_SNAPSHOTS
from core.types import LayerRange, ModelFacts
from tests.support.qwen35_397b import write_header_only_gguf

pytestmark = pytest.mark.unit

GB = 10**9
SESSIONS = 96
POSITIONS = 2048


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    path = write_header_only_gguf(tmp_path_factory.mktemp("q397") / "qwen3.5-397b.gguf")
    return dataclasses.replace(facts_from_header(read_header(path)), allowed_cuts=None)


@pytest.fixture(scope="module")
def seeds_spec(facts: ModelFacts) -> ModelSpec:
    """As the seeds ran it: one recurrent state per session, no snapshots."""
    return ModelSpec.from_facts(facts, recurrent_snapshots=0)


def twenty_workers() -> list[NodeInfo]:
    # 19 capped at 16 GB and one 30 GB card; its id sorts in the middle on purpose.
    return [NodeInfo(f"w{i:02d}", 30 * GB if i == 5 else 16 * GB) for i in range(1, 21)]


def three_big() -> list[NodeInfo]:
    return [NodeInfo(f"g{i}", 96 * GB) for i in (1, 2, 3)]


def expected_need(facts: ModelFacts, r: LayerRange, snapshots: int = 0) -> int:
    """Weights, KV pool, recurrent state, MTP cache and overhead, written out from the
    facts again so the test does not trust placement's own arithmetic."""
    weights = facts.stage_weight_bytes(r)
    kv = facts.stage_kv_bytes(r, SESSIONS * POSITIONS)
    state = facts.stage_state_bytes(r, SESSIONS, copies=1 + snapshots)
    mtp_cache = (
        SESSIONS * POSITIONS * facts.mtp_kv_bytes_per_token if r.stop == facts.n_layer else 0
    )
    return weights + kv + state + mtp_cache + PROCESS_OVERHEAD_BYTES


def place(spec: ModelSpec, nodes: list[NodeInfo]) -> Plan:
    return plan(spec, nodes, sessions_per_stage=SESSIONS, context_tokens=POSITIONS, spares=0)


def test_twenty_16gb_workers_give_twenty_stages_of_three_layers(
    facts: ModelFacts, seeds_spec: ModelSpec
) -> None:
    nodes = twenty_workers()
    p = place(seeds_spec, nodes)
    assert [s.layers for s in p.stages] == LayerRange.from_cuts(list(range(0, 61, 3)))
    for s in p.stages:
        assert s.bytes_needed == expected_need(facts, s.layers)
        assert s.bytes_needed <= s.capacity_bytes
    # The seeds' workers held 14.0-15.3 GB; these stages 13-15 GB (weights 11.1-12.8 GB).
    assert all(13 * GB < s.bytes_needed < 15.5 * GB for s in p.stages[:-1])


def test_the_mtp_block_and_head_go_to_the_30gb_card(
    facts: ModelFacts, seeds_spec: ModelSpec
) -> None:
    last = place(seeds_spec, twenty_workers()).stages[-1]
    assert last.node_id == "w05" and last.layers == LayerRange(57, 60)
    # 3 blocks + output + token_embd + the 4.3 GB MTP block + its MTP cache > 16 GB.
    assert 16 * GB < last.bytes_needed < 22 * GB
    assert facts.head_bytes > 5 * GB  # output (0.83 GB) and the MTP block ride on it


def test_sessions_cost_kv_and_recurrent_state(facts: ModelFacts, seeds_spec: ModelSpec) -> None:
    p = place(seeds_spec, twenty_workers())
    first = p.stages[0]  # layers 0-2: recurrent, no KV cache at all
    weights = facts.stage_weight_bytes(first.layers)
    state = first.bytes_needed - weights - PROCESS_OVERHEAD_BYTES
    assert state == SESSIONS * 3 * 4_341_760  # 1.25 GB for 96 sessions
    second = p.stages[1]  # layers 3-5: one full-attention layer, two recurrent
    extra = second.bytes_needed - facts.stage_weight_bytes(second.layers) - PROCESS_OVERHEAD_BYTES
    assert extra == SESSIONS * (POSITIONS * 2048 + 2 * 4_341_760)


def test_three_96gb_workers_give_three_stages_of_twenty_layers(
    facts: ModelFacts, seeds_spec: ModelSpec
) -> None:
    p = place(seeds_spec, three_big())
    assert [s.layers for s in p.stages] == LayerRange.from_cuts([0, 20, 40, 60])
    for s in p.stages:
        assert s.bytes_needed == expected_need(facts, s.layers) <= 96 * GB
    assert p.stages[-1].bytes_needed > 94 * GB  # the MTP block makes the last one the fullest


def test_with_the_engines_snapshots_96_sessions_do_not_fit(facts: ModelFacts) -> None:
    """Workers keep 8 per-token snapshots of every session's recurrent state (n_rs_seq), so
    a session costs 9 states per recurrent layer: 96 sessions no longer fit either fleet,
    and placement says so instead of planning stages that would run out of memory."""
    spec = ModelSpec.from_facts(facts)
    assert spec.state_bytes_per_session_per_layer[0] == (1 + RECURRENT_SNAPSHOTS) * 4_341_760
    for nodes in (twenty_workers(), three_big()):
        with pytest.raises(NotEnoughMemory):
            place(spec, nodes)
    fewer = plan(spec, twenty_workers(), sessions_per_stage=34, context_tokens=POSITIONS, spares=0)
    for s in fewer.stages:
        assert s.bytes_needed <= s.capacity_bytes
    with pytest.raises(NotEnoughMemory):
        plan(spec, twenty_workers(), sessions_per_stage=35, context_tokens=POSITIONS, spares=0)
