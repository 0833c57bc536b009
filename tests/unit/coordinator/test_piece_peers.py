"""Where a volunteer gets a piece (coordinator/server/piece_peers.py): holders ranked by
round trip, then by downloads pointed at them lately; the mirror, then the coordinator
after them; only a healthy node's word for its own stage's layers counts."""

from __future__ import annotations

from typing import cast

import pytest

from coordinator.contract import PieceSource
from coordinator.server.piece_peers import (
    POINTED_WINDOW_S,
    Holder,
    PieceBook,
    asked_bytes,
    holders_of,
    rank_sources,
)
from core.manifest import Manifest, PieceInfo
from core.types import LayerRange

pytestmark = pytest.mark.unit

A = Holder("a", "10.0.0.1:7000", (0, 4))
B = Holder("b", "10.0.0.2:7000", (0, 4))
C = Holder("c", "10.0.0.3:7000", (0, 4))


def _ids(sources: list[PieceSource]) -> list[str]:
    return [s.node_id or s.kind for s in sources]


def test_with_nothing_known_peers_come_by_id_then_the_mirror_then_the_coordinator() -> None:
    ranked = rank_sources("me", [C, A, B], {}, {}, has_mirror=True)
    assert _ids(ranked) == ["a", "b", "c", "mirror", "coordinator"]
    assert ranked[0] == PieceSource("peer", "a", "10.0.0.1:7000")


def test_no_mirror_and_no_peer_leave_the_coordinator() -> None:
    assert _ids(rank_sources("me", [], {}, {}, has_mirror=False)) == ["coordinator"]


def test_the_asker_is_never_its_own_source() -> None:
    assert _ids(rank_sources("a", [A, B], {}, {}, has_mirror=False)) == ["b", "coordinator"]


def test_a_known_round_trip_ranks_before_an_unknown_one_and_nearer_first() -> None:
    rtt = {("me", "c"): 80.0, ("b", "me"): 5.0}  # either direction's measurement counts
    assert _ids(rank_sources("me", [A, B, C], rtt, {}, False))[:3] == ["b", "c", "a"]


def test_among_near_peers_the_least_pointed_at_comes_first() -> None:
    rtt = {("me", "a"): 3.0, ("me", "b"): 7.0, ("me", "c"): 45.0}
    pointed = {"a": 5, "b": 1, "c": 0}
    # a and b share a 10 ms bucket: b was pointed at less; c is farther whatever its count.
    assert _ids(rank_sources("me", [A, B, C], rtt, pointed, False))[:3] == ["b", "a", "c"]


def test_pointed_counts_spread_a_join_storm() -> None:
    book = PieceBook(clock=lambda: 0.0)
    for h in (A, B, C):
        book.beat(h.node_id, h.address, h.layers)
    firsts = []
    for asker in ("n1", "n2", "n3", "n4"):
        ranked = rank_sources(asker, book.holders(), {}, book.pointed(), False)
        book.point(ranked[0].node_id)
        firsts.append(ranked[0].node_id)
    assert firsts == ["a", "b", "c", "a"]


def test_pointings_are_forgotten_after_the_window() -> None:
    now = [0.0]
    book = PieceBook(clock=lambda: now[0])
    book.point("a")
    assert book.pointed() == {"a": 1}
    now[0] = POINTED_WINDOW_S + 1
    assert book.pointed() == {}


def test_at_most_so_many_peers_are_listed() -> None:
    many = [Holder(f"n{i:02d}", f"10.0.1.{i}:7000", (0, 4)) for i in range(20)]
    ranked = rank_sources("me", many, {}, {}, False, most=8)
    assert len(ranked) == 9 and ranked[-1].kind == "coordinator"


def test_a_beat_without_address_or_layers_withdraws_the_node() -> None:
    book = PieceBook()
    book.beat("a", "10.0.0.1:7000", (0, 4))
    book.beat("b", "10.0.0.2:7000", (0, 4))
    book.beat("a", "", (0, 4))
    book.beat("b", "10.0.0.2:7000", (0, 0))
    assert book.holders() == []


class _Manifest:
    """Pieces by layer: blk.NNN for each layer, `embedding` for the first and last."""

    def __init__(self, n_layer: int) -> None:
        self.n_layer = n_layer

    def pieces_for(self, layers: LayerRange) -> list[PieceInfo]:
        if layers.stop > self.n_layer:
            raise ValueError("past the model")
        names = [f"blk.{i:03d}" for i in layers]
        if layers.start == 0 or layers.stop == self.n_layer:
            names.insert(0, "embedding")
        return [PieceInfo(n, f"{n}.gguf", "block", None, "0" * 64, 1) for n in names]


def test_holders_hold_the_piece_for_their_own_stage_only() -> None:
    manifest = cast(Manifest, _Manifest(8))
    said = [
        Holder("first", "10.0.0.1:7000", (0, 4)),
        Holder("last", "10.0.0.2:7000", (4, 8)),
        Holder("spare", "10.0.0.3:7000", (4, 8)),
        Holder("liar", "10.0.0.4:7000", (4, 8)),  # placed on (0, 4): its claim is not
        Holder("silent", "10.0.0.5:7000", (4, 8)),  # not healthy
        Holder("past", "10.0.0.6:7000", (4, 12)),
    ]
    stages = {
        "first": [(0, 4)],
        "last": [(4, 8)],
        "spare": [(4, 8)],
        "liar": [(0, 4)],
        "silent": [(4, 8)],
        "past": [(4, 12)],
    }
    healthy = {"first", "last", "spare", "liar", "past"}
    got = holders_of("blk.005.gguf", manifest, said, stages, healthy)
    assert [h.node_id for h in got] == ["last", "spare"]
    both = holders_of("embedding.gguf", manifest, said, stages, healthy)
    assert [h.node_id for h in both] == ["first", "last", "spare"]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, 100),
        ("bytes=0-", 100),
        ("bytes=10-19", 10),
        ("bytes=90-200", 10),
        ("bytes=-30", 30),
        ("bytes=0-1,5-6", 100),
        ("items=0-1", 100),
        ("bytes=x-y", 100),
    ],
)
def test_the_bytes_a_range_request_is_answered_with(header: str | None, expected: int) -> None:
    assert asked_bytes(header, 100) == expected
