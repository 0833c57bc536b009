"""Where nodes are sent: a worker's assignment (its stage and the next hop), a client's
route along a chain, the chain the answer probe dials, and what a client's report of
dead stages does to them. Which chain a route takes is plan_keeper's; the dead-stage
check itself is liveness.py's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping

from coordinator import contract
from coordinator.contract import (
    MAX_FAULTY_LISTED,
    Assignment,
    NextHop,
    RouteAnswer,
    RouteAnswerStage,
)
from coordinator.server.answer_probe import Chain
from coordinator.server.liveness import confirmed_gone
from coordinator.server.models import ModelPlan
from coordinator.server.node_claims import BeatLimiter
from coordinator.server.node_memory import NodeMemory
from coordinator.server.placement import Plan
from coordinator.server.plan_keeper import Plans
from coordinator.server.routes import StageLoad
from coordinator.server.store import Node
from coordinator.server.timeline import Timeline

MAX_AVOID_PROBES = 2
"""Stages one route request may have probed (each probe waits up to 0.3 s)."""
AVOID_PROBES_PER_S = 0.5
AVOID_PROBE_BURST = 4.0
"""One client's reports may have 4 stages probed at once, then one every 2 s: a client
recovering from a dead stage reports one or two."""


def assignment_for(
    node_id: str,
    serving: tuple[str, Plan] | None,
    addresses: Mapping[str, str],
    sessions_per_stage: int,
    context_tokens: int,
) -> Assignment | None:
    """The stage a worker serves in the chain `serving` ((model, chain)), with the next
    hop's address; None where it has no stage."""
    if serving is None:
        return None
    model, current = serving
    stage = current.stage_of(node_id)
    if stage is None:
        return None
    nxt = current.next_hop(node_id)
    return Assignment(
        model,
        (stage.layers.start, stage.layers.stop),
        None if nxt is None else NextHop(nxt.node_id, addresses.get(nxt.node_id, "")),
        contract.manifest_path(model),
        contract.pieces_path(model),
        max_sessions=sessions_per_stage,
        context_tokens=context_tokens,
    )


def stage_load(node: Node | None) -> StageLoad:
    """A stage's load as its node's latest heartbeat said it (none for no node)."""
    if node is None:
        return StageLoad()
    return StageLoad(node.sessions, node.max_sessions, node.kv_budget_bytes, node.kv_reserved_bytes)


def route_answer(
    model: str, chain: Plan, addresses: Mapping[str, str], faulty: Collection[str]
) -> RouteAnswer:
    """A client's route along `chain`, with the newest nodes found faulty named."""
    stages = tuple(
        RouteAnswerStage(
            st.node_id, addresses.get(st.node_id, ""), (st.layers.start, st.layers.stop)
        )
        for st in chain.stages
    )
    return RouteAnswer(model, stages, tuple(reversed(list(faulty)))[:MAX_FAULTY_LISTED])


def probe_chain(plan: Plan | None, error: str, addresses: Mapping[str, str]) -> tuple[Chain, str]:
    """The main chain as the answer probe dials it ((node id, address) per stage), or
    none and why there is none."""
    if plan is None:
        return (), error or "no plan yet"
    chain = tuple((st.node_id, addresses.get(st.node_id) or "") for st in plan.stages)
    if any(not address for _, address in chain):
        return (), "a stage of the plan has no address"
    return chain, ""


class DeadStageReports:
    """Clients' reports of stages they found dead mid-answer. Each current stage named is
    suspect (out of the plan once stale instead of once gone); one whose port refuses
    the coordinator's probe is out at once, until it beats again. A client's word alone
    never evicts a node, and each asker has few probes to spend."""

    def __init__(self, plans: Plans, memory: NodeMemory, timeline: Timeline) -> None:
        self._plans = plans
        self._memory = memory
        self._timeline = timeline
        self._lock = threading.Lock()
        self._probes = BeatLimiter(AVOID_PROBES_PER_S, AVOID_PROBE_BURST)
        """Probes each asker's reports may cost."""

    def hear(
        self,
        hosted: ModelPlan,
        avoid: tuple[str, ...],
        asker: str,
        addresses: Callable[[], Mapping[str, str]],
        nothing_listens: Callable[[str], bool],
    ) -> None:
        """`asker` found the stages `avoid` of `hosted` dead; `addresses` reads the
        nodes' addresses, `nothing_listens` probes one."""
        # Only stages of a current chain count (no other id is kept), and only a few of
        # them not probed just now are probed: a report naming many live stages must
        # not hold this thread 0.3 s for each.
        now = time.monotonic()
        staged = self._plans.staged(hosted) - self._memory.gone()
        named = [a for a in dict.fromkeys(avoid) if a in staged]
        fresh = []
        with self._lock:
            for a in named[:MAX_AVOID_PROBES]:  # each probe costs the asker a token
                if self._probes.take(asker, now) > 0:
                    break
                fresh.append(a)
        # A refusal at the node's own address drops it now, not once silent past
        # stale_after_s (the spare then waits for nothing more).
        gone = confirmed_gone(fresh, addresses().get, nothing_listens)
        self._memory.reported(named, gone)
        for node_id in sorted(gone):
            detail = "a client could not reach it, and its port refused the coordinator's probe"
            self._timeline.said_gone(node_id, detail)
