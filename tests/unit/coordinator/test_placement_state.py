"""Placement counts what sessions hold beyond weights: KV per position in attention
layers, a fixed recurrent state per session in recurrent layers (every snapshot the
engine keeps), and the MTP head's KV cache on the last stage."""

from __future__ import annotations

from itertools import combinations, pairwise, permutations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.errors import PlacementError
from coordinator.server.placement import PROCESS_OVERHEAD_BYTES, ModelSpec, NodeInfo, plan
from core.types import LayerRange, ModelFacts

pytestmark = pytest.mark.unit

UNIT = 100 * 2**20


def hybrid(state: int = 10, mtp_kv: int = 0) -> ModelSpec:
    """Four layers, the last full attention; the rest hold `state` bytes per session."""
    return ModelSpec(
        n_layer=4,
        bytes_per_layer=(UNIT,) * 4,
        kv_bytes_per_token_per_layer=(0, 0, 0, 8),
        embedding_bytes=0,
        head_bytes=0,
        state_bytes_per_session_per_layer=(state, state, state, 0),
        mtp_kv_bytes_per_token=mtp_kv,
    )


def test_state_grows_with_sessions_not_with_context() -> None:
    m = hybrid(state=1000)
    r = LayerRange(0, 3)
    base = m.stage_bytes(r, 0, 0)
    assert m.stage_bytes(r, sessions=5, context_tokens=0) - base == 5 * 3 * 1000
    assert m.stage_bytes(r, sessions=5, context_tokens=4096) - base == 5 * 3 * 1000
    last = LayerRange(3, 4)
    assert m.stage_bytes(last, 5, 100) - m.stage_bytes(last, 0, 0) == 5 * 100 * 8


def test_the_mtp_cache_is_the_last_stages_alone() -> None:
    m = hybrid(state=0, mtp_kv=16)
    assert m.stage_bytes(LayerRange(0, 2), 3, 10) == 2 * UNIT + PROCESS_OVERHEAD_BYTES
    assert m.stage_bytes(LayerRange(2, 4), 3, 10) == (
        2 * UNIT + 3 * 10 * (8 + 16) + PROCESS_OVERHEAD_BYTES
    )


