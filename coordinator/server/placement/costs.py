"""The numbers every search step asks for, precomputed: what a candidate stage [a, b)
needs (prefix sums), which RTT two nodes see, and whether capacities in a given order
can cover a span of layers (a bitset of reachable cut points)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from coordinator.server.placement.model import DEFAULT_RTT_MS, PROCESS_OVERHEAD_BYTES, ModelSpec

EPS = 1e-9
"""Tolerance when comparing float costs, so that ties stay ties."""


@dataclass(frozen=True)
class Costs:
    """Memory of any candidate stage [a, b) in O(1), from prefix sums."""

    model: ModelSpec
    prefix: tuple[int, ...]
    """prefix[i]: weights + KV of layers [0, i), so a middle stage is a difference."""
    cuts: tuple[int, ...]
    """Allowed boundaries, increasing; `cut_mask` has bit p set for each."""
    cut_mask: int
    mtp_kv: int = 0
    """The last stage's MTP-context KV for the planned sessions (after the last layer,
    like the head, so not in the prefix sums)."""
    _ends: dict[tuple[int, int], tuple[int, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )
    """Memo for `ends`; lives only as long as one plan() call."""

    @staticmethod
    def of(model: ModelSpec, sessions: int, context_tokens: int) -> Costs:
        per = sessions * context_tokens
        # A session's recurrent state is fixed-size: it scales by sessions, not positions.
        state = model.state_bytes_per_session_per_layer or (0,) * model.n_layer
        prefix = [0]
        for w, kv, st in zip(
            model.bytes_per_layer, model.kv_bytes_per_token_per_layer, state, strict=True
        ):
            prefix.append(prefix[-1] + w + per * kv + sessions * st)
        cuts = model.cut_points
        mtp_kv = per * model.mtp_kv_bytes_per_token
        return Costs(model, tuple(prefix), cuts, sum(1 << c for c in cuts), mtp_kv)

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
            total += m.head_bytes + m.mtp_bytes + self.mtp_kv
            total += 0 if a == 0 else m.embedding_bytes
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
class RttLookup:
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


def fits_in_order(costs: Costs, caps: Sequence[int], lo: int, hi: int) -> bool:
    """Whether nodes of these capacities, in this order, can cover [lo, hi) at some cuts."""
    k = len(caps)
    if k == 0 or hi - lo < k:
        return False
    reach = 1 << lo  # bit p set: the previous stages can end exactly at layer p
    for i, cap in enumerate(caps[:-1]):
        limit = hi - (k - 1 - i)  # leave at least one layer for every later node
        reach = advance(costs, reach, cap, limit, hi)
        if not reach:
            return False
    return any(costs.need(a, hi) <= caps[-1] for a in bits(reach))


def advance(costs: Costs, reach: int, cap: int, limit: int, hi: int) -> int:
    """Where one more node of capacity `cap` can end, from every position in `reach`."""
    ends = costs.ends(cap, hi)
    out = 0
    for a in bits(reach):
        b = min(ends[a], limit)
        if b > a:
            out |= ((1 << (b - a)) - 1) << (a + 1)
    return out & costs.cut_mask


def bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
