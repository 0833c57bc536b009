"""What the soak kills next: a pure, seeded policy (no IO, no clock).

The soak (bench/soak.py) asks `next_fault` once per round with what is running now: the
workers on the chain, the spares, whether the coordinator (and a relay) is up. It gets one
`Fault`: which process to kill with SIGKILL, how long it stays dead before it is started
again (a short outage looks like a reboot: the process is back before the coordinator
noticed, with no KV; a long one is a machine switched off, replaced by a spare), and how
long to wait after it is back before the next round. The same seed and the same
situation always give the same fault, so a soak that found a bug can be replayed.

Chain workers are the interesting victims (an answer is running through them); spares,
the coordinator and the relay (coturn, when the soak runs one) are killed too, less
often. A worker is only killed while enough others run to form a chain without it
(`min_workers`): the soak tests recovery, not an outage nobody could survive.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Target(Enum):
    CHAIN_WORKER = "chain worker"
    SPARE_WORKER = "spare worker"
    COORDINATOR = "coordinator"
    RELAY = "relay"


@dataclass(frozen=True)
class ChaosPolicy:
    chain_weight: float = 6.0
    spare_weight: float = 1.0
    coordinator_weight: float = 2.0
    relay_weight: float = 1.0
    """Used only when the soak runs a relay."""
    coordinator_every: int = 0
    """Every this many rounds the coordinator, if up (0: only by weight): a short soak
    then surely kills it too."""
    relay_every: int = 0
    """The same for the relay (the coordinator wins a round both claim)."""
    min_workers: int = 3
    """Workers that must stay up besides the victim (the chain length)."""
    down_s: tuple[float, float] = (0.5, 8.0)
    """How long a killed process stays dead, uniformly in this range."""
    gap_s: tuple[float, float] = (2.0, 6.0)
    """Wait after the restarted process is back, before the next fault."""
    relay_down_s: tuple[float, float] = (0.5, 3.0)
    """coturn's outage: a crashed relay under a supervisor (systemd's Restart=) is back
    within seconds; links re-allocate once it is."""


@dataclass(frozen=True)
class Situation:
    chain: tuple[str, ...]
    """Names of the running workers that serve a stage of some route now."""
    spares: tuple[str, ...]
    """Names of the running workers outside every route."""
    coordinator_up: bool = True
    relay_up: bool | None = None
    """None: the soak runs no relay."""


@dataclass(frozen=True)
class Fault:
    kind: Target
    name: str
    """The process to kill: a worker's name, "coordinator" or "relay"."""
    down_s: float
    gap_s: float


def next_fault(seed: int, round_no: int, now: Situation, policy: ChaosPolicy) -> Fault | None:
    """The fault for round `round_no`, or None when nothing may be killed now."""
    rng = random.Random(f"{seed}:{round_no}")  # per round: a replay needs no history
    every = policy.coordinator_every
    if every and now.coordinator_up and (round_no + 1) % every == 0:
        return Fault(
            Target.COORDINATOR,
            "coordinator",
            rng.uniform(*policy.down_s),
            rng.uniform(*policy.gap_s),
        )
    every = policy.relay_every
    if every and now.relay_up and (round_no + 1) % every == 0:
        return Fault(
            Target.RELAY, "relay", rng.uniform(*policy.relay_down_s), rng.uniform(*policy.gap_s)
        )
    candidates: list[tuple[Target, str, float]] = []
    workers = len(now.chain) + len(now.spares)
    if workers - 1 >= policy.min_workers:
        candidates += [(Target.CHAIN_WORKER, n, policy.chain_weight) for n in now.chain]
        candidates += [(Target.SPARE_WORKER, n, policy.spare_weight) for n in now.spares]
    if now.coordinator_up:
        candidates.append((Target.COORDINATOR, "coordinator", policy.coordinator_weight))
    if now.relay_up:
        candidates.append((Target.RELAY, "relay", policy.relay_weight))
    candidates = [c for c in candidates if c[2] > 0]
    if not candidates:
        return None
    kind, name, _ = rng.choices(candidates, weights=[c[2] for c in candidates])[0]
    down = policy.relay_down_s if kind is Target.RELAY else policy.down_s
    return Fault(kind, name, rng.uniform(*down), rng.uniform(*policy.gap_s))


def plan(seed: int, rounds: int, now: Situation, policy: ChaosPolicy) -> Sequence[Fault | None]:
    """The first `rounds` faults for an unchanging situation (to print what a seed does)."""
    return [next_fault(seed, r, now, policy) for r in range(rounds)]
