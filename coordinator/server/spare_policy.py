"""Which spare stands by for which stage: a pure policy (no clock, network or database).

A spare that already holds a stage's pieces takes that stage over without downloading
them when its node dies. Which stages deserve one first: those whose nodes are most
likely to leave soon. Two facts say so, both from heartbeats:

- a volunteer's declared availability ("until": the seeds' listing end date), when it
  falls within `horizon_s`: the sooner, the riskier, above anything measured;
- otherwise the node's measured uptime (time since it started heartbeating without a
  gap): a node that just (re)joined is likelier to go again than one up for hours.

Each spare stands by for at most one stage, the riskiest it can hold (its capacity
against the stage's need), riskiest stages first; stages left without a spare are
reported (the operator page shows them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

HORIZON_S = 3600.0
"""Declared departures further away than this count like no declaration."""
UPTIME_SCALE_S = 3600.0
"""An hour up halves a node's measured risk."""


@dataclass(frozen=True)
class NodeFacts:
    uptime_s: float
    """Seconds since the node's current run of heartbeats began."""
    leaves_in_s: float | None = None
    """Seconds until the volunteer's declared end of availability; None: not declared."""


@dataclass(frozen=True)
class StageNeed:
    node_id: str
    layers: tuple[int, int]
    bytes_needed: int


@dataclass(frozen=True)
class Standby:
    by_spare: Mapping[str, tuple[int, int]]
    """Spare node id -> the layers it keeps ready."""
    uncovered: tuple[tuple[int, int], ...]
    """Stages' layer ranges with no spare standing by, in layer order."""


def risk(facts: NodeFacts | None, horizon_s: float = HORIZON_S) -> float:
    """How likely the node is to leave soon, in [0, 2]: above 1 for a declared departure
    within the horizon (sooner is higher), else from uptime in (0, 1]. Unknown: 1."""
    if facts is None:
        return 1.0
    if facts.leaves_in_s is not None and facts.leaves_in_s < horizon_s:
        return 1.0 + (horizon_s - max(0.0, facts.leaves_in_s)) / horizon_s
    return 1.0 / (1.0 + max(0.0, facts.uptime_s) / UPTIME_SCALE_S)


def choose_standby(
    stages: Sequence[StageNeed],
    spares: Mapping[str, int],
    facts: Mapping[str, NodeFacts],
) -> Standby:
    """Spares (node id -> capacity bytes) matched to the riskiest stages they can hold.
    Ties keep layer order; among spares that fit, the smallest one is used (the larger
    stay free for larger stages), then by node id, so the answer is deterministic."""
    order = sorted(range(len(stages)), key=lambda i: (-risk(facts.get(stages[i].node_id)), i))
    free = dict(spares)
    by_spare: dict[str, tuple[int, int]] = {}
    covered: set[int] = set()
    for i in order:
        stage = stages[i]
        fitting = sorted((cap, node) for node, cap in free.items() if cap >= stage.bytes_needed)
        if not fitting:
            continue
        _, node = fitting[0]
        del free[node]
        by_spare[node] = stage.layers
        covered.add(i)
    uncovered = tuple(s.layers for i, s in enumerate(stages) if i not in covered)
    return Standby(by_spare, tuple(sorted(uncovered)))
