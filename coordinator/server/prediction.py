"""What the fleet should deliver: one request's decode tokens/s, and the total at 1..N
requests at once, from the plan and what its stages and links measured. Pure: no clock,
network or database; frozen facts in, a frozen prediction out.

One request, plain decoding round the ring (docs/architecture.md, "One token's trip"):
a token crosses every stage once and N links (stage i -> i+1, and the last stage's link
back to the first), so

    trip = sum of the stages' one-row step times
         + sum of the links' one-way latencies (measured round trip / 2)
         + N x the cost of a hop beyond the link (frames, QUIC, the wake-ups)

and one request gets 1000 / trip tokens/s.

k requests at once, each with one token in flight: requests that start together
travel together (each stage takes every row that arrived while it was busy into one
step, `core/scheduling.py`), so every stage steps the k rows at once, at its measured
step time for k rows. A stage's row budget splits them: g = ceil(k / budget) groups of
b = ceil(k / g) rows go round one behind the other, and pipeline. A round, the time in
which every request gets one token, is then the longer of

    the trip of a group of b rows: sum of step(b) + links + N x (hop + b x row_hop), and
    the busiest stage's own time: g x (step(b) + b x row_hop)

and the total is k / round. The level stops at the admission limit (the fewest sessions
any stage admits: its sequence slots or its KV budget, `core/admission.py`).

A stage's step time at b rows comes from its measured (rows, ms) points: linear between
them; below the first, the first (a step is never cheaper than the fewest rows timed);
beyond the last, the slope of the last two (a single point: a fixed cost, as a GPU's
step nearly is). Measured live on the volunteer's PC, those points already carry what
that PC does under load: other stages or programs sharing its cores included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

__all__ = [
    "DEFAULT_HOP_MS",
    "DEFAULT_ROW_HOP_MS",
    "MAX_LEVELS",
    "MAX_REQUESTS",
    "FleetFacts",
    "Level",
    "Prediction",
    "StageFacts",
    "default_levels",
    "predict",
]

DEFAULT_HOP_MS = 0.5
"""A hop's fixed cost beyond its link's one-way latency: encoding and decoding the STEP,
QUIC, the receiving stage's event-loop wake-up and its engine hand-off. The link's
measured round trip (a PING through the whole stack) already holds half of this twice;
docs/decisions/path-mtu-discovery.md measures 0.5-0.7 ms of CPU a hop on loopback."""
DEFAULT_ROW_HOP_MS = 0.2
"""Each further row a hop carries: every session's STEP is a frame of its own, decoded
and handled one by one on the receiving stage's event loop (a batch of frames shares
the datagrams and the wake-up, hence less than a hop)."""
MAX_REQUESTS = 256
"""The most requests a level may name, and the limit where no stage reports one: a
stage admits at most 256 sessions (llama.cpp's sequence ids, core/admission.py)."""
MAX_LEVELS = 32
"""The most levels one prediction reports: what crosses HTTP stays small."""


class PredictionError(ValueError):
    """Facts that cannot be predicted from (a step time missing, a link count that does
    not match the chain)."""


@dataclass(frozen=True)
class StageFacts:
    """One stage as its node measured it."""

    node_id: str
    step_ms: tuple[tuple[int, float], ...]
    """Measured (rows, step ms) points, rows strictly increasing; at least one."""
    row_budget: int = 0
    """Rows one engine step takes at most; 0: not reported (no split)."""
    max_sessions: int = 0
    """Sessions the stage admits at once; 0: not reported (no limit from this stage)."""

    def __post_init__(self) -> None:
        if not self.step_ms:
            raise PredictionError(f"stage {self.node_id}: no measured step time")
        rows = [r for r, _ in self.step_ms]
        if rows[0] < 1 or any(b <= a for a, b in pairwise(rows)):
            raise PredictionError(f"stage {self.node_id}: rows must increase from 1 or more")
        if any(not (math.isfinite(ms) and ms >= 0) for _, ms in self.step_ms):
            raise PredictionError(f"stage {self.node_id}: step times must be finite and >= 0")
        if self.row_budget < 0 or self.max_sessions < 0:
            raise PredictionError(f"stage {self.node_id}: budgets must be >= 0")

    def step_at(self, rows: int) -> float:
        """The step time at `rows` rows (see the module docstring)."""
        pts = self.step_ms
        if rows <= pts[0][0]:
            return pts[0][1]
        for (r0, m0), (r1, m1) in pairwise(pts):
            if rows <= r1:
                return m0 + (m1 - m0) * (rows - r0) / (r1 - r0)
        if len(pts) == 1:
            return pts[0][1]
        (r0, m0), (r1, m1) = pts[-2], pts[-1]
        return m1 + max(0.0, (m1 - m0) / (r1 - r0)) * (rows - r1)


@dataclass(frozen=True)
class FleetFacts:
    """A chain in token order and its ring's links."""

    stages: tuple[StageFacts, ...]
    links_ms: tuple[float, ...]
    """One-way latency of each link a token crosses: stage i -> i+1, then the last
    stage -> the first; as many as stages."""
    hop_ms: float = DEFAULT_HOP_MS
    row_hop_ms: float = DEFAULT_ROW_HOP_MS
    admission_limit: int = 0
    """Requests the chain admits at once beyond the stages' `max_sessions` (e.g. the KV
    budget's share); 0: none beyond those."""

    def __post_init__(self) -> None:
        if not self.stages:
            raise PredictionError("a chain has at least one stage")
        if len(self.links_ms) != len(self.stages):
            raise PredictionError(
                f"{len(self.stages)} stages go round {len(self.stages)} links, "
                f"not {len(self.links_ms)}"
            )
        costs = (*self.links_ms, self.hop_ms, self.row_hop_ms)
        if any(not (math.isfinite(x) and x >= 0) for x in costs):
            raise PredictionError("latencies and hop costs must be finite and >= 0")
        if self.admission_limit < 0:
            raise PredictionError("admission_limit must be >= 0")

    @property
    def limit(self) -> int:
        """The most requests the chain runs at once (MAX_REQUESTS when nothing says)."""
        limits = [s.max_sessions for s in self.stages if s.max_sessions > 0]
        if self.admission_limit > 0:
            limits.append(self.admission_limit)
        return min(limits, default=MAX_REQUESTS)


@dataclass(frozen=True)
class Level:
    requests: int
    tokens_per_s: float
    """All requests together."""
    per_request_tokens_per_s: float
    round_ms: float
    """The time in which every request gets its next token."""
    rows_per_step: int
    groups: int
    bound: str
    """What sets the round: "latency" (the trip round the ring) or "stage N" (the
    busiest stage's own time, N its position in the chain)."""


@dataclass(frozen=True)
class Prediction:
    one_request_tokens_per_s: float
    trip_ms: float
    """One request's token round the ring."""
    compute_ms: float
    """The stages' one-row steps, summed."""
    links_ms: float
    hops_ms: float
    """What the hops cost beyond their links' latency, at one row."""
    slowest_stage: int
    """Position of the stage with the longest one-row step."""
    admission_limit: int
    levels: tuple[Level, ...]

    @property
    def peak(self) -> Level:
        """The level with the highest total (the earliest on a tie)."""
        return max(self.levels, key=lambda lv: (lv.tokens_per_s, -lv.requests))


def default_levels(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `limit`, and `limit` itself."""
    top = max(1, min(limit, MAX_REQUESTS))
    out = [1 << p for p in range(top.bit_length()) if 1 << p <= top]
    if out[-1] != top:
        out.append(top)
    return tuple(out)


def _level(facts: FleetFacts, k: int) -> Level:
    budgets = [s.row_budget for s in facts.stages if s.row_budget > 0]
    budget = min(budgets, default=k)
    groups = math.ceil(k / budget)
    rows = math.ceil(k / groups)
    n = len(facts.stages)
    steps = [s.step_at(rows) for s in facts.stages]
    handling = rows * facts.row_hop_ms
    trip = sum(steps) + sum(facts.links_ms) + n * (facts.hop_ms + handling)
    busy = [groups * (step + handling) for step in steps]
    worst = max(range(n), key=lambda i: busy[i])
    round_ms = max(trip, busy[worst])
    if round_ms <= 0:  # nothing measured takes time: no figure is honest
        raise PredictionError("every step time and latency is 0")
    bound = "latency" if trip >= busy[worst] else f"stage {worst}"
    return Level(k, k * 1e3 / round_ms, 1e3 / round_ms, round_ms, rows, groups, bound)


def predict(facts: FleetFacts, levels: Sequence[int] = ()) -> Prediction:
    """The prediction for `levels` requests at once (default: `default_levels`), each
    level capped at the admission limit, duplicates dropped, at most MAX_LEVELS."""
    limit = facts.limit
    asked = levels or default_levels(limit)
    if any(k < 1 for k in asked):
        raise PredictionError("a level is at least one request")
    wanted = sorted({min(k, limit, MAX_REQUESTS) for k in asked})[:MAX_LEVELS]
    one = _level(facts, 1)
    n = len(facts.stages)
    compute = sum(s.step_at(1) for s in facts.stages)
    slowest = max(range(n), key=lambda i: facts.stages[i].step_at(1))
    return Prediction(
        one_request_tokens_per_s=one.tokens_per_s,
        trip_ms=one.round_ms,
        compute_ms=compute,
        links_ms=sum(facts.links_ms),
        hops_ms=n * (facts.hop_ms + facts.row_hop_ms),
        slowest_stage=slowest,
        admission_limit=limit,
        levels=tuple(_level(facts, k) for k in wanted),
    )
