"""The hosted models' chains as the coordinator holds them: read back from the database
at start, re-placed when what placement is given changes, each model's main chain kept
when it changes, and handed out to routes by room. Everything here changes under one
lock; what placement is given is plan_inputs.py's, the chains themselves models.py's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from coordinator.errors import NotFound
from coordinator.server.events import PlanView
from coordinator.server.models import (
    HostedModel,
    ModelPlan,
    Rules,
    find,
    place_models,
    plan_setting,
)
from coordinator.server.placement import NodeInfo, Plan, StageAssignment
from coordinator.server.plan_store import PLAN_SETTING, plan_from_json, plan_to_json
from coordinator.server.routes import StageLoad, pick_chain
from coordinator.server.store import Store


class Plans:
    """Each hosted model's chains, the default model's first."""

    def __init__(self, store: Store, models: Sequence[HostedModel]) -> None:
        self._store = store
        self._lock = threading.Lock()
        self.hosted = [ModelPlan(m, kept=self._stored_plan(m, i)) for i, m in enumerate(models)]
        self.main = self.hosted[0]
        self._inputs: tuple[Any, ...] = ()
        """What the last placement was given: the same again places nothing anew."""

    def _stored_plan(self, model: HostedModel, index: int) -> Plan | None:
        """The model's last good plan from the database; for the first model, the plan a
        coordinator hosting one model kept before plans were kept per model."""
        stored = self._store.get_setting(plan_setting(model.name))
        if stored is None and index == 0:
            stored = self._store.get_setting(PLAN_SETTING)
        return plan_from_json(stored)

    def find(self, name: str) -> ModelPlan:
        """The hosted model called `name` ("default": the first); NotFound otherwise."""
        return find(self.hosted, name)

    def placed(self) -> list[Plan]:
        """Every model's chains (or kept chain while it has none)."""
        return [c for h in self.hosted for c in h.placed()]

    def stage_of(self, node_id: str) -> StageAssignment | None:
        """The node's stage in the first chain of any model that has it."""
        return next((st for c in self.placed() if (st := c.stage_of(node_id)) is not None), None)

    def stages_of(self, hosted: ModelPlan) -> dict[str, list[tuple[int, int]]]:
        """Node id -> the layers of its stages in the model's chains (or kept chain)."""
        stages: dict[str, list[tuple[int, int]]] = {}
        for chain in hosted.placed():
            for stage in chain.stages:
                stages.setdefault(stage.node_id, []).append((stage.layers.start, stage.layers.stop))
        return stages

    def views(self) -> list[tuple[str, PlanView | None, str]]:
        """Each model's main chain as the timeline compares it, with why there is none:
        (model, view, error), the default model named ""."""
        return [
            (h.name if i else "", None if h.plan is None else _view(h.plan), h.error or "")
            for i, h in enumerate(self.hosted)
        ]

    def kept_nodes(self) -> set[str]:
        """The nodes of the chains read back from the database."""
        return {n for h in self.hosted if h.kept is not None for n in h.kept.node_ids}

    def place(
        self,
        infos: Sequence[NodeInfo],
        claims: Sequence[NodeInfo],
        inputs: tuple[Any, ...],
        rules: Rules,
        warm: Mapping[tuple[int, int], str],
        trusted: frozenset[str],
        force: bool,
    ) -> Plan | None:
        """Place every model on `infos` (`claims`: the same workers as they claim) unless
        `inputs` are what the last placement was given and not `force`; the default
        model's main chain after."""
        with self._lock:
            if not force and inputs == self._inputs:
                return self.main.plan
            self._inputs = inputs
            if len(infos) < rules.min_stages:
                waiting = f"waiting for workers: {len(infos)} of {rules.min_stages} joined"
                for h in self.hosted:
                    h.fail(waiting)
                return None
            outcomes = place_models(
                self.hosted, infos, claims, rules, self._store.rtt_map(), warm, trusted
            )
            for h, outcome in zip(self.hosted, outcomes, strict=True):
                if isinstance(outcome, str):
                    h.fail(outcome)
                elif h.adopt(outcome) and h.plan is not None:
                    self._store.set_setting(plan_setting(h.name), plan_to_json(h.plan))
            return self.main.plan

    def staged(self, hosted: ModelPlan) -> set[str]:
        """The nodes with a stage in one of the model's chains."""
        with self._lock:
            return {st.node_id for c in hosted.chains for st in c.stages}

    def hand_out(
        self,
        hosted: ModelPlan,
        current: Plan,
        avoid: Collection[str],
        load_of: Callable[[str], StageLoad],
    ) -> Plan:
        """The chain a new route goes along: one without a stage in `avoid`, the one
        with the most room when there are several (routes.pick_chain), counted as
        handed out; NotFound while every chain has a stage to avoid."""
        with self._lock:
            chains = hosted.chains or [current]
            usable = [i for i, c in enumerate(chains) if not set(c.node_ids) & set(avoid)]
            if not usable:
                blocked = sorted({st.node_id for st in current.stages} & set(avoid))
                raise NotFound(f"no route avoiding {', '.join(blocked)} yet: waiting for a re-plan")
            pick = usable[0]
            handed = hosted.handed
            if len(usable) > 1 and len(handed) == len(chains):
                loads = [[load_of(st.node_id) for st in chains[i].stages] for i in usable]
                pick = usable[pick_chain(loads, [handed[i] for i in usable])]
            if len(handed) == len(chains):
                handed[pick] += 1
            return chains[pick]

    def heard_from(self, node_id: str) -> None:
        """A first stage's heartbeat counts the routes handed to its chain since the last:
        they count as handed out no more."""
        with self._lock:
            for h in self.hosted:
                for i, chain in enumerate(h.chains):
                    if chain.stages[0].node_id == node_id and i < len(h.handed):
                        h.handed[i] = 0

    def serving(self, node_id: str) -> tuple[str, Plan] | None:
        """The model and chain in which the node has a stage (a worker serves one model's
        stage at a time: placement/fleet_split.py), if any."""
        return next(
            (
                (h.name, c)
                for h in self.hosted
                for c in h.placed()
                if c.stage_of(node_id) is not None
            ),
            None,
        )


def _view(plan: Plan) -> PlanView:
    return PlanView(
        tuple((st.node_id, (st.layers.start, st.layers.stop)) for st in plan.stages),
        tuple(plan.spares),
    )
