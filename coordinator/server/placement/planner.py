"""Placement: which node serves which layers, as one pure function (DESIGN §7).

`plan(model, nodes, ...)` returns a chain of stages that covers every layer exactly once,
each stage fitting its node's memory (weights, KV cache for the planned sessions, a fixed
per-process overhead), with as few hops as possible, ordered to keep the token's trip
short, some healthy nodes kept out as spares, and a re-plan that moves as few nodes as it
can. Like Petals' block_selection it reads no clock, network or database: the caller
measures and passes the facts in, so every decision can be replayed in a test.

How, in order:
1. The chain length k is the smallest that fits (fewer hops = faster token), and at least
   `min_stages`. The k largest nodes fit iff any k nodes fit (swap a node for a larger
   one and every stage still fits), so only they are tested.
2. Which k nodes and in what order: the feasible sequence with the shortest sum of RTTs
   between consecutive stages, by exhaustive search for small chains, else nearest-
   neighbour starts improved by 2-opt, relocation and swaps with nodes outside the chain.
3. Where to cut: any layer boundary the model allows (`ModelSpec.allowed_cuts`: some
   architectures are exact only at some boundaries). First make the slowest stage as
   fast as possible (layers / compute_speed: the busiest stage bounds throughput), then,
   among those splits, make the fullest node as empty as possible (headroom for more
   sessions).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise, permutations
from types import MappingProxyType

from coordinator.errors import MemoryShortfall, NotEnoughMemory, PlacementError
from core.types import LayerRange, ModelFacts

MIB = 1 << 20
PROCESS_OVERHEAD_BYTES = 300 * MIB
"""Per worker process beyond weights and KV: CUDA context, compute buffers, runtime."""
DEFAULT_RTT_MS = 20.0
"""Assumed for a pair of nodes nobody has measured yet."""
DEFAULT_COMPUTE_MS_PER_LAYER = 0.4
"""Seeds: 21-23 ms of GPU time per token for 60 layers on 16 GB consumer cards."""
EXACT_MAX_STAGES = 8
"""Chains up to this long are ordered by trying every sequence (if there are few enough)."""
EXACT_MAX_SEQUENCES = 20_000
EXACT_MAX_STATES = 1_024
"""Cap on the multiset search that decides whether a set of nodes fits in some order."""
SEARCH_STARTS = 3
"""Nearest-neighbour starts that the local search improves, for long chains."""
SEARCH_MAX_ROUNDS = 50

_NO_RTT: Mapping[tuple[str, str], float] = MappingProxyType({})
_EPS = 1e-9


@dataclass(frozen=True)
class ModelSpec:
    """Sizes placement needs, per layer; bytes are what a stage loads into its memory."""

    n_layer: int
    bytes_per_layer: tuple[int, ...]
    kv_bytes_per_token_per_layer: tuple[int, ...]
    """K+V bytes one cached position costs in each layer (0 for recurrent layers)."""
    embedding_bytes: int
    head_bytes: int
    tied_output: bool = False
    """Informational: the last stage always loads the embedding too (see `stage_weight_bytes`)."""
    draft_bytes: int = 0
    """Extra weights the last stage holds, e.g. Qwen3.5's MTP draft layer (~5.7 GB)."""
    compute_ms_per_layer: float = DEFAULT_COMPUTE_MS_PER_LAYER
    """Estimated GPU time of one layer for one token on a node of compute_speed 1.0."""
    allowed_cuts: tuple[int, ...] | None = None
    """Boundaries a stage may start or end at (0 and n_layer included), from the manifest;
    None: every boundary."""

    def __post_init__(self) -> None:
        if self.n_layer < 1:
            raise ValueError("a model has at least one layer")
        if len(self.bytes_per_layer) != self.n_layer:
            raise ValueError(f"bytes_per_layer has {len(self.bytes_per_layer)} entries")
        if len(self.kv_bytes_per_token_per_layer) != self.n_layer:
            raise ValueError(
                f"kv_bytes_per_token_per_layer has {len(self.kv_bytes_per_token_per_layer)} entries"
            )
        sizes = (*self.bytes_per_layer, *self.kv_bytes_per_token_per_layer)
        if min(sizes) < 0 or min(self.embedding_bytes, self.head_bytes, self.draft_bytes) < 0:
            raise ValueError("sizes must be >= 0")
        if not (math.isfinite(self.compute_ms_per_layer) and self.compute_ms_per_layer >= 0):
            raise ValueError("compute_ms_per_layer must be finite and >= 0")
        cuts = self.allowed_cuts
        if cuts is not None and (
            not cuts
            or cuts[0] != 0
            or cuts[-1] != self.n_layer
            or any(b <= a for a, b in pairwise(cuts))
        ):
            raise ValueError("allowed_cuts must increase strictly from 0 to n_layer")

    @property
    def cut_points(self) -> tuple[int, ...]:
        """Every boundary a stage may start or end at, 0 and n_layer included."""
        return self.allowed_cuts or tuple(range(self.n_layer + 1))

    @classmethod
    def from_facts(
        cls,
        facts: ModelFacts,
        draft_bytes: int = 0,
        compute_ms_per_layer: float = DEFAULT_COMPUTE_MS_PER_LAYER,
    ) -> ModelSpec:
        return cls(
            n_layer=facts.n_layer,
            bytes_per_layer=tuple(facts.bytes_per_layer),
            kv_bytes_per_token_per_layer=tuple(facts.kv_bytes_per_token_per_layer),
            embedding_bytes=facts.embedding_bytes,
            head_bytes=facts.head_bytes,
            tied_output=facts.tied_output,
            draft_bytes=draft_bytes,
            compute_ms_per_layer=compute_ms_per_layer,
            allowed_cuts=facts.allowed_cuts,
        )

    def stage_weight_bytes(self, layers: LayerRange) -> int:
        """Blocks, plus the embedding on the first stage, plus head, embedding and draft on
        the last (embedding once if one stage is both). The last stage loads token_embd
        too, as `Manifest.pieces_for` ships it: tied heads use it, the draft layer embeds
        its guesses, and llama.cpp sizes the vocabulary from it."""
        total = sum(self.bytes_per_layer[layers.start : layers.stop])
        if layers.start == 0:
            total += self.embedding_bytes
        if layers.stop == self.n_layer:
            total += self.head_bytes + self.draft_bytes
            total += 0 if layers.start == 0 else self.embedding_bytes
        return total

    def stage_bytes(self, layers: LayerRange, sessions: int, context_tokens: int) -> int:
        """Memory a stage needs: weights + KV for `sessions` x `context_tokens` + overhead."""
        per_token = sum(self.kv_bytes_per_token_per_layer[layers.start : layers.stop])
        kv = sessions * context_tokens * per_token
        return self.stage_weight_bytes(layers) + kv + PROCESS_OVERHEAD_BYTES


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    capacity_bytes: int
    """min(the volunteer's VRAM cap, free VRAM): the caller decides, placement trusts it."""
    healthy: bool = True
    address: str = ""
    compute_speed: float = 1.0
    """Relative to the reference GPU behind `ModelSpec.compute_ms_per_layer`."""

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("node_id must not be empty")
        if self.capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        if not (math.isfinite(self.compute_speed) and self.compute_speed > 0):
            raise ValueError("compute_speed must be finite and > 0")


