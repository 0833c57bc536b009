"""coordinator.server.routes: more complete chains from nodes left over, and new routes
spread over them by measured load."""

from __future__ import annotations

import pytest

from coordinator.server.placement import ModelSpec, NodeInfo
from coordinator.server.routes import StageLoad, chain_room, pick_chain, plan_chains

pytestmark = pytest.mark.unit

UNIT = 100 * 2**20
MODEL = ModelSpec(
    n_layer=8,
    bytes_per_layer=(UNIT,) * 8,
    kv_bytes_per_token_per_layer=(0,) * 8,
    embedding_bytes=UNIT,
    head_bytes=UNIT,
)
ARGS = {"rtt_ms": {}, "sessions_per_stage": 256, "context_tokens": 256, "min_stages": 2}


def nodes(n: int, size: int = 12 * UNIT) -> list[NodeInfo]:
    return [NodeInfo(f"n{i}", size) for i in range(n)]


def test_nodes_beyond_the_main_chain_form_more_complete_chains() -> None:
    chains = plan_chains(MODEL, nodes(6), max_chains=3, spares=0, **ARGS)  # type: ignore[arg-type]
    assert len(chains) == 3
    ids = [i for c in chains for i in c.node_ids]
    assert len(ids) == len(set(ids)) == 6, "no node serves two chains"
    for c in chains:
        assert c.stages[0].layers.start == 0 and c.stages[-1].layers.stop == 8
    # One chain only when asked, and the main chain keeps its spares out of the others.
    assert len(plan_chains(MODEL, nodes(6), max_chains=1, spares=0, **ARGS)) == 1  # type: ignore[arg-type]
    kept = plan_chains(MODEL, nodes(5), max_chains=3, spares=1, **ARGS)  # type: ignore[arg-type]
    assert len(kept) == 2 and kept[0].spares[0] not in {i for c in kept for i in c.node_ids}


def test_a_left_over_node_too_small_for_the_model_forms_no_chain() -> None:
    fleet = [*nodes(2), NodeInfo("small", 4 * UNIT)]
    assert len(plan_chains(MODEL, fleet, max_chains=4, spares=0, **ARGS)) == 1  # type: ignore[arg-type]


def test_routes_go_to_the_chain_with_the_most_room_counting_routes_not_yet_reported() -> None:
    busy = [StageLoad(200, 256, 1000, 900), StageLoad(10, 256, 1000, 50)]
    idle = [StageLoad(10, 256, 1000, 40), StageLoad(12, 256, 1000, 60)]
    assert chain_room(busy) == pytest.approx(0.1), "the fullest stage decides (KV 90%)"
    assert pick_chain([busy, idle], [0, 0]) == 1
    # Routes handed out since the beats count as sessions: enough of them tip the choice.
    assert pick_chain([busy, idle], [0, 230]) == 0
    # Stages that reported nothing yet count as empty; ties go to the main chain.
    assert chain_room([StageLoad()]) == 1.0
    assert pick_chain([[StageLoad()], [StageLoad()]], [0, 0]) == 0
    with pytest.raises(ValueError):
        pick_chain([busy], [0, 0])
