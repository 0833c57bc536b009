"""Placement honours the cuts a model allows (ModelSpec.allowed_cuts, from the manifest):
every stage boundary it chooses is allowed, also on re-plans, and sizes are judged per
allowed span."""

from __future__ import annotations

import random

import pytest

from coordinator.errors import NotEnoughMemory, PlacementError
from coordinator.server.placement import (
    PROCESS_OVERHEAD_BYTES,
    ModelSpec,
    NodeInfo,
    Plan,
    StageAssignment,
    plan,
)
from core.types import LayerRange, ModelFacts

pytestmark = pytest.mark.unit

UNIT = 100 * 2**20


def _model(n: int, cuts: tuple[int, ...] | None, layer: int = UNIT) -> ModelSpec:
    return ModelSpec(
        n_layer=n,
        bytes_per_layer=(layer,) * n,
        kv_bytes_per_token_per_layer=(0,) * n,
        embedding_bytes=UNIT,
        head_bytes=UNIT,
        allowed_cuts=cuts,
    )


def _nodes(*layers: int) -> list[NodeInfo]:
    """Nodes that can hold about `layers` middle layers each (plus the per-process overhead)."""
    return [
        NodeInfo(f"n{i}", PROCESS_OVERHEAD_BYTES + (k + 2) * UNIT) for i, k in enumerate(layers)
    ]


def _boundaries(p: Plan) -> list[int]:
    return [s.layers.start for s in p.stages] + [p.stages[-1].layers.stop]


def test_without_restriction_any_boundary_is_used() -> None:
    p = plan(_model(10, None), _nodes(4, 4, 4), spares=0, context_tokens=0)
    assert len(p.stages) == 3 and p.covers(10)
    # The same fleet cannot serve the model when only the halves are exact.
    with pytest.raises(NotEnoughMemory):
        plan(_model(10, (0, 5, 10)), _nodes(4, 4, 4), spares=0, context_tokens=0)


def test_period_cuts_are_the_only_boundaries_chosen() -> None:
    cuts = (0, 4, 8, 12)
    p = plan(_model(12, cuts), _nodes(5, 5, 5, 5), spares=0, context_tokens=0)
    assert set(_boundaries(p)) <= set(cuts)
    assert p.covers(12)


def test_a_node_too_small_for_one_allowed_span_is_not_used() -> None:
    # Each node fits 3 layers, but spans are 4 layers: no chain exists.
    with pytest.raises(NotEnoughMemory) as err:
        plan(_model(12, (0, 4, 8, 12)), _nodes(3, 3, 3, 3, 3), spares=0, context_tokens=0)
    assert err.value.report.largest_piece_layer in (0, 4, 8)


def test_whole_only_model_gets_one_stage_or_none() -> None:
    whole = _model(8, (0, 8))
    p = plan(whole, _nodes(20, 3, 3), spares=0, context_tokens=0)
    assert [s.layers for s in p.stages] == [LayerRange(0, 8)]
    with pytest.raises(NotEnoughMemory):
        plan(whole, _nodes(5, 5, 5), spares=0, context_tokens=0)
    with pytest.raises(PlacementError, match="min_stages=2"):
        plan(whole, _nodes(20, 20), min_stages=2)


def test_irregular_allowed_cuts_property() -> None:
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(4, 16)
        inner = sorted(rng.sample(range(1, n), rng.randint(0, min(5, n - 1))))
        cuts = (0, *inner, n)
        nodes = _nodes(*(rng.randint(1, n) for _ in range(rng.randint(1, 5))))
        try:
            p = plan(_model(n, cuts), nodes, spares=0, context_tokens=0)
        except NotEnoughMemory:
            continue
        assert set(_boundaries(p)) <= set(cuts), (cuts, _boundaries(p))
        assert all(s.fits for s in p.stages)


def test_replan_drops_a_previous_chain_cut_where_the_model_is_not_exact() -> None:
    model = _model(12, (0, 4, 8, 12))
    nodes = _nodes(7, 7, 7)
    old = Plan(
        stages=(
            StageAssignment("n0", LayerRange(0, 6), 0, nodes[0].capacity_bytes),
            StageAssignment("n1", LayerRange(6, 12), 0, nodes[1].capacity_bytes),
        ),
        spares=("n2",),
        estimated_trip_ms=0.0,
        moves=0,
    )
    p = plan(model, nodes, previous=old, spares=0, context_tokens=0)
    assert set(_boundaries(p)) <= {0, 4, 8, 12}


def test_allowed_cuts_are_validated_and_come_from_the_facts() -> None:
    with pytest.raises(ValueError):
        _model(8, (0, 4))
    with pytest.raises(ValueError):
        _model(8, (0, 4, 4, 8))
    facts = ModelFacts(
        architecture="smollm3",
        n_layer=8,
        n_embd=64,
        n_vocab=512,
        n_ctx_train=512,
        layer_kinds=("full",) * 8,
        bytes_per_layer=(1,) * 8,
        kv_bytes_per_token_per_layer=(0,) * 8,
        embedding_bytes=1,
        head_bytes=1,
        tied_output=True,
        allowed_cuts=(0, 4, 8),
    )
    assert ModelSpec.from_facts(facts).allowed_cuts == (0, 4, 8)
    assert ModelSpec.from_facts(facts).cut_points == (0, 4, 8)
