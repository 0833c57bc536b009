"""Placement: the seeds' fleets with real sizes, impossible fleets, RTT ordering, re-planning,
and properties checked against brute force on small random models and fleets."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from itertools import combinations, pairwise, permutations
from typing import TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.errors import NotEnoughMemory, PlacementError
from coordinator.server.placement import (
    DEFAULT_RTT_MS,
    PROCESS_OVERHEAD_BYTES,
    ModelSpec,
    NodeInfo,
    Plan,
    describe,
    plan,
)
from core.types import LayerRange, ModelFacts

pytestmark = pytest.mark.unit

GB = 10**9
KIB = 1024
UNIT = 100 * 2**20
"""Sizes of the small random models: the per-process overhead (300 MiB) is 3 units."""

# Qwen3.5-397B-A17B Q4_K_M as the seeds ran it: 60 blocks of ~4.1 GB (3 per 16 GB worker,
# "12.6 GB of model weights" there with the embedding); token embedding and output head
# assumed ~1.0 GB each (a ~250k vocabulary at 4-6 bits); the MTP layer (5.7 GB,
# converted from the original release) rides on the last stage. One layer in four is full
# attention, the rest Gated DeltaNet with no per-token cache. Full attention with 2 KV heads
# of 256 dims in f16 costs 2 KiB per token; we take 16 KiB, 8x that, as a margin.
QWEN_LAYERS = 60
QWEN = ModelSpec(
    n_layer=QWEN_LAYERS,
    bytes_per_layer=(int(4.1 * GB),) * QWEN_LAYERS,
    kv_bytes_per_token_per_layer=tuple(
        16 * KIB if (i + 1) % 4 == 0 else 0 for i in range(QWEN_LAYERS)
    ),
    embedding_bytes=1 * GB,
    head_bytes=1 * GB,
    mtp_bytes=int(5.7 * GB),
)


def need(model: ModelSpec, a: int, b: int, sessions: int = 8, context: int = 4096) -> int:
    """The documented memory rule, written out again so the tests do not trust the module."""
    total = sum(model.bytes_per_layer[a:b]) + PROCESS_OVERHEAD_BYTES
    total += sessions * context * sum(model.kv_bytes_per_token_per_layer[a:b])
    if a == 0:
        total += model.embedding_bytes
    if b == model.n_layer:
        total += model.head_bytes + model.mtp_bytes + (0 if a == 0 else model.embedding_bytes)
    return total


def assert_valid(
    p: Plan,
    model: ModelSpec,
    nodes: Sequence[NodeInfo],
    sessions: int = 8,
    context: int = 4096,
) -> None:
    assert p.covers(model.n_layer)
    assert [s.layers.start for s in p.stages[1:]] == [s.layers.stop for s in p.stages[:-1]]
    by_id = {n.node_id: n for n in nodes}
    for s in p.stages:
        node = by_id[s.node_id]
        assert node.healthy
        assert s.capacity_bytes == node.capacity_bytes
        assert s.bytes_needed == need(model, s.layers.start, s.layers.stop, sessions, context)
        assert s.bytes_needed <= node.capacity_bytes
    healthy = {n.node_id for n in nodes if n.healthy}
    assert set(p.spares) == healthy - set(p.node_ids)
    assert list(p.spares) == sorted(p.spares)


class Kwargs(TypedDict):
    sessions_per_stage: int
    context_tokens: int


def layer_counts(p: Plan) -> list[int]:
    return [len(s.layers) for s in p.stages]


def path_ms(ids: Sequence[str], rtt: Mapping[tuple[str, str], float]) -> float:
    def one(a: str, b: str) -> float:
        return rtt.get((a, b), rtt.get((b, a), DEFAULT_RTT_MS))

    return sum(one(a, b) for a, b in pairwise(ids))


def twenty_workers() -> list[NodeInfo]:
    # 19 capped at 16 GB and one 30 GB card; its id sorts in the middle on purpose.
    return [NodeInfo(f"w{i:02d}", 30 * GB if i == 5 else 16 * GB) for i in range(1, 21)]


# ---------------------------------------------------------------------------- the seeds


def test_twenty_16gb_workers_give_three_layers_each_and_the_30gb_card_the_last_stage() -> None:
    nodes = twenty_workers()
    p = plan(QWEN, nodes)
    assert_valid(p, QWEN, nodes)
    assert layer_counts(p) == [3] * 20
    assert p.stages[-1].node_id == "w05"  # 3 blocks + head + embedding + MTP layer > 16 GB
    assert p.stages[-1].bytes_needed > 16 * GB
    assert p.spares == ()  # all 20 are needed: none can be kept back
    assert p.moves == 20
    # 60 layers x 0.4 ms of compute + 19 unmeasured hops x 20 ms.
    assert p.estimated_trip_ms == pytest.approx(60 * 0.4 + 19 * DEFAULT_RTT_MS)


def test_a_twenty_first_worker_becomes_the_spare() -> None:
    nodes = [*twenty_workers(), NodeInfo("w21", 16 * GB)]
    p = plan(QWEN, nodes)
    assert_valid(p, QWEN, nodes)
    assert len(p.stages) == 20 and p.spares == ("w21",)
    assert p.stages[-1].node_id == "w05"


def test_three_96gb_workers_give_three_stages_of_twenty_layers() -> None:
    nodes = [NodeInfo(f"g{i}", 96 * GB) for i in (1, 2, 3)]
    p = plan(QWEN, nodes)
    assert_valid(p, QWEN, nodes)
    assert [s.layers for s in p.stages] == LayerRange.from_cuts([0, 20, 40, 60])
    assert p.node_ids == ("g1", "g2", "g3")
    for s in p.stages:  # ~82 GB of blocks each, plus the end pieces on the first and last
        assert 82 * GB <= s.bytes_needed <= 96 * GB


def test_ten_16gb_workers_are_not_enough_and_the_error_says_by_how_much() -> None:
    nodes = [NodeInfo(f"w{i}", 16 * GB) for i in range(10)]
    with pytest.raises(NotEnoughMemory) as caught:
        plan(QWEN, nodes)
    r = caught.value.report
    assert r.total_short and not r.piece_too_big
    assert r.available_bytes == 160 * GB and r.healthy_nodes == 10
    assert r.needed_bytes > 60 * 4.1 * GB
    message = str(caught.value)
    assert "160.0 GB" in message and "10 healthy nodes" in message and "more is needed" in message


def test_a_layer_bigger_than_every_node_is_reported_as_such() -> None:
    nodes = [NodeInfo(f"w{i:03d}", 4 * GB) for i in range(100)]  # 400 GB: plenty in total
    with pytest.raises(NotEnoughMemory) as caught:
        plan(QWEN, nodes)
    r = caught.value.report
    assert r.piece_too_big and not r.total_short
    assert r.largest_piece_layer == QWEN_LAYERS - 1  # the last, with head, embedding, MTP layer
    assert r.largest_piece_bytes == need(QWEN, 59, 60)
    assert r.largest_node_bytes == 4 * GB
    assert "layer 59" in str(caught.value) and "4.0 GB" in str(caught.value)


def test_enough_in_total_but_not_in_whole_layers() -> None:
    model = ModelSpec(3, (10 * UNIT,) * 3, (0,) * 3, 0, 0)
    nodes = [NodeInfo("a", 18 * UNIT), NodeInfo("b", 18 * UNIT)]  # 13 per layer, 23 for two
    with pytest.raises(NotEnoughMemory) as caught:
        plan(model, nodes)
    r = caught.value.report
    assert not r.total_short and not r.piece_too_big
    assert "whole layers" in str(caught.value)


def test_no_healthy_nodes() -> None:
    with pytest.raises(NotEnoughMemory, match="no healthy nodes"):
        plan(QWEN, [NodeInfo("w", 96 * GB, healthy=False)])


# ---------------------------------------------------------------------------- choices


def test_unhealthy_nodes_are_never_used() -> None:
    nodes = [*twenty_workers(), NodeInfo("w00", 30 * GB, healthy=False)]
    nodes += [NodeInfo("w99", 96 * GB, healthy=False)]
    p = plan(QWEN, nodes)
    assert_valid(p, QWEN, nodes)
    assert "w00" not in p.node_ids + p.spares and "w99" not in p.node_ids + p.spares


def test_fewest_stages_and_min_stages() -> None:
    small = ModelSpec(4, (10 * UNIT,) * 4, (0,) * 4, UNIT, UNIT)
    nodes = [NodeInfo("big", 100 * UNIT), NodeInfo("b", 60 * UNIT), NodeInfo("c", 60 * UNIT)]
    one = plan(small, nodes)
    assert one.node_ids == ("big",) and one.spares == ("b", "c")
    two = plan(small, nodes, min_stages=2)
    assert len(two.stages) == 2 and len(two.spares) == 1
    with pytest.raises(PlacementError, match="min_stages"):
        plan(small, nodes, min_stages=4)  # more than the healthy nodes
    with pytest.raises(PlacementError, match="min_stages"):
        plan(small, [*nodes, NodeInfo("d", 60 * UNIT), NodeInfo("e", 60 * UNIT)], min_stages=5)


def test_without_room_for_the_spares_every_node_joins_the_chain() -> None:
    small = ModelSpec(6, (10 * UNIT,) * 6, (0,) * 6, 0, 0)
    nodes = [NodeInfo(n, 40 * UNIT) for n in "abcd"]  # 3 layers each: 2 nodes are enough
    assert len(plan(small, nodes, spares=2).stages) == 2
    p = plan(small, nodes, spares=3)
    assert len(p.stages) == 4 and p.spares == ()
    assert_valid(p, small, nodes)


def test_cuts_fall_anywhere_and_faster_nodes_take_more_layers() -> None:
    model = ModelSpec(7, (10 * UNIT,) * 7, (0,) * 7, 0, 0)
    # 5 layers need 53 units: only the big node can take them.
    p = plan(model, [NodeInfo("a", 55 * UNIT), NodeInfo("b", 30 * UNIT)])
    assert sorted(layer_counts(p)) == [2, 5]
    fast = [NodeInfo("a", 80 * UNIT, compute_speed=3.0), NodeInfo("b", 80 * UNIT)]
    p = plan(model, fast, min_stages=2)
    assert p.stage_of("a") is not None and p.stage_of("b") is not None
    assert len(p.stage_of("a").layers) > len(p.stage_of("b").layers)  # type: ignore[union-attr]


def test_leftover_layers_go_to_the_node_with_room() -> None:
    model = ModelSpec(7, (10 * UNIT,) * 7, (0,) * 7, 0, 0)
    nodes = [NodeInfo("a", 40 * UNIT), NodeInfo("b", 40 * UNIT), NodeInfo("c", 80 * UNIT)]
    p = plan(model, nodes, min_stages=3)
    assert p.stage_of("c") is not None and len(p.stage_of("c").layers) == 3  # type: ignore[union-attr]


def test_rtt_puts_near_nodes_next_to_each_other() -> None:
    model = ModelSpec(4, (10 * UNIT,) * 4, (0,) * 4, 0, 0)
    where = {"n1": 30, "n2": 0, "n3": 20, "n4": 10}  # on a line, ids shuffled
    rtt = {(a, b): float(abs(where[a] - where[b])) for a, b in combinations(where, 2)}
    nodes = [NodeInfo(n, 14 * UNIT) for n in where]  # one layer each: all four needed
    p = plan(model, nodes, rtt_ms=rtt)
    assert p.node_ids in (("n2", "n4", "n3", "n1"), ("n1", "n3", "n4", "n2"))
    assert p.estimated_trip_ms == pytest.approx(4 * 0.4 + 30.0)


def test_rtt_ordering_of_a_long_chain() -> None:
    n = 12  # beyond the exhaustive search
    model = ModelSpec(n, (10 * UNIT,) * n, (0,) * n, 0, 0)
    ids = [f"n{i:02d}" for i in range(n)]
    where = dict(zip(ids, random.Random(7).sample(range(n), n), strict=True))
    rtt = {(a, b): 10.0 * abs(where[a] - where[b]) for a, b in combinations(ids, 2)}
    p = plan(model, [NodeInfo(i, 14 * UNIT) for i in ids], rtt_ms=rtt)
    assert path_ms(p.node_ids, rtt) == pytest.approx(10.0 * (n - 1))  # the line, in order


def test_far_nodes_stay_out_of_a_long_chain() -> None:
    n = 10
    model = ModelSpec(n, (10 * UNIT,) * n, (0,) * n, 0, 0)
    near = [f"near{i}" for i in range(n)]
    far = [f"a-far{i}" for i in range(3)]  # sort first, so a by-id choice would take them
    rtt = {
        (a, b): (5.0 if a in near and b in near else 200.0) for a, b in combinations(near + far, 2)
    }
    nodes = [NodeInfo(i, 14 * UNIT) for i in near + far]
    p = plan(model, nodes, rtt_ms=rtt)
    assert set(p.node_ids) == set(near) and p.spares == tuple(sorted(far))


def test_exact_search_picks_the_near_subset() -> None:
    model = ModelSpec(3, (10 * UNIT,) * 3, (0,) * 3, 0, 0)
    ids = ["a", "b", "c", "d", "e"]
    rtt = {(x, y): 100.0 for x, y in combinations(ids, 2)}
    rtt |= {("c", "e"): 1.0, ("e", "b"): 2.0, ("c", "b"): 50.0}
    p = plan(model, [NodeInfo(i, 14 * UNIT) for i in ids], rtt_ms=rtt)
    assert p.node_ids in (("c", "e", "b"), ("b", "e", "c"))
    assert p.spares == ("a", "d")


# ---------------------------------------------------------------------------- re-planning


def test_nothing_changed_keeps_the_plan() -> None:
    nodes = [*twenty_workers(), NodeInfo("w21", 16 * GB)]
    first = plan(QWEN, nodes)
    again = plan(QWEN, nodes, previous=first)
    assert again.stages == first.stages and again.moves == 0
    joined = plan(QWEN, [*nodes, NodeInfo("w22", 96 * GB)], previous=first)
    assert joined.stages == first.stages and joined.moves == 0
    assert joined.spares == ("w21", "w22")


def test_a_node_leaving_is_replaced_by_the_spare() -> None:
    nodes = [*twenty_workers(), NodeInfo("w21", 16 * GB)]
    first = plan(QWEN, nodes)
    gone = first.stages[7]
    left = [
        n if n.node_id != gone.node_id else NodeInfo(n.node_id, n.capacity_bytes, False)
        for n in nodes
    ]
    second = plan(QWEN, left, previous=first)
    assert_valid(second, QWEN, left)
    assert second.moves == 1 and second.spares == ()
    assert second.stage_of("w21") == first.stages[7].__class__(
        "w21", gone.layers, gone.bytes_needed, 16 * GB
    )
    for before, after in zip(first.stages, second.stages, strict=True):
        if before.node_id != gone.node_id:
            assert before == after


def test_three_big_workers_and_a_spare_survive_a_departure() -> None:
    nodes = [NodeInfo(f"g{i}", 96 * GB) for i in (1, 2, 3, 4)]
    first = plan(QWEN, nodes)
    assert first.node_ids == ("g1", "g2", "g3") and first.spares == ("g4",)
    second = plan(QWEN, [n for n in nodes if n.node_id != "g2"], previous=first)
    assert second.node_ids == ("g1", "g4", "g3") and second.moves == 1
    assert [s.layers for s in second.stages] == [s.layers for s in first.stages]


def test_the_spare_nearest_to_the_gap_is_chosen() -> None:
    model = ModelSpec(3, (10 * UNIT,) * 3, (0,) * 3, 0, 0)
    nodes = [NodeInfo(i, 14 * UNIT) for i in ("a", "b", "c", "s1", "s2")]
    first = plan(model, nodes)
    assert first.node_ids == ("a", "b", "c")
    rtt = {("a", "s2"): 1.0, ("s2", "c"): 1.0}
    second = plan(model, [n for n in nodes if n.node_id != "b"], rtt_ms=rtt, previous=first)
    assert second.node_ids == ("a", "s2", "c") and second.spares == ("s1",)


def test_a_node_that_shrank_is_replaced() -> None:
    nodes = [NodeInfo(f"g{i}", 96 * GB) for i in (1, 2, 3, 4)]
    first = plan(QWEN, nodes)
    shrunk = [NodeInfo("g1", 40 * GB), *nodes[1:]]
    second = plan(QWEN, shrunk, previous=first)
    assert_valid(second, QWEN, shrunk)
    assert second.node_ids == ("g4", "g2", "g3") and second.spares == ("g1",)
    assert second.moves == 2  # g4 takes the layers, g1 gives them up


def test_without_a_fitting_spare_the_fallback_plans_afresh() -> None:
    nodes = [*twenty_workers(), NodeInfo("w21", 16 * GB)]
    first = plan(QWEN, nodes)
    # Without the 30 GB card no 16 GB node can take the last stage's 3 layers and extras,
    # and a fresh plan on 20 x 16 GB cannot cover 60 layers either.
    with pytest.raises(NotEnoughMemory, match="whole layers"):
        plan(QWEN, [n for n in nodes if n.node_id != "w05"], previous=first)


def test_gaps_can_be_refilled_by_two_spares() -> None:
    model = ModelSpec(4, (10 * UNIT,) * 4, (0,) * 4, 0, 0)
    nodes = [NodeInfo("a", 24 * UNIT), NodeInfo("b", 24 * UNIT)]
    spares = [NodeInfo("s1", 14 * UNIT), NodeInfo("s2", 14 * UNIT)]
    first = plan(model, [*nodes, *spares])
    assert first.node_ids == ("a", "b") and first.spares == ("s1", "s2")
    second = plan(model, [nodes[0], *spares], previous=first)
    assert second.stages[0] == first.stages[0]
    assert second.node_ids == ("a", "s1", "s2") and second.moves == 2


# ---------------------------------------------------------------------------- determinism


def test_the_same_facts_in_any_order_give_the_same_plan() -> None:
    nodes = [*twenty_workers(), NodeInfo("w21", 16 * GB), NodeInfo("w22", 24 * GB)]
    ids = [n.node_id for n in nodes]
    rtt = {(a, b): float(random.Random(a + b).randint(1, 60)) for a, b in combinations(ids, 2)}
    reference = plan(QWEN, nodes, rtt_ms=rtt)
    assert_valid(reference, QWEN, nodes)
    for seed in range(3):
        shuffled = random.Random(seed).sample(nodes, len(nodes))
        assert plan(QWEN, shuffled, rtt_ms=rtt) == reference
    assert path_ms(reference.node_ids, rtt) <= path_ms(sorted(reference.node_ids), rtt)


# ---------------------------------------------------------------------------- API bits


def test_plan_helpers_and_describe() -> None:
    nodes = [NodeInfo(f"g{i}", 96 * GB) for i in (1, 2, 3, 4)]
    p = plan(QWEN, nodes)
    assert p.stage_of("g2") is not None and p.stage_of("g2").layers == LayerRange(20, 40)  # type: ignore[union-attr]
    assert p.stage_of("g4") is None and p.stage_of("nobody") is None
    hop = p.next_hop("g1")
    assert hop is not None and hop.node_id == "g2"
    assert p.next_hop("g3") is None and p.next_hop("g4") is None
    assert p.covers(60) and not p.covers(61)
    text = describe(p)
    assert "layers 20-39" in text and "g3" in text and "spares: g4" in text and "moves: 3" in text


def test_model_spec_from_facts_and_stage_bytes() -> None:
    facts = ModelFacts(
        architecture="qwen35moe",
        n_layer=4,
        n_embd=8,
        n_vocab=16,
        n_ctx_train=4096,
        layer_kinds=("recurrent", "recurrent", "recurrent", "full"),
        bytes_per_layer=(100, 100, 100, 120),
        kv_bytes_per_token_per_layer=(0, 0, 0, 32),
        embedding_bytes=50,
        head_bytes=60,
        tied_output=False,
    )
    spec = ModelSpec.from_facts(facts, mtp_bytes=70)
    assert spec.bytes_per_layer == facts.bytes_per_layer and spec.mtp_bytes == 70
    for r in (LayerRange(0, 2), LayerRange(1, 3), LayerRange(2, 4), LayerRange(0, 4)):
        weights = facts.stage_weight_bytes(r) + (70 if r.stop == 4 else 0)
        assert spec.stage_weight_bytes(r) == weights
        expected = weights + facts.stage_kv_bytes(r, 2 * 10) + PROCESS_OVERHEAD_BYTES
        assert spec.stage_bytes(r, sessions=2, context_tokens=10) == expected


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        ModelSpec(2, (1,), (0, 0), 0, 0)
    with pytest.raises(ValueError):
        NodeInfo("", 1)
    with pytest.raises(ValueError):
        NodeInfo("a", 1, compute_speed=0)
    with pytest.raises(PlacementError, match="node_id"):
        plan(QWEN, [NodeInfo("a", 96 * GB), NodeInfo("a", 96 * GB)])
    with pytest.raises(ValueError):
        plan(QWEN, [NodeInfo("a", 96 * GB)], rtt_ms={("a", "b"): -1.0})


# ---------------------------------------------------------------------------- properties


def feasible(
    model: ModelSpec,
    seq: Sequence[NodeInfo],
    sessions: int,
    context: int,
) -> bool:
    n, k = model.n_layer, len(seq)
    for inner in combinations(range(1, n), k - 1):
        cuts = (0, *inner, n)
        pairs = zip(seq, pairwise(cuts), strict=True)
        if all(need(model, a, b, sessions, context) <= x.capacity_bytes for x, (a, b) in pairs):
            return True
    return False


def brute_force(
    model: ModelSpec, healthy: Sequence[NodeInfo], sessions: int, context: int
) -> dict[int, list[tuple[str, ...]]]:
    """Chain length -> every feasible sequence of node ids of that length."""
    out: dict[int, list[tuple[str, ...]]] = {}
    for k in range(1, min(len(healthy), model.n_layer) + 1):
        for seq in permutations(healthy, k):
            if feasible(model, seq, sessions, context):
                out.setdefault(k, []).append(tuple(x.node_id for x in seq))
    return out


@st.composite
def fleets(draw: st.DrawFn) -> tuple[ModelSpec, list[NodeInfo], int, int]:
    n = draw(st.integers(1, 6))
    model = ModelSpec(
        n_layer=n,
        bytes_per_layer=tuple(draw(st.integers(0, 8)) * UNIT for _ in range(n)),
        kv_bytes_per_token_per_layer=tuple(
            draw(st.sampled_from([0, 25 * KIB, 50 * KIB])) for _ in range(n)
        ),
        embedding_bytes=draw(st.integers(0, 4)) * UNIT,
        head_bytes=draw(st.integers(0, 4)) * UNIT,
        mtp_bytes=draw(st.integers(0, 4)) * UNIT,
    )
    nodes = [
        NodeInfo(
            f"n{i}",
            draw(st.integers(0, 40)) * UNIT + draw(st.integers(0, UNIT)),
            healthy=draw(st.integers(0, 5)) > 0,
            compute_speed=draw(st.sampled_from([0.5, 1.0, 2.0])),
        )
        for i in range(draw(st.integers(0, 5) | st.integers(3, 5)))
    ]
    return model, nodes, draw(st.integers(0, 2)), draw(st.sampled_from([0, 1024]))


@settings(max_examples=300, deadline=None)
@given(fleets(), st.integers(1, 3), st.integers(0, 2))
def test_plans_are_valid_and_minimal_or_the_fleet_is_truly_too_small(
    fleet: tuple[ModelSpec, list[NodeInfo], int, int], min_stages: int, spares: int
) -> None:
    model, nodes, sessions, context = fleet
    healthy = [x for x in nodes if x.healthy]
    chains = brute_force(model, healthy, sessions, context)
    lengths = sorted(k for k in chains if k >= min_stages)
    kwargs = Kwargs(sessions_per_stage=sessions, context_tokens=context)
    if not lengths:
        with pytest.raises(PlacementError) as caught:
            plan(model, nodes, min_stages=min_stages, spares=spares, **kwargs)
        if min_stages <= min(len(healthy), model.n_layer):
            assert isinstance(caught.value, NotEnoughMemory)
            report = caught.value.report
            assert report.available_bytes == sum(x.capacity_bytes for x in healthy)
            assert report.largest_node_bytes == max((x.capacity_bytes for x in healthy), default=0)
        return
    p = plan(model, nodes, min_stages=min_stages, spares=spares, **kwargs)
    assert_valid(p, model, nodes, sessions, context)
    shortest = lengths[0]
    expected = shortest if len(healthy) - shortest >= spares else lengths[-1]
    assert len(p.stages) == expected
    assert p.moves == len(p.stages)


@st.composite
def measured_fleets(
    draw: st.DrawFn,
) -> tuple[ModelSpec, list[NodeInfo], dict[tuple[str, str], float]]:
    model, nodes, _, _ = draw(fleets())
    nodes = [NodeInfo(x.node_id, x.capacity_bytes) for x in nodes]
    rtt = {
        pair: float(draw(st.integers(0, 100)))
        for pair in combinations([x.node_id for x in nodes], 2)
        if draw(st.booleans())
    }
    return model, nodes, rtt


@settings(max_examples=200, deadline=None)
@given(measured_fleets())
def test_small_chains_take_the_shortest_round_trip(
    fleet: tuple[ModelSpec, list[NodeInfo], dict[tuple[str, str], float]],
) -> None:
    model, nodes, rtt = fleet
    chains = brute_force(model, nodes, 0, 0)
    if not chains:
        with pytest.raises(PlacementError):
            plan(model, nodes, rtt_ms=rtt, sessions_per_stage=0, spares=0)
        return
    p = plan(model, nodes, rtt_ms=rtt, sessions_per_stage=0, spares=0)
    assert_valid(p, model, nodes, 0, 4096)
    best = min(path_ms(seq, rtt) for seq in chains[len(p.stages)])
    assert path_ms(p.node_ids, rtt) == pytest.approx(best)


@settings(max_examples=100, deadline=None)
@given(fleets(), st.data())
def test_replanning_after_departures_is_valid_and_stable(
    fleet: tuple[ModelSpec, list[NodeInfo], int, int], data: st.DataObject
) -> None:
    model, nodes, sessions, context = fleet
    kwargs = Kwargs(sessions_per_stage=sessions, context_tokens=context)
    try:
        first = plan(model, nodes, **kwargs)
    except PlacementError:
        return
    assert plan(model, nodes, previous=first, **kwargs).moves == 0
    leaving = data.draw(st.sets(st.sampled_from([x.node_id for x in nodes])))
    after = [x for x in nodes if x.node_id not in leaving]
    try:
        second = plan(model, after, previous=first, **kwargs)
    except PlacementError:
        assert not brute_force(model, [x for x in after if x.healthy], sessions, context)
        return
    assert_valid(second, model, after, sessions, context)
    stayed = [s for s in first.stages if s.node_id not in leaving]
    if len(stayed) == len(first.stages):
        assert second.stages == first.stages


def test_the_biggest_node_goes_where_the_biggest_layer_is() -> None:
    # Layer 2 is huge: only "big" can hold it, so "big" must sit in the middle.
    model = ModelSpec(5, tuple(u * UNIT for u in (2, 2, 20, 2, 2)), (0,) * 5, 0, 0)
    nodes = [NodeInfo("big", 25 * UNIT), NodeInfo("s1", 10 * UNIT), NodeInfo("s2", 10 * UNIT)]
    p = plan(model, nodes)
    assert_valid(p, model, nodes, 8, 4096)
    assert p.node_ids == ("s1", "big", "s2")
    assert p.stage_of("big") is not None and p.stage_of("big").layers == LayerRange(2, 3)  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_long_chains_are_valid_and_deterministic(data: st.DataObject) -> None:
    n = data.draw(st.integers(9, 24))
    model = ModelSpec(
        n_layer=n,
        bytes_per_layer=tuple(data.draw(st.integers(1, 6)) * UNIT for _ in range(n)),
        kv_bytes_per_token_per_layer=(0,) * n,
        embedding_bytes=data.draw(st.integers(0, 3)) * UNIT,
        head_bytes=data.draw(st.integers(0, 3)) * UNIT,
        mtp_bytes=data.draw(st.integers(0, 6)) * UNIT,
    )
    caps = data.draw(st.lists(st.integers(4, 20), min_size=9, max_size=16))
    nodes = [NodeInfo(f"n{i:02d}", c * UNIT + i) for i, c in enumerate(caps)]  # all distinct
    ids = [x.node_id for x in nodes]
    rtt = {pair: float(data.draw(st.integers(1, 50))) for pair in combinations(ids, 2)}
    try:
        p = plan(model, nodes, rtt_ms=rtt, min_stages=9, spares=0)
    except NotEnoughMemory:
        return
    assert_valid(p, model, nodes)
    assert len(p.stages) >= 9
    shuffled = data.draw(st.permutations(nodes))
    assert plan(model, shuffled, rtt_ms=rtt, min_stages=9, spares=0) == p


def test_a_repair_hands_the_stage_to_the_spare_warm_for_it() -> None:
    nodes = [NodeInfo(f"g{i}", 96 * GB) for i in (1, 2, 3, 4, 5)]
    first = plan(QWEN, nodes, spares=2)
    assert first.node_ids == ("g1", "g2", "g3") and first.spares == ("g4", "g5")
    left = [n for n in nodes if n.node_id != "g2"]
    gone = first.stages[1].layers
    cold = plan(QWEN, left, previous=first, spares=2)
    assert cold.node_ids == ("g1", "g4", "g3")  # the cheapest newcomer, with no warm one
    warm = plan(QWEN, left, previous=first, spares=2, warm={(gone.start, gone.stop): "g5"})
    assert warm.node_ids == ("g1", "g5", "g3") and warm.moves == 1
    assert warm.stage_of("g5").layers == gone  # type: ignore[union-attr]
    # A warm spare that is gone itself, or warm for other layers, changes nothing.
    assert plan(QWEN, left[:-1], previous=first, warm={(gone.start, gone.stop): "g5"}).node_ids == (
        "g1",
        "g4",
        "g3",
    )
    assert plan(QWEN, left, previous=first, spares=2, warm={(0, 1): "g5"}).node_ids == (
        "g1",
        "g4",
        "g3",
    )
