"""The last good plan, kept across re-plans that fail and across coordinator restarts.

A re-plan starts from the previous plan so that as few nodes as possible move. Two
moments used to lose it: a re-plan with too few healthy workers for a while (a loaded
machine's heartbeats arrive late) set the plan to None, and a restarted coordinator
began with none, so the next plan was made afresh and could reshuffle every stage (each
one then reloads, draining its sessions first). The plan is stored as JSON in the
settings table; a plan that no longer fits the nodes is simply repaired or replaced by
placement, never trusted blindly.
"""

from __future__ import annotations

import json
import logging

from coordinator.server.placement import Plan
from coordinator.server.placement.model import StageAssignment
from core.types import LayerRange

log = logging.getLogger(__name__)

PLAN_SETTING = "last_plan"


def plan_to_json(plan: Plan) -> str:
    return json.dumps(
        {
            "stages": [
                [s.node_id, s.layers.start, s.layers.stop, s.bytes_needed, s.capacity_bytes]
                for s in plan.stages
            ],
            "spares": list(plan.spares),
            "estimated_trip_ms": plan.estimated_trip_ms,
        },
        sort_keys=True,
    )


def plan_from_json(text: str | None) -> Plan | None:
    """The stored plan, or None when there is none or it does not parse (logged)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        stages = tuple(
            StageAssignment(str(n), LayerRange(int(a), int(b)), int(need), int(cap))
            for n, a, b, need, cap in doc["stages"]
        )
        return Plan(
            stages, tuple(str(s) for s in doc["spares"]), float(doc["estimated_trip_ms"]), 0
        )
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("stored plan ignored (%s); planning afresh", exc)
        return None
