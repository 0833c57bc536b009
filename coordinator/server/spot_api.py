"""The HTTP side of spot checks (coordinator/server/spot_service.py): a node fetches
the record it was asked to recompute and answers its asks; the operator lists the
nodes found faulty with their evidence, starts a check and clears a node.

Annotations are evaluated where the routes are defined (no `from __future__ import
annotations`): the dependencies come from api.py as arguments.
"""

from typing import Annotated, Any

from fastapi import Body, FastAPI, HTTPException
from fastapi import Path as PathParam
from pydantic import BaseModel, Field

from coordinator import contract as c
from coordinator.errors import MalformedAnswer
from coordinator.server.api_models import documented_errors
from coordinator.server.service import Coordinator
from coordinator.server.spot_book import CheckUnknown
from coordinator.spot_checks import MAX_CHECK_ID_CHARS, MAX_CHECK_STEPS, MAX_SESSION_CHARS

CHECKS = f"{c.API}/checks"
"""POST (operator): start a check of one node's session now."""


class CheckIn(BaseModel):
    node_id: str = Field(min_length=1, max_length=64)
    session: str = Field(min_length=1, max_length=MAX_SESSION_CHARS)
    steps: int = Field(ge=1, le=MAX_CHECK_STEPS)


def add_spot_routes(
    app: FastAPI, coord: Coordinator, admin: Any, node: Any, node_path: Any
) -> None:
    """`coord`: the Coordinator, read when a route is called (its `spot` checks and its
    hosted models' chains)."""
    CheckId = Annotated[str, PathParam(min_length=1, max_length=MAX_CHECK_ID_CHARS)]

    @app.get(c.CHECK, tags=["nodes"], responses=documented_errors(401, 403, 404))
    def check_inputs(node_id: node_path, check_id: CheckId, who: node) -> dict[str, Any]:
        """The record this node was asked to recompute."""
        if node_id != who:
            raise HTTPException(403, "a node may only fetch its own checks")
        try:
            return coord.spot.inputs(who, check_id).to_json()
        except CheckUnknown as exc:
            raise HTTPException(404, str(exc)) from exc

    @app.post(c.CHECK, tags=["nodes"], responses=documented_errors(400, 401, 403, 404, 413))
    def check_answer(
        node_id: node_path,
        check_id: CheckId,
        who: node,
        body: Annotated[dict[str, Any], Body()],
    ) -> dict[str, str]:
        """This node's answer to an ask: {"record": ...} or {"digests": [...]}, or
        {"refused": why}."""
        if node_id != who:
            raise HTTPException(403, "a node may only answer its own checks")
        try:
            coord.spot.answer(who, check_id, body)
        except CheckUnknown as exc:
            raise HTTPException(404, str(exc)) from exc
        except MalformedAnswer as exc:
            raise HTTPException(400, str(exc)) from exc
        return {"status": "recorded"}

    @app.get(c.FAULTS, tags=["operator"], responses=documented_errors(401))
    def faults(_a: admin) -> dict[str, Any]:
        """The nodes spot checks found faulty, with the evidence; the latest checks."""
        return {
            "rate": coord.spot.settings.rate,
            "faulty": coord.spot.faulty(),
            "recent": coord.spot.recent,
            "counts": coord.spot.counts,
        }

    @app.delete(c.FAULT, tags=["operator"], responses=documented_errors(401, 404))
    def clear_fault(node_id: node_path, _a: admin) -> dict[str, str]:
        """Clear a node found faulty: placed again, its certificate renewed again."""
        coord.spot.clear(node_id)
        return {"status": "cleared"}

    @app.post(CHECKS, tags=["operator"], responses=documented_errors(400, 401, 404, 413))
    def start_check(body: CheckIn, _a: admin) -> dict[str, int]:
        """Check one node's first `steps` steps of `session` now."""
        hosted = list(coord.hosted_models)
        return {"check": coord.spot.start(body.node_id, body.session, body.steps, hosted)}
