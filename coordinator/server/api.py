"""The coordinator's HTTP app: the public routes here, the nodes' (api_nodes.py), the
operator's (api_operator.py) and the spot checks' (spot_api.py) beside them, who may
call which in api_callers.py and the refusals' answers in api_errors.py. Routes parse
the request, call `Coordinator` and shape the answer; no logic here.

The OpenAPI description is served at /openapi.json (FastAPI); the operator page and its
static files come from coordinator/server/web.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Header, Request
from fastapi.responses import PlainTextResponse

from coordinator import contract as c
from coordinator import invites as inv
from coordinator.contract import CaAnswer, InviteCheck, JoinAnswer
from coordinator.releases import RELEASE_HEADER
from coordinator.server.api_callers import (
    ADMIN_TOKEN as ADMIN_TOKEN,  # importers name it from here
)
from coordinator.server.api_callers import (
    SESSION_COOKIE,
    Admin,
    Attempts,
    NodeId,
    NodePath,
    admit_release,
    from_loopback,
    require_admin,
)
from coordinator.server.api_callers import (
    caller_address as caller_address,  # importers name it from here
)
from coordinator.server.api_errors import LimitBody, add_error_handlers
from coordinator.server.api_models import ERROR_REASONS, InviteCheckIn, JoinIn
from coordinator.server.api_models import documented_errors as _errors
from coordinator.server.api_nodes import add_node_routes
from coordinator.server.api_operator import add_operator_routes
from coordinator.server.invite_book import check_invite
from coordinator.server.limits import AttemptLimiter
from coordinator.server.metrics import render_metrics
from coordinator.server.operator_logins import OperatorLogins
from coordinator.server.service import Coordinator
from coordinator.server.spot_api import add_spot_routes
from coordinator.server.store import utcnow


def create_app(coord: Coordinator, web_dir: Path | None = None) -> FastAPI:
    app = FastAPI(
        title="Sangama coordinator",
        version="1",
        description="Invitations, certificates, registry, placement, pieces and routes.",
    )
    sessions = OperatorLogins(lambda: coord.store)  # in the database: a restart keeps them
    app.state.coord = coord
    app.state.sessions = sessions
    # Failed operator logins and invite redemptions per caller address (limits.py).
    logins, joins = Attempts(AttemptLimiter(5, 60.0)), Attempts(AttemptLimiter(10, 60.0))
    checks = Attempts(AttemptLimiter(10, 60.0))  # invite checks: no guessing codes through it

    app.add_middleware(LimitBody)
    add_error_handlers(app)

    # -- public
    @app.get(c.CA, response_model=CaAnswer, tags=["public"])
    def ca() -> CaAnswer:
        return CaAnswer(certificate_pem=coord.ca_pem, fingerprint=coord.ca_fingerprint)

    @app.post(
        c.JOIN,
        response_model=JoinAnswer,
        tags=["public"],
        responses=_errors(400, 403, 413, 426, 429),
    )
    def join(body: JoinIn, request: Request) -> JoinAnswer:
        caller = joins.admit(request)
        admit_release(request.headers.get(RELEASE_HEADER), coord.settings.min_release)
        try:
            answer = coord.join(body.secret, body.csr_pem)
        except inv.InviteError:
            joins.done(caller, ok=False)
            raise
        joins.done(caller, ok=True)
        return answer

    @app.post(
        c.INVITE_CHECK,
        response_model=InviteCheck,
        tags=["public"],
        responses=_errors(400, 413, 429),
    )
    def invite_check(body: InviteCheckIn, request: Request) -> InviteCheck:
        """Would this invite be accepted now? Nothing is used; refusals count against the
        caller like failed joins do, so it cannot be used to guess codes."""
        caller = checks.admit(request)
        found = check_invite(coord.store, body.secret, utcnow())
        checks.done(caller, ok=found.valid)
        return found

    @app.get(c.HEALTH, tags=["public"])
    def health() -> dict[str, str]:
        # Public, as the releases are: `sangama status` tells a volunteer about updates
        # from here, and nothing on their PC calls anywhere but their coordinator.
        return {
            "status": "ok",
            "latest_release": coord.settings.latest_release,
            "min_release": coord.settings.min_release,
        }

    # The 401 is JSON like every error here, though the page itself is plain text.
    refused_json = {"$ref": "#/components/schemas/ErrorOut"}
    metrics_401 = {
        "description": ERROR_REASONS[401],
        "content": {"application/json": {"schema": refused_json}},
    }

    @app.get(
        c.METRICS,
        response_class=PlainTextResponse,
        tags=["public"],
        responses={401: metrics_401},
    )
    def metrics(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
        # Node ids, capacities and timings of an invitation-only swarm: for the operator
        # (token or login), a scraper on this machine, or anyone where configured so.
        if not (coord.settings.metrics_public or from_loopback(request)):
            require_admin(request, authorization)
        return render_metrics(coord)

    add_node_routes(app, coord)
    add_operator_routes(app, coord, sessions, logins)
    add_spot_routes(app, coord, Admin, NodeId, NodePath)

    if web_dir is not None:
        from coordinator.server.web import mount_web

        mount_web(app, web_dir, lambda request: request.cookies.get(SESSION_COOKIE) in sessions)
    return app
