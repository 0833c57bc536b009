"""Which nodes form the chain and in what order: the feasible sequence with the shortest
sum of RTTs between consecutive stages (exhaustive for small chains, else nearest-
neighbour starts improved by local search), and a feasible order for a fixed set."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise, permutations

from coordinator.server.placement.costs import EPS, Costs, RttLookup, advance, bits, fits_in_order
from coordinator.server.placement.model import NodeInfo

EXACT_MAX_STAGES = 8
"""Chains up to this long are ordered by trying every sequence (if there are few enough)."""
EXACT_MAX_SEQUENCES = 20_000
EXACT_MAX_STATES = 1_024
"""Cap on the multiset search that decides whether a set of nodes fits in some order."""
SEARCH_STARTS = 3
"""Nearest-neighbour starts that the local search improves, for long chains."""
SEARCH_MAX_ROUNDS = 50


def _canonical(nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    """Node_id order, but the biggest node last (head, embedding, MTP layer) and the next
    biggest first (embedding): what fits best when layers are alike."""
    rest = sorted(nodes, key=lambda n: n.node_id)
    if len(rest) < 2:
        return rest
    last = max(rest, key=lambda n: (n.capacity_bytes, n.node_id))
    rest.remove(last)
    first = min(rest, key=lambda n: (-n.capacity_bytes, n.node_id))
    rest.remove(first)
    return [first, *rest, last]


def feasible_order(
    costs: Costs, nodes: Sequence[NodeInfo], lo: int, hi: int
) -> tuple[NodeInfo, ...] | None:
    """Some order of exactly these nodes that covers [lo, hi), or None.

    Exact when the multiset search is small (nodes of equal capacity are interchangeable,
    so real fleets with few distinct sizes stay small); otherwise tries orders that put
    each distinct size last (the last stage carries the most extras)."""
    canon = _canonical(nodes)
    if fits_in_order(costs, [n.capacity_bytes for n in canon], lo, hi):
        return tuple(canon)
    sizes = sorted({n.capacity_bytes for n in nodes}, reverse=True)
    counts = [sum(1 for n in nodes if n.capacity_bytes == c) for c in sizes]
    if math.prod(c + 1 for c in counts) <= EXACT_MAX_STATES:
        caps = _multiset_order(costs, sizes, counts, lo, hi)
        if caps is None:
            return None
        pool = {
            c: sorted((n for n in nodes if n.capacity_bytes == c), key=lambda n: n.node_id)
            for c in sizes
        }
        return tuple(pool[c].pop(0) for c in caps)
    for c in sizes:
        last = next(n for n in reversed(canon) if n.capacity_bytes == c)
        order = [n for n in canon if n is not last] + [last]
        if fits_in_order(costs, [n.capacity_bytes for n in order], lo, hi):
            return tuple(order)
    return None


def _multiset_order(
    costs: Costs, sizes: Sequence[int], counts: Sequence[int], lo: int, hi: int
) -> list[int] | None:
    """Exact search over which size serves each position; states are 'how many of each
    size used so far', each with the set of layers the chain can have reached."""
    k = sum(counts)
    if hi - lo < k:
        return None
    levels: list[dict[tuple[int, ...], int]] = [{(0,) * len(sizes): 1 << lo}]
    for t in range(k - 1):
        limit = hi - (k - 1 - t)
        nxt: dict[tuple[int, ...], int] = {}
        for used, reach in levels[-1].items():
            for c, size in enumerate(sizes):
                if used[c] < counts[c] and (out := advance(costs, reach, size, limit, hi)):
                    key = (*used[:c], used[c] + 1, *used[c + 1 :])
                    nxt[key] = nxt.get(key, 0) | out
        levels.append(nxt)
    full = tuple(counts)
    # Walk back from "everything used, layer hi reached", picking any valid predecessor:
    # every recorded position is reachable, so the walk never dead-ends.
    order: list[int] = []
    used, target = full, hi
    for t in range(k - 1, -1, -1):
        limit = hi - (k - 1 - t)
        step = _predecessor(costs, levels[t], used, sizes, target, limit, last=t == k - 1)
        if step is None:
            return None
        c, a = step
        order.append(sizes[c])
        used, target = (*used[:c], used[c] - 1, *used[c + 1 :]), a
    order.reverse()
    return order


def _predecessor(
    costs: Costs,
    level: Mapping[tuple[int, ...], int],
    used: tuple[int, ...],
    sizes: Sequence[int],
    target: int,
    limit: int,
    *,
    last: bool,
) -> tuple[int, int] | None:
    for c, size in enumerate(sizes):
        if used[c] == 0:
            continue
        reach = level.get((*used[:c], used[c] - 1, *used[c + 1 :]), 0)
        for a in bits(reach):
            if a >= target:
                break
            ok = costs.need(a, target) <= size if last else costs.furthest(a, size, limit) >= target
            if ok:
                return c, a
    return None


