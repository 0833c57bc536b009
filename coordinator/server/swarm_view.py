"""The operator page's view of the swarm (GET SWARM), shaped from the coordinator: each
node as the page shows it, every model's plan, the throughput, the predicted speed and
whether the chain answers. Reads only; the page's JSON models are api_models.py's.
"""

from __future__ import annotations

from coordinator.contract import RouteAnswerStage
from coordinator.server.answer_probe import AnswerState
from coordinator.server.api_models import (
    AnswerOut,
    LevelOut,
    ModelOut,
    NodeOut,
    PredictionOut,
    SwarmOut,
)
from coordinator.server.placement import Plan
from coordinator.server.prediction import Level
from coordinator.server.service import Coordinator
from coordinator.server.store import as_utc


def swarm_out(coord: Coordinator) -> SwarmOut:
    """The operator page's whole view of the swarm (GET SWARM)."""
    prediction, note = _prediction_out(coord)
    current = coord.current_plan
    standby = coord.standby()
    trusted = coord.trusted_nodes()
    hosted = coord.hosted_models
    nodes = []
    coord.sweep()
    for n in coord.nodes():
        # Its layers in a model's main chain (the default model's first), as the page
        # always showed them; its model in any chain of any model.
        stages = (h.plan.stage_of(n.node_id) for h in hosted if h.plan is not None)
        stage = next((st for st in stages if st is not None), None)
        serves = next(
            (h.name for h in hosted for ch in h.chains if ch.stage_of(n.node_id) is not None), ""
        )
        doing = coord.activity(n.node_id)
        nodes.append(
            NodeOut(
                node_id=n.node_id,
                role=n.role,
                health=coord.health(n),
                paused=coord.paused_reason(n.node_id),
                address=n.address,
                capacity_bytes=n.capacity_bytes,
                vram_cap_bytes=n.vram_cap_bytes,
                hardware=n.hardware,
                stats=n.stats,
                path=n.path,
                layers=None if stage is None else (stage.layers.start, stage.layers.stop),
                last_seen=None if n.last_seen is None else as_utc(n.last_seen),
                backend=n.backend,
                device_bytes_used=n.device_bytes_used,
                device_cap_bytes=n.device_cap_bytes,
                gpu_layers=n.gpu_layers,
                n_layers=n.n_layers,
                sessions=n.sessions,
                max_sessions=n.max_sessions,
                kv_budget_bytes=n.kv_budget_bytes,
                kv_reserved_bytes=n.kv_reserved_bytes,
                trusted=n.node_id in trusted,
                name=n.name,
                state=coord.node_state(n),
                activity=doing.activity,
                download_done_bytes=doing.done_bytes,
                download_total_bytes=doing.total_bytes,
                forgettable=coord.can_forget(n),
                model=serves,
            )
        )
    addresses = {n.node_id: n.address for n in nodes}

    def stages_of(plan: Plan | None) -> list[RouteAnswerStage]:
        if plan is None:
            return []
        return [
            RouteAnswerStage(
                node_id=s.node_id,
                address=addresses.get(s.node_id, ""),
                layers=(s.layers.start, s.layers.stop),
            )
            for s in plan.stages
        ]

    plan_stages = stages_of(current)
    models = [
        ModelOut(
            name=h.name,
            n_layer=h.model.manifest.facts.n_layer,
            default=i == 0,
            plan=stages_of(h.plan),
            chains=len(h.chains),
            plan_error=h.error,
        )
        for i, h in enumerate(hosted)
    ]
    return SwarmOut(
        model=coord.model.name,
        n_layer=coord.model.manifest.facts.n_layer,
        nodes=nodes,
        plan=plan_stages,
        spares=[] if current is None else list(current.spares),
        no_spare=list(standby.uncovered),
        standby=dict(standby.by_spare),
        plan_error=coord.plan_error,
        throughput=coord.throughput(),
        prediction=prediction,
        prediction_note=note,
        answer=_answer_out(coord.answer),
        models=models,
        piece_bytes_served=coord.pieces.coordinator_bytes,
        pieces_served_at={h.node_id: h.address for h in coord.pieces.holders()},
    )


def _answer_out(state: AnswerState) -> AnswerOut:
    return AnswerOut(
        can_answer=state.can_answer,
        since=state.since,
        checked_at=state.checked_at,
        reason=state.reason,
        chain=list(state.chain),
        answer_ms=state.answer_ms,
    )


def _level_out(lv: Level) -> LevelOut:
    return LevelOut(
        requests=lv.requests,
        tokens_per_s=lv.tokens_per_s,
        per_request_tokens_per_s=lv.per_request_tokens_per_s,
        round_ms=lv.round_ms,
        rows_per_step=lv.rows_per_step,
        groups=lv.groups,
        bound=lv.bound,
    )


def _prediction_out(coord: Coordinator) -> tuple[PredictionOut | None, str]:
    fc = coord.fleet_forecast()
    p = fc.prediction
    if p is None:
        return None, fc.note
    out = PredictionOut(
        one_request_tokens_per_s=p.one_request_tokens_per_s,
        trip_ms=p.trip_ms,
        compute_ms=p.compute_ms,
        links_ms=p.links_ms,
        hops_ms=p.hops_ms,
        slowest_node=fc.slowest_node,
        admission_limit=p.admission_limit,
        assumed_links=fc.assumed_links,
        levels=[_level_out(lv) for lv in p.levels],
        peak=_level_out(p.peak),
    )
    return out, fc.note