@dataclass(frozen=True)
class StageAssignment:
    node_id: str
    layers: LayerRange
    bytes_needed: int
    capacity_bytes: int

    @property
    def fits(self) -> bool:
        return self.bytes_needed <= self.capacity_bytes


@dataclass(frozen=True)
class Plan:
    stages: tuple[StageAssignment, ...]
    """In token order: stages[0] holds layer 0."""
    spares: tuple[str, ...]
    """Healthy nodes outside the chain, by node_id."""
    estimated_trip_ms: float
    """Compute of every stage plus the RTTs between consecutive stages (client hops not
    included: the client's position is not an input)."""
    moves: int
    """Healthy nodes whose assignment (layers or none) differs from the previous plan."""

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a plan has at least one stage")
        if self.stages[0].layers.start != 0:
            raise ValueError("the first stage must start at layer 0")
        for s, t in pairwise(self.stages):
            if t.layers.start != s.layers.stop:
                raise ValueError(f"stages {s.layers} and {t.layers} are not contiguous")
        ids = [s.node_id for s in self.stages]
        if len(set(ids)) != len(ids) or len(set(self.spares)) != len(self.spares):
            raise ValueError("a node appears twice in the plan")
        if set(ids) & set(self.spares):
            raise ValueError("a spare is also in the chain")
        if self.moves < 0:
            raise ValueError("moves must be >= 0")

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(s.node_id for s in self.stages)

    def _position(self, node_id: str) -> int | None:
        return next((i for i, s in enumerate(self.stages) if s.node_id == node_id), None)

    def stage_of(self, node_id: str) -> StageAssignment | None:
        """The node's stage, or None for a spare or unknown node."""
        i = self._position(node_id)
        return None if i is None else self.stages[i]

    def next_hop(self, node_id: str) -> StageAssignment | None:
        """The stage after `node_id`'s (where it sends its hidden states); None for the last
        stage or a node outside the chain."""
        i = self._position(node_id)
        return None if i is None or i + 1 == len(self.stages) else self.stages[i + 1]

    def covers(self, n_layer: int) -> bool:
        """Every layer of an `n_layer` model exactly once (stages are contiguous by
        construction, so the ends decide)."""
        return self.stages[0].layers.start == 0 and self.stages[-1].layers.stop == n_layer