def test_plans_use_the_same_arithmetic() -> None:
    m = hybrid(state=UNIT // 4, mtp_kv=UNIT // 1000)
    nodes = [NodeInfo("a", 40 * UNIT), NodeInfo("b", 40 * UNIT)]
    p = plan(m, nodes, sessions_per_stage=8, context_tokens=100, min_stages=2, spares=0)
    for s in p.stages:
        assert s.bytes_needed == m.stage_bytes(s.layers, 8, 100)


def test_state_decides_whether_a_fleet_fits() -> None:
    nodes = [NodeInfo("a", 8 * UNIT)]  # 4 layers + overhead = 7 units
    assert plan(hybrid(state=0), nodes, sessions_per_stage=10, context_tokens=0).node_ids == ("a",)
    with pytest.raises(PlacementError):
        plan(hybrid(state=UNIT // 20), nodes, sessions_per_stage=10, context_tokens=0)


def test_from_facts_counts_every_snapshot() -> None:
    facts = ModelFacts(
        architecture="qwen35",
        n_layer=2,
        n_embd=8,
        n_vocab=16,
        n_ctx_train=64,
        layer_kinds=("recurrent", "full"),
        bytes_per_layer=(100, 100),
        kv_bytes_per_token_per_layer=(0, 32),
        embedding_bytes=10,
        head_bytes=10,
        tied_output=False,
        recurrent_state_bytes_per_session_per_layer=(7, 0),
        mtp_kv_bytes_per_token=32,
    )
    assert ModelSpec.from_facts(facts).state_bytes_per_session_per_layer == (63, 0)  # 1 + 8
    spec = ModelSpec.from_facts(facts, recurrent_snapshots=0)
    assert spec.state_bytes_per_session_per_layer == (7, 0)
    assert spec.mtp_kv_bytes_per_token == 32
    old = ModelFacts(**{**facts.__dict__, "recurrent_state_bytes_per_session_per_layer": ()})
    assert ModelSpec.from_facts(old).state_bytes_per_session_per_layer == ()
    with pytest.raises(ValueError):
        ModelSpec.from_facts(facts, recurrent_snapshots=-1)


def test_bad_state_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="entries"):
        ModelSpec(2, (1, 1), (0, 0), 0, 0, state_bytes_per_session_per_layer=(1,))
    with pytest.raises(ValueError, match=">= 0"):
        ModelSpec(2, (1, 1), (0, 0), 0, 0, state_bytes_per_session_per_layer=(1, -1))
    with pytest.raises(ValueError, match=">= 0"):
        ModelSpec(2, (1, 1), (0, 0), 0, 0, mtp_kv_bytes_per_token=-1)


@st.composite
def hybrid_fleets(draw: st.DrawFn) -> tuple[ModelSpec, list[NodeInfo], int, int]:
    n = draw(st.integers(1, 5))
    model = ModelSpec(
        n_layer=n,
        bytes_per_layer=tuple(draw(st.integers(0, 6)) * UNIT for _ in range(n)),
        kv_bytes_per_token_per_layer=tuple(draw(st.sampled_from([0, 4096])) for _ in range(n)),
        embedding_bytes=draw(st.integers(0, 2)) * UNIT,
        head_bytes=draw(st.integers(0, 2)) * UNIT,
        state_bytes_per_session_per_layer=tuple(
            draw(st.sampled_from([0, UNIT // 4, UNIT])) for _ in range(n)
        ),
        mtp_kv_bytes_per_token=draw(st.sampled_from([0, 4096])),
    )
    nodes = [
        NodeInfo(f"n{i}", draw(st.integers(0, 30)) * UNIT) for i in range(draw(st.integers(1, 4)))
    ]
    return model, nodes, draw(st.integers(0, 4)), draw(st.sampled_from([0, 2048]))


def need(model: ModelSpec, a: int, b: int, sessions: int, context: int) -> int:
    """The rule, written out independently of placement's prefix sums."""
    total = sum(model.bytes_per_layer[a:b]) + PROCESS_OVERHEAD_BYTES
    total += sessions * context * sum(model.kv_bytes_per_token_per_layer[a:b])
    total += sessions * sum(model.state_bytes_per_session_per_layer[a:b])
    if a == 0:
        total += model.embedding_bytes
    if b == model.n_layer:
        total += model.head_bytes + sessions * context * model.mtp_kv_bytes_per_token
        total += 0 if a == 0 else model.embedding_bytes
    return total


def shortest_chain(
    model: ModelSpec, nodes: list[NodeInfo], sessions: int, context: int
) -> int | None:
    n = model.n_layer
    for k in range(1, min(len(nodes), n) + 1):
        for seq in permutations(nodes, k):
            for inner in combinations(range(1, n), k - 1):
                cuts = (0, *inner, n)
                if all(
                    need(model, a, b, sessions, context) <= x.capacity_bytes
                    for x, (a, b) in zip(seq, pairwise(cuts), strict=True)
                ):
                    return k
    return None


@settings(max_examples=150, deadline=None)
@given(hybrid_fleets())
def test_plans_with_state_fit_and_are_as_short_as_brute_force(
    fleet: tuple[ModelSpec, list[NodeInfo], int, int],
) -> None:
    model, nodes, sessions, context = fleet
    best = shortest_chain(model, nodes, sessions, context)
    if best is None:
        with pytest.raises(PlacementError):
            plan(model, nodes, sessions_per_stage=sessions, context_tokens=context, spares=0)
        return
    p = plan(model, nodes, sessions_per_stage=sessions, context_tokens=context, spares=0)
    by_id = {x.node_id: x for x in nodes}
    for s in p.stages:
        assert s.bytes_needed == need(model, s.layers.start, s.layers.stop, sessions, context)
        assert s.bytes_needed <= by_id[s.node_id].capacity_bytes
    assert len(p.stages) == best  # fewest stages (no spares asked for)
