"""Where to cut a chosen sequence of nodes: fastest slowest stage first, then the most
headroom on the fullest node, each a minimax over cut points by dynamic programming."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from coordinator.errors import PlacementError
from coordinator.server.placement.costs import EPS, Costs
from coordinator.server.placement.model import NodeInfo

_StageCost = Callable[[int, int, int], float | None]


def _minimax(k: int, lo: int, hi: int, cost: _StageCost) -> tuple[float, list[int]] | None:
    """Cuts lo = c0 < c1 < ... < ck = hi minimising max_i cost(i, c_i, c_i+1) (None: not
    allowed), by dynamic programming over (stage, cut); ties keep the earlier cut."""
    prev: dict[int, float] = {lo: 0.0}
    back: list[dict[int, int]] = []
    for i in range(k):
        ends = [hi] if i == k - 1 else range(lo + i + 1, hi - (k - 1 - i) + 1)
        cur: dict[int, float] = {}
        arg: dict[int, int] = {}
        starts = sorted(prev)
        for b in ends:
            for a in starts:
                if a >= b:
                    break
                c = cost(i, a, b)
                if c is None:
                    continue
                v = max(prev[a], c)
                if b not in cur or v < cur[b] - EPS:
                    cur[b], arg[b] = v, a
        back.append(arg)
        prev = cur
    if hi not in prev:
        return None
    cuts = [hi]
    for arg in reversed(back):
        cuts.append(arg[cuts[-1]])
    cuts.reverse()
    return prev[hi], cuts


def split(costs: Costs, seq: Sequence[NodeInfo], lo: int, hi: int) -> list[int]:
    """Cut points for `seq` over [lo, hi): fastest slowest-stage first, then most headroom."""
    k = len(seq)

    def compute(i: int, a: int, b: int) -> float | None:
        if not costs.allows(b) or costs.need(a, b) > seq[i].capacity_bytes:
            return None
        return (b - a) / seq[i].compute_speed

    found = _minimax(k, lo, hi, compute)
    if found is None:  # callers only split sequences that fit
        raise PlacementError("internal: no split for a sequence that fits")
    slowest = found[0]

    def fullness(i: int, a: int, b: int) -> float | None:
        t = compute(i, a, b)
        if t is None or t > slowest * (1 + EPS) + EPS:
            return None
        return costs.need(a, b) / seq[i].capacity_bytes

    balanced = _minimax(k, lo, hi, fullness)
    return (balanced or found)[1]
