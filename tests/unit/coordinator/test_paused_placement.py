"""What placement may put on a node: never more than the volunteer's VRAM cap."""

from __future__ import annotations

from coordinator.server.service import placement_capacity
from coordinator.server.store import Node

GIB = 1024**3


def node(capacity: int, cap: int) -> Node:
    return Node(
        node_id="w", role="worker", token_hash="x", capacity_bytes=capacity, vram_cap_bytes=cap
    )


def test_the_offer_is_held_to_the_cap_and_no_cap_means_the_offer() -> None:
    assert placement_capacity(node(24 * GIB, 8 * GIB)) == 8 * GIB  # over-reporting worker
    assert placement_capacity(node(6 * GIB, 8 * GIB)) == 6 * GIB  # less free than the cap
    assert placement_capacity(node(24 * GIB, 0)) == 24 * GIB
    assert placement_capacity(node(-5, 0)) == 0
