"""The operator's HTTP routes: logging in and out, invites, revoking, trusting, naming
and forgetting nodes, the timeline and the swarm's view. Each needs an operator (a
logged-in browser or the admin token) but the login itself, which counts failures.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import FastAPI, HTTPException, Query, Request, Response

from coordinator import contract as c
from coordinator import invites as inv
from coordinator.server.api_callers import SESSION_COOKIE, Admin, Attempts, InviteId, NodePath
from coordinator.server.api_models import (
    EventOut,
    InviteIn,
    InviteOut,
    LoginIn,
    NameIn,
    SwarmOut,
    TrustIn,
)
from coordinator.server.api_models import documented_errors as _errors
from coordinator.server.events import KINDS
from coordinator.server.invite_book import InviteRecord
from coordinator.server.operator_logins import OperatorLogins
from coordinator.server.service import Coordinator
from coordinator.server.swarm_view import swarm_out


def add_operator_routes(
    app: FastAPI, coord: Coordinator, sessions: OperatorLogins, logins: Attempts
) -> None:
    """`sessions`: the logged-in browsers; `logins`: failed logins per caller."""

    @app.post(c.LOGIN, tags=["operator"], responses=_errors(400, 401, 413, 429))
    def login(body: LoginIn, request: Request, response: Response) -> dict[str, str]:
        caller = logins.admit(request)
        if not coord.check_admin_password(body.password):
            logins.done(caller, ok=False)
            raise HTTPException(401, "wrong operator password")
        logins.done(caller, ok=True)
        token = secrets.token_urlsafe(24)
        sessions.add(token)
        response.set_cookie(SESSION_COOKIE, token, httponly=True, secure=True, samesite="strict")
        return {"status": "logged in"}

    @app.post(c.LOGOUT, tags=["operator"])
    def logout(request: Request, response: Response) -> dict[str, str]:
        sessions.discard(request.cookies.get(SESSION_COOKIE, ""))
        response.delete_cookie(SESSION_COOKIE)
        return {"status": "logged out"}

    @app.post(
        c.INVITES,
        response_model=InviteOut,
        tags=["operator"],
        responses=_errors(400, 401, 413),
    )
    def create_invite(body: InviteIn, _a: Admin) -> InviteOut:
        invite_id, code = coord.create_invite(
            body.role, body.uses, inv.parse_duration(body.expires), body.note
        )
        row = next(i for i in coord.list_invites() if i.id == invite_id)
        return _invite_out(row, code)

    @app.get(
        c.INVITES,
        response_model=list[InviteOut],
        tags=["operator"],
        responses=_errors(401),
    )
    def list_invites(_a: Admin) -> list[InviteOut]:
        return [_invite_out(i) for i in coord.list_invites()]

    @app.delete(c.INVITE, tags=["operator"], responses=_errors(401, 404))
    def revoke_invite(invite_id: InviteId, _a: Admin) -> dict[str, str]:
        coord.revoke_invite(invite_id)
        return {"status": "revoked"}

    @app.post(c.REVOKE_NODE, tags=["operator"], responses=_errors(401, 404))
    def revoke_node(node_id: NodePath, _a: Admin) -> dict[str, str]:
        coord.revoke_node(node_id)
        return {"status": "revoked"}

    @app.post(c.TRUST_NODE, tags=["operator"], responses=_errors(400, 401, 404, 413))
    def trust_node(node_id: NodePath, body: TrustIn, _a: Admin) -> dict[str, str]:
        """Mark a node trusted (or not) for the first and last stage (--trusted-ends)."""
        coord.set_trusted(node_id, body.trusted)
        return {"status": "trusted" if body.trusted else "not trusted"}

    @app.post(c.NAME_NODE, tags=["operator"], responses=_errors(400, 401, 404, 413))
    def name_node(node_id: NodePath, body: NameIn, _a: Admin) -> dict[str, str]:
        """Name a node as the operator knows it (at first, its invite's note)."""
        return {"name": coord.rename_node(node_id, body.name)}

    @app.delete(c.NODE, tags=["operator"], responses=_errors(401, 404, 409))
    def forget_node(node_id: NodePath, _a: Admin) -> dict[str, str]:
        """Forget a gone or revoked node: out of the registry and the page for good
        (its certificates revoked); 409 for a node that is alive, stale or paused."""
        coord.forget_node(node_id)
        return {"status": "forgotten"}

    @app.get(c.EVENTS, response_model=list[EventOut], tags=["operator"], responses=_errors(401))
    def events(
        _a: Admin,
        # The events table's ids are 32-bit integers on PostgreSQL.
        after: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
        limit: Annotated[int, Query(ge=1, le=500)] = 200,
    ) -> list[EventOut]:
        """The swarm's story, oldest first: the newest `limit` events with ids above
        `after` (joins, downloads, pauses, deaths, promotions, re-plans, ...)."""
        return [
            EventOut(
                id=e.id,
                at=e.at,
                kind=e.kind,
                label=KINDS[e.kind].label if e.kind in KINDS else e.kind,
                tone=KINDS[e.kind].tone if e.kind in KINDS else "info",
                node_id=e.node_id,
                detail=e.detail,
            )
            for e in coord.events(after, limit)
        ]

    @app.get(c.SWARM, response_model=SwarmOut, tags=["operator"], responses=_errors(401))
    def swarm(_a: Admin) -> SwarmOut:
        return swarm_out(coord)


def _invite_out(row: InviteRecord, code: str | None = None) -> InviteOut:
    return InviteOut(
        id=row.id,
        role=row.role,
        uses_left=row.uses_left,
        max_uses=row.max_uses,
        expires_at=row.expires_at,
        revoked=row.revoked,
        note=row.note,
        code=code,
    )
