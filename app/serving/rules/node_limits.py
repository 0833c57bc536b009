"""Per-node limits on new sessions at a stage: a pure policy, the clock passed in.

Admission (core.admission) caps what the whole stage holds; it does not stop one
authenticated node from taking every slot, or from sending OPENs as fast as its link
allows so that the stage spends its time refusing them. These limits are per upstream
node id (the one its certificate proved): how many sessions it may hold here at once, and
how fast it may ask for new ones (a token bucket: `open_burst` at once, refilled at
`open_per_s`). A node over either limit is refused OVERLOADED with a retry hint; other
nodes and the sessions already open, the flooder's included, go on untouched.

Only new sessions are counted: an OPEN that resumes a session over a new link is the
recovery path and is never rate limited here (it is bounded by the sessions the node
holds). `app.serving.rules.sessions` asks `check_open` before admission; nothing here reads
a clock of its own or touches IO, so every rule is tested with a plain float clock.

The worker applies them on the first stage, whose upstream nodes are the clients asking:
on a later stage every session of the chain arrives from one upstream worker, so a limit
on that node would be a limit on everyone (admission caps those stages, and only the
upstream may open sessions there: app.serving.rules.peers).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["NodeLimits", "NodeLimitsPolicy", "NodeRefusal"]

MAX_TRACKED_NODES = 4096
"""Buckets kept at most; the node seen least lately is forgotten first (its bucket is the
likeliest to be full, and a full bucket is the same as none), so memory stays bounded."""


@dataclass(frozen=True)
class NodeLimitsPolicy:
    max_sessions_per_node: int | None = None
    """Sessions one node may hold here at once; None: only admission's stage-wide cap.
    A middle stage sees every session of its chain from one upstream worker, so a cap
    under the stage's slots belongs only where the upstream nodes are clients."""
    open_burst: float = 32.0
    """New-session OPENs a node may send at once (the bucket's size)."""
    open_per_s: float = 8.0
    """New-session OPENs a node may send per second, sustained."""

    def __post_init__(self) -> None:
        if self.max_sessions_per_node is not None and self.max_sessions_per_node < 1:
            raise ValueError("max_sessions_per_node must be >= 1 (or None)")
        if not (self.open_burst >= 1 and math.isfinite(self.open_burst)):
            raise ValueError("open_burst must be a finite number >= 1")
        if not (self.open_per_s > 0 and math.isfinite(self.open_per_s)):
            raise ValueError("open_per_s must be a finite number > 0")

    @classmethod
    def for_stage(cls, slots: int, per_node: int | None = None) -> NodeLimitsPolicy:
        """The worker's default: one node may start every slot at once (a client starting
        many answers together), then open a quarter of the slots per second, at least
        the class defaults, and hold at most `per_node` sessions (None: every slot;
        app.serving.rules.peers.per_node_sessions gives the worker's). What it stops is a
        node looping OPENs (refused or opened and closed) far faster than any use, or
        holding every slot through sessions it never steps."""
        return cls(
            max_sessions_per_node=per_node,
            open_burst=max(cls.open_burst, slots),
            open_per_s=max(cls.open_per_s, slots / 4),
        )


@dataclass(frozen=True)
class NodeRefusal:
    reason: str
    retry_after_ms: int
    try_another_route: bool


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class NodeLimits:
    """The buckets of the nodes seen lately; `clock` gives seconds (monotonic)."""

    policy: NodeLimitsPolicy
    clock: Callable[[], float]
    _buckets: OrderedDict[str, _Bucket] = field(default_factory=OrderedDict)
    """Least lately seen first: eviction is O(1) even under a flood of new node ids."""

    def check_open(self, node: str, held: int) -> NodeRefusal | None:
        """May `node`, holding `held` sessions here, open one more? Spends a token when
        it may (and also when the cap refuses it: a flood against the cap is a flood)."""
        now = self.clock()
        bucket = self._refill(node, now)
        if bucket.tokens < 1.0:
            wait_s = (1.0 - bucket.tokens) / self.policy.open_per_s
            return NodeRefusal(
                f"node {node!r} opens sessions too fast "
                f"(over {self.policy.open_per_s:g}/s, burst {self.policy.open_burst:g})",
                retry_after_ms=max(1, math.ceil(wait_s * 1000)),
                try_another_route=False,
            )
        bucket.tokens -= 1.0
        cap = self.policy.max_sessions_per_node
        if cap is not None and held >= cap:
            return NodeRefusal(
                f"node {node!r} holds {held} sessions here, the most one node may",
                retry_after_ms=1000,
                try_another_route=True,
            )
        return None

    def tokens(self, node: str) -> float:
        """What is left in `node`'s bucket now (for tests and stats)."""
        return self._refill(node, self.clock()).tokens

    def _refill(self, node: str, now: float) -> _Bucket:
        bucket = self._buckets.get(node)
        if bucket is None:
            while len(self._buckets) >= MAX_TRACKED_NODES:
                # The worst a forgotten node gains is one fresh burst.
                self._buckets.popitem(last=False)
            bucket = self._buckets[node] = _Bucket(self.policy.open_burst, now)
            return bucket
        self._buckets.move_to_end(node)
        # A clock that went back (it should not: monotonic) refills nothing, never negative.
        elapsed = max(0.0, now - bucket.at)
        bucket.tokens = min(
            self.policy.open_burst, bucket.tokens + elapsed * self.policy.open_per_s
        )
        bucket.at = now
        return bucket