def path_ms(seq: Sequence[str], rtt: RttLookup, before: str | None, after: str | None) -> float:
    ids = [*([before] if before else []), *seq, *([after] if after else [])]
    return sum(rtt(a, b) for a, b in pairwise(ids))


def best_sequence(
    costs: Costs,
    candidates: Sequence[NodeInfo],
    k: int,
    lo: int,
    hi: int,
    rtt: RttLookup,
    before: str | None = None,
    after: str | None = None,
) -> tuple[NodeInfo, ...] | None:
    """The k candidates, in order, that cover [lo, hi) with the shortest RTT path
    (`before`/`after`: fixed neighbours when refilling a gap), or None if none fit."""
    cands = sorted(candidates, key=lambda n: n.node_id)
    if k < 1 or k > len(cands):
        return None
    fits_cache: dict[tuple[int, ...], bool] = {}

    def fits(seq: Sequence[NodeInfo]) -> bool:
        caps = tuple(n.capacity_bytes for n in seq)
        if caps not in fits_cache:
            fits_cache[caps] = fits_in_order(costs, caps, lo, hi)
        return fits_cache[caps]

    def key(seq: Sequence[NodeInfo]) -> tuple[float, int, int, tuple[str, ...]]:
        # Ties (e.g. nothing measured): the bigger node at the end, then node_id order.
        ids = tuple(n.node_id for n in seq)
        ms = round(path_ms(ids, rtt, before, after), 6)
        return ms, -seq[-1].capacity_bytes, -seq[0].capacity_bytes, ids

    if k <= EXACT_MAX_STAGES and math.perm(len(cands), k) <= EXACT_MAX_SEQUENCES:
        for seq in sorted(permutations(cands, k), key=key):
            if fits(seq):
                return seq
        return None

    top = sorted(cands, key=lambda n: (-n.capacity_bytes, n.node_id))[:k]
    base = feasible_order(costs, top, lo, hi)
    anchors = [x for x in (before, after) if x]
    if base is None or not rtt.measured_among([*(n.node_id for n in cands), *anchors]):
        return base
    starts = [base, *(s for s in _nearest_neighbour_orders(top, rtt, before) if fits(s))]
    starts = sorted(set(starts), key=key)[:SEARCH_STARTS]
    improved = [_local_search(s, cands, fits, key) for s in starts]
    return min(improved, key=key)


def _nearest_neighbour_orders(
    nodes: Sequence[NodeInfo], rtt: RttLookup, before: str | None
) -> list[tuple[NodeInfo, ...]]:
    by_id = sorted(nodes, key=lambda n: n.node_id)
    # With a fixed neighbour before the gap, start next to it; else try every start.
    heads = [min(by_id, key=lambda n: (rtt(before, n.node_id), n.node_id))] if before else by_id
    orders = []
    for head in heads:
        order, left = [head], [n for n in by_id if n is not head]
        while left:
            here = order[-1].node_id
            nearest = min(left, key=lambda n: (rtt(here, n.node_id), n.node_id))
            order.append(nearest)
            left.remove(nearest)
        orders.append(tuple(order))
    return orders


def _local_search(
    seq: tuple[NodeInfo, ...],
    candidates: Sequence[NodeInfo],
    fits: Callable[[Sequence[NodeInfo]], bool],
    key: Callable[[Sequence[NodeInfo]], tuple[float, int, int, tuple[str, ...]]],
) -> tuple[NodeInfo, ...]:
    """First-improvement search over 2-opt reversals, single relocations and swaps with
    nodes outside the chain; only feasible sequences are accepted."""
    best, best_key = seq, key(seq)
    for _ in range(SEARCH_MAX_ROUNDS):
        found = False
        for cand in _neighbours(best, candidates):
            k = key(cand)
            if k[0] < best_key[0] - EPS and fits(cand):
                best, best_key, found = cand, k, True
                break
        if not found:
            break
    return best


def _neighbours(
    seq: tuple[NodeInfo, ...], candidates: Sequence[NodeInfo]
) -> Iterable[tuple[NodeInfo, ...]]:
    k = len(seq)
    for i in range(k - 1):
        for j in range(i + 1, k):
            yield seq[:i] + seq[i : j + 1][::-1] + seq[j + 1 :]
    for i in range(k):
        rest = seq[:i] + seq[i + 1 :]
        for j in range(k):
            if j != i:
                yield (*rest[:j], seq[i], *rest[j:])
    inside = {n.node_id for n in seq}
    for o in candidates:
        if o.node_id not in inside:
            for i in range(k):
                yield (*seq[:i], o, *seq[i + 1 :])