# ---------------------------------------------------------------------------- internals


@dataclass(frozen=True)
class _Costs:
    """Memory of any candidate stage [a, b) in O(1), from prefix sums."""

    model: ModelSpec
    prefix: tuple[int, ...]
    """prefix[i]: weights + KV of layers [0, i), so a middle stage is a difference."""
    cuts: tuple[int, ...]
    """Allowed boundaries, increasing; `cut_mask` has bit p set for each."""
    cut_mask: int
    _ends: dict[tuple[int, int], tuple[int, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )
    """Memo for `ends`; lives only as long as one plan() call."""

    @staticmethod
    def of(model: ModelSpec, sessions: int, context_tokens: int) -> _Costs:
        per = sessions * context_tokens
        prefix = [0]
        for w, kv in zip(model.bytes_per_layer, model.kv_bytes_per_token_per_layer, strict=True):
            prefix.append(prefix[-1] + w + per * kv)
        cuts = model.cut_points
        return _Costs(model, tuple(prefix), cuts, sum(1 << c for c in cuts))

    def allows(self, position: int) -> bool:
        return bool(self.cut_mask >> position & 1)

    @property
    def units(self) -> int:
        """The most stages a chain can have: one per span between allowed cuts."""
        return len(self.cuts) - 1

    @property
    def n_layer(self) -> int:
        return self.model.n_layer

    def need(self, a: int, b: int) -> int:
        m = self.model
        total = self.prefix[b] - self.prefix[a] + PROCESS_OVERHEAD_BYTES
        if a == 0:
            total += m.embedding_bytes
        if b == m.n_layer:
            total += m.head_bytes + m.draft_bytes + (0 if a == 0 else m.embedding_bytes)
        return total

    def furthest(self, a: int, cap: int, limit: int) -> int:
        """Largest b in (a, limit] with need(a, b) <= cap, or a when not even one layer fits."""
        if limit == self.n_layer and self.need(a, limit) <= cap:
            return limit
        # Below the last layer need() is prefix[b] plus constants: binary search.
        room = cap - PROCESS_OVERHEAD_BYTES - (self.model.embedding_bytes if a == 0 else 0)
        b = bisect_right(self.prefix, self.prefix[a] + room) - 1
        b = max(a, min(b, limit, self.n_layer - 1))
        # Down to the nearest boundary the model allows (a itself when none is left).
        return max(a, self.cuts[bisect_right(self.cuts, b) - 1])

    def ends(self, cap: int, hi: int) -> tuple[int, ...]:
        """ends[a]: furthest(a, cap, hi - 1) for every a < hi, i.e. where a stage that is
        not the last of [.., hi) can end; the searches ask this thousands of times."""
        table = self._ends.get((cap, hi))
        if table is None:
            table = tuple(self.furthest(a, cap, hi - 1) if a < hi - 1 else a for a in range(hi))
            self._ends[(cap, hi)] = table
        return table


@dataclass(frozen=True)
class _Rtt:
    table: Mapping[tuple[str, str], float]

    def __call__(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        x, y = self.table.get((a, b)), self.table.get((b, a))
        if x is None:
            return DEFAULT_RTT_MS if y is None else y
        return x if y is None else (x + y) / 2  # measured both ways: average them

    def measured_among(self, ids: Iterable[str]) -> bool:
        s = set(ids)
        return any(a in s and b in s and a != b for a, b in self.table)


def _fits_in_order(costs: _Costs, caps: Sequence[int], lo: int, hi: int) -> bool:
    """Whether nodes of these capacities, in this order, can cover [lo, hi) at some cuts."""
    k = len(caps)
    if k == 0 or hi - lo < k:
        return False
    reach = 1 << lo  # bit p set: the previous stages can end exactly at layer p
    for i, cap in enumerate(caps[:-1]):
        limit = hi - (k - 1 - i)  # leave at least one layer for every later node
        reach = _advance(costs, reach, cap, limit, hi)
        if not reach:
            return False
    return any(costs.need(a, hi) <= caps[-1] for a in _bits(reach))


def _advance(costs: _Costs, reach: int, cap: int, limit: int, hi: int) -> int:
    """Where one more node of capacity `cap` can end, from every position in `reach`."""
    ends = costs.ends(cap, hi)
    out = 0
    for a in _bits(reach):
        b = min(ends[a], limit)
        if b > a:
            out |= ((1 << (b - a)) - 1) << (a + 1)
    return out & costs.cut_mask


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _canonical(nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    """Node_id order, but the biggest node last (head, embedding, draft) and the next
    biggest first (embedding): what fits best when layers are alike."""
    rest = sorted(nodes, key=lambda n: n.node_id)
    if len(rest) < 2:
        return rest
    last = max(rest, key=lambda n: (n.capacity_bytes, n.node_id))
    rest.remove(last)
    first = min(rest, key=lambda n: (-n.capacity_bytes, n.node_id))
    rest.remove(first)
    return [first, *rest, last]


def _feasible_order(
    costs: _Costs, nodes: Sequence[NodeInfo], lo: int, hi: int
) -> tuple[NodeInfo, ...] | None:
    """Some order of exactly these nodes that covers [lo, hi), or None.

    Exact when the multiset search is small (nodes of equal capacity are interchangeable,
    so real fleets with few distinct sizes stay small); otherwise tries orders that put
    each distinct size last (the last stage carries the most extras)."""
    canon = _canonical(nodes)
    if _fits_in_order(costs, [n.capacity_bytes for n in canon], lo, hi):
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
        if _fits_in_order(costs, [n.capacity_bytes for n in order], lo, hi):
            return tuple(order)
    return None


def _multiset_order(
    costs: _Costs, sizes: Sequence[int], counts: Sequence[int], lo: int, hi: int
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
                if used[c] < counts[c] and (out := _advance(costs, reach, size, limit, hi)):
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
    costs: _Costs,
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
        for a in _bits(reach):
            if a >= target:
                break
            ok = costs.need(a, target) <= size if last else costs.furthest(a, size, limit) >= target
            if ok:
                return c, a
    return None


def _path_ms(seq: Sequence[str], rtt: _Rtt, before: str | None, after: str | None) -> float:
    ids = [*([before] if before else []), *seq, *([after] if after else [])]
    return sum(rtt(a, b) for a, b in pairwise(ids))


def _best_sequence(
    costs: _Costs,
    candidates: Sequence[NodeInfo],
    k: int,
    lo: int,
    hi: int,
    rtt: _Rtt,
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
            fits_cache[caps] = _fits_in_order(costs, caps, lo, hi)
        return fits_cache[caps]

    def key(seq: Sequence[NodeInfo]) -> tuple[float, int, int, tuple[str, ...]]:
        # Ties (e.g. nothing measured): the bigger node at the end, then node_id order.
        ids = tuple(n.node_id for n in seq)
        ms = round(_path_ms(ids, rtt, before, after), 6)
        return ms, -seq[-1].capacity_bytes, -seq[0].capacity_bytes, ids

    if k <= EXACT_MAX_STAGES and math.perm(len(cands), k) <= EXACT_MAX_SEQUENCES:
        for seq in sorted(permutations(cands, k), key=key):
            if fits(seq):
                return seq
        return None

    top = sorted(cands, key=lambda n: (-n.capacity_bytes, n.node_id))[:k]
    base = _feasible_order(costs, top, lo, hi)
    anchors = [x for x in (before, after) if x]
    if base is None or not rtt.measured_among([*(n.node_id for n in cands), *anchors]):
        return base
    starts = [base, *(s for s in _nearest_neighbour_orders(top, rtt, before) if fits(s))]
    starts = sorted(set(starts), key=key)[:SEARCH_STARTS]
    improved = [_local_search(s, cands, fits, key) for s in starts]
    return min(improved, key=key)


def _nearest_neighbour_orders(
    nodes: Sequence[NodeInfo], rtt: _Rtt, before: str | None
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
            if k[0] < best_key[0] - _EPS and fits(cand):
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
                if b not in cur or v < cur[b] - _EPS:
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


def _split(costs: _Costs, seq: Sequence[NodeInfo], lo: int, hi: int) -> list[int]:
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
        if t is None or t > slowest * (1 + _EPS) + _EPS:
            return None
        return costs.need(a, b) / seq[i].capacity_bytes

    balanced = _minimax(k, lo, hi, fullness)
    return (balanced or found)[1]


def _least_total(costs: _Costs, stages: int) -> int:
    """What any chain of `stages` stages needs in total: all blocks and KV, the embedding,
    head and draft once, the embedding again on the last stage, one overhead per stage."""
    m = costs.model
    total = costs.prefix[m.n_layer] + m.embedding_bytes + m.head_bytes + m.draft_bytes
    return total + (m.embedding_bytes if stages > 1 else 0) + stages * PROCESS_OVERHEAD_BYTES


def _shortfall(costs: _Costs, healthy: Sequence[NodeInfo], min_stages: int) -> MemoryShortfall:
    n = costs.n_layer
    largest_node = max((h.capacity_bytes for h in healthy), default=0)
    stages = max(min_stages, 1, 2 if costs.need(0, n) > largest_node else 1)
    # need(a, b) between neighbouring allowed cuts is the least any stage holding those
    # layers can need: larger stages only add.
    piece, layer = max((costs.need(a, b), a) for a, b in pairwise(costs.cuts))
    return MemoryShortfall(
        needed_bytes=_least_total(costs, stages),
        available_bytes=sum(h.capacity_bytes for h in healthy),
        largest_piece_bytes=piece,
        largest_piece_layer=layer,
        largest_node_bytes=largest_node,
        healthy_nodes=len(healthy),
    )


def _assemble(
    costs: _Costs,
    chain: Sequence[tuple[NodeInfo, LayerRange]],
    healthy: Sequence[NodeInfo],
    rtt: _Rtt,
    previous: Plan | None,
) -> Plan:
    stages = tuple(
        StageAssignment(n.node_id, r, costs.need(r.start, r.stop), n.capacity_bytes)
        for n, r in chain
    )
    in_chain = {s.node_id for s in stages}
    ms_per_layer = costs.model.compute_ms_per_layer
    compute = sum(len(r) * ms_per_layer / n.compute_speed for n, r in chain)
    trip = compute + _path_ms([s.node_id for s in stages], rtt, None, None)
    old = {} if previous is None else {s.node_id: s.layers for s in previous.stages}
    new = {s.node_id: s.layers for s in stages}
    moves = sum(1 for h in healthy if old.get(h.node_id) != new.get(h.node_id))
    return Plan(
        stages=stages,
        spares=tuple(sorted(h.node_id for h in healthy if h.node_id not in in_chain)),
        estimated_trip_ms=trip,
        moves=moves,
    )


def _keep_or_repair(
    costs: _Costs,
    previous: Plan,
    healthy: Sequence[NodeInfo],
    rtt: _Rtt,
    min_stages: int,
) -> Plan | None:
    """The previous chain where it still works, gaps refilled with as few nodes as possible
    from outside the kept chain; None when that is not possible."""
    if not previous.covers(costs.n_layer):
        return None
    if any(not costs.allows(s.layers.stop) for s in previous.stages):
        return None  # cut where this model is not exact: plan afresh
    by_id = {h.node_id: h for h in healthy}
    broken = [
        i
        for i, s in enumerate(previous.stages)
        if (node := by_id.get(s.node_id)) is None
        or costs.need(s.layers.start, s.layers.stop) > node.capacity_bytes
    ]
    kept = {s.node_id for i, s in enumerate(previous.stages) if i not in broken}
    pool = [h for h in healthy if h.node_id not in kept]
    chain: list[tuple[NodeInfo, LayerRange]] = []
    i, stages = 0, previous.stages
    while i < len(stages):
        if i not in broken:
            chain.append((by_id[stages[i].node_id], stages[i].layers))
            i += 1
            continue
        j = i
        while j + 1 < len(stages) and j + 1 in broken:
            j += 1
        lo, hi = stages[i].layers.start, stages[j].layers.stop
        before = stages[i - 1].node_id if i > 0 else None
        after = stages[j + 1].node_id if j + 1 < len(stages) else None
        seq = None
        for m in range(1, min(len(pool), hi - lo) + 1):  # fewest newcomers = fewest moves
            if (seq := _best_sequence(costs, pool, m, lo, hi, rtt, before, after)) is not None:
                break
        if seq is None:
            return None
        cuts = _split(costs, seq, lo, hi)
        chain.extend((n, LayerRange(a, b)) for n, (a, b) in zip(seq, pairwise(cuts), strict=True))
        used = {n.node_id for n in seq}
        pool = [p for p in pool if p.node_id not in used]
        i = j + 1
    if len(chain) < min_stages:
        return None
    return _assemble(costs, chain, healthy, rtt, previous)


def _fresh(
    costs: _Costs,
    healthy: Sequence[NodeInfo],
    rtt: _Rtt,
    previous: Plan | None,
    spares: int,
    min_stages: int,
) -> Plan:
    n = costs.n_layer
    largest_first = sorted(healthy, key=lambda h: (-h.capacity_bytes, h.node_id))
    most = min(len(healthy), costs.units)

    def fits(k: int) -> bool:
        top = largest_first[:k]
        enough = sum(h.capacity_bytes for h in top) >= _least_total(costs, k)  # cheap test first
        return enough and _feasible_order(costs, top, 0, n) is not None

    k = next((k for k in range(min_stages, most + 1) if fits(k)), None)
    if k is None:
        raise NotEnoughMemory(_shortfall(costs, healthy, min_stages))
    if len(healthy) - k < spares:
        # Too few nodes to keep the spares anyway: spread over all that fit instead.
        k = next((j for j in range(most, k, -1) if fits(j)), k)
    seq = _best_sequence(costs, healthy, k, 0, n, rtt)
    if seq is None:  # the k largest fit, and they are among the candidates
        raise PlacementError("internal: no sequence found for a chain length that fits")
    cuts = _split(costs, seq, 0, n)
    chain = [(node, LayerRange(a, b)) for node, (a, b) in zip(seq, pairwise(cuts), strict=True)]
    return _assemble(costs, chain, healthy, rtt, previous)


def plan(
    model: ModelSpec,
    nodes: Sequence[NodeInfo],
    *,
    rtt_ms: Mapping[tuple[str, str], float] = _NO_RTT,
    previous: Plan | None = None,
    sessions_per_stage: int = 8,
    context_tokens: int = 4096,
    spares: int = 1,
    min_stages: int = 1,
) -> Plan:
    """A chain of stages for `model` on the healthy `nodes` (see the module docstring).

    `rtt_ms` holds measured round trips, either direction of a pair; unmeasured pairs
    count DEFAULT_RTT_MS. With `previous`, the old chain is kept as is when all its nodes
    are healthy and still fit (moves=0), else its gaps are refilled from outside the
    chain, else a fresh plan is made. `spares` nodes stay out of the chain when the
    fleet allows; when it does not, every node that can take a stage joins the chain.

    Raises NotEnoughMemory when the healthy nodes cannot hold the model (with numbers),
    PlacementError when `min_stages` asks for more stages than layers or healthy nodes.
    """
    if sessions_per_stage < 0 or context_tokens < 0 or spares < 0 or min_stages < 1:
        raise ValueError("sessions, context and spares must be >= 0, min_stages >= 1")
    if any(not (math.isfinite(v) and v >= 0) for v in rtt_ms.values()):
        raise ValueError("RTTs must be finite and >= 0")
    ids = [n.node_id for n in nodes]
    if len(set(ids)) != len(ids):
        raise PlacementError("two nodes share a node_id")
    if min_stages > len(model.cut_points) - 1:
        raise PlacementError(
            f"min_stages={min_stages} exceeds the {len(model.cut_points) - 1} stages "
            f"the model's {model.n_layer} layers can be cut into"
        )
    healthy = sorted((n for n in nodes if n.healthy), key=lambda n: n.node_id)
    costs = _Costs.of(model, sessions_per_stage, context_tokens)
    report = _shortfall(costs, healthy, min_stages)
    if report.total_short or report.piece_too_big or not healthy:
        raise NotEnoughMemory(report)
    if min_stages > len(healthy):
        raise PlacementError(f"min_stages={min_stages} but only {len(healthy)} healthy nodes")
    rtt = _Rtt(rtt_ms)
    if previous is not None:
        kept = _keep_or_repair(costs, previous, healthy, rtt, min_stages)
        if kept is not None:
            return kept
    return _fresh(costs, healthy, rtt, previous, spares, min_stages)


def describe(p: Plan) -> str:
    """A small table of the chain, for the CLI and closing notes."""
    rows = [f"{'stage':>5}  {'node':<16} {'layers':<9} {'n':>3} {'needs':>9} {'of':>9} {'use':>5}"]
    for i, s in enumerate(p.stages):
        use = s.bytes_needed / s.capacity_bytes if s.capacity_bytes else math.inf
        rows.append(
            f"{i:>5}  {s.node_id:<16} {s.layers!s:<9} {len(s.layers):>3} "
            f"{s.bytes_needed / 1e9:>6.1f} GB {s.capacity_bytes / 1e9:>6.1f} GB {use:>5.0%}"
        )
    rows.append(f"spares: {', '.join(p.spares) or 'none'}")
    rows.append(
        f"estimated trip: {p.estimated_trip_ms:.1f} ms per token "
        f"({len(p.stages)} stages, {len(p.stages) - 1} hops) · moves: {p.moves}"
    )
    return "\n".join(rows)
