"""The joined nodes' HTTP routes: heartbeats and assignments, certificate renewal,
incidents, the relay's credentials, signals between nodes, routes, models, manifests and
pieces. Each parses the request, calls the Coordinator and shapes its answer.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse

from coordinator import contract as c
from coordinator.contract import (
    MAX_ANSWER_REASON,
    Assignment,
    Heartbeat,
    HeartbeatAnswer,
    JoinAnswer,
    ModelsAnswer,
    PieceSources,
    RouteAnswer,
    Signal,
    SignalPost,
    TurnAnswer,
)
from coordinator.releases import RELEASE_HEADER
from coordinator.server.api_callers import NodeId, NodePath, admit_release
from coordinator.server.api_models import HeartbeatIn, IncidentIn, RenewIn, SignalIn
from coordinator.server.api_models import documented_errors as _errors
from coordinator.server.piece_peers import asked_bytes
from coordinator.server.remote_model import local_piece, piece_response
from coordinator.server.service import Coordinator


def add_node_routes(app: FastAPI, coord: Coordinator) -> None:
    @app.post(
        c.HEARTBEAT,
        response_model=HeartbeatAnswer,
        tags=["nodes"],
        responses=_errors(400, 401, 403, 413, 426, 429),
    )
    def heartbeat(
        node_id: NodePath, body: HeartbeatIn, who: NodeId, request: Request
    ) -> HeartbeatAnswer:
        if node_id != who:
            raise HTTPException(403, "a node may only report for itself")
        admit_release(request.headers.get(RELEASE_HEADER), coord.settings.min_release)
        found = coord.heartbeat(who, Heartbeat(**body.model_dump()))
        return HeartbeatAnswer(
            assignment=found,
            revoked_serials=tuple(coord.revoked_serials()),
            standby=None if found is not None else coord.standby_assignment(who),
            latest_release=coord.settings.latest_release,
            min_release=coord.settings.min_release,
            can_answer=coord.answer.can_answer,
            answer_since=int(coord.answer.since),
            answer_reason=coord.answer.reason[:MAX_ANSWER_REASON],
            check_asks=coord.spot.asks_for(who),
        )

    @app.get(
        c.ASSIGNMENT,
        response_model=Assignment | None,
        tags=["nodes"],
        responses=_errors(401, 403),
    )
    def assignment(node_id: NodePath, who: NodeId) -> Assignment | None:
        if node_id != who:
            raise HTTPException(403, "a node may only ask for its own assignment")
        return coord.assignment(who)

    @app.post(
        c.RENEW,
        response_model=JoinAnswer,
        tags=["nodes"],
        responses=_errors(400, 401, 413),
    )
    def renew(
        node_id: NodePath, body: RenewIn, authorization: Annotated[str, Header()]
    ) -> JoinAnswer:
        if not authorization.startswith("Bearer "):
            raise HTTPException(401, "node token required")
        return coord.renew(node_id, authorization[7:], body.csr_pem)

    @app.post(c.INCIDENTS, tags=["nodes"], responses=_errors(400, 401, 403, 413, 429))
    def incident(node_id: NodePath, body: IncidentIn, who: NodeId) -> dict[str, str]:
        """A source of pieces the node gave up on: onto the operator's timeline."""
        if node_id != who:
            raise HTTPException(403, "a node may only report for itself")
        coord.report_incident(who, body.source, body.reason)
        return {"status": "recorded"}

    @app.get(
        c.TURN,
        response_model=TurnAnswer,
        tags=["nodes"],
        responses=_errors(401, 404),
    )
    def turn(who: NodeId) -> TurnAnswer:
        creds = coord.turn_credentials(who)
        if creds is None:
            raise HTTPException(404, "this swarm has no relay")
        return creds

    @app.post(c.SIGNAL_TO, tags=["nodes"], responses=_errors(400, 401, 403, 404, 413, 429))
    def signal(peer_id: NodePath, body: SignalIn, who: NodeId) -> dict[str, str]:
        coord.post_signal(who, peer_id, SignalPost(**body.model_dump()))
        return {"status": "queued"}

    @app.get(c.SIGNALS, response_model=list[Signal], tags=["nodes"], responses=_errors(401))
    async def signals(
        who: NodeId, wait: float = Query(default=0.0, ge=0.0, le=25.0)
    ) -> list[Signal]:
        """Messages for this node; waits up to `wait` seconds for the first (long poll)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            taken = coord.take_signals(who)
            if taken or loop.time() >= deadline:
                return taken
            await asyncio.sleep(0.1)

    @app.get(c.REVOKED, response_model=list[str], tags=["nodes"], responses=_errors(401))
    def revoked(_who: NodeId) -> list[str]:
        return coord.revoked_serials()

    @app.get(c.ROUTE, response_model=RouteAnswer, tags=["nodes"], responses=_errors(401, 404))
    def route(
        who: NodeId,
        model: str = "default",
        avoid: Annotated[list[str] | None, Query(max_length=16)] = None,
    ) -> RouteAnswer:
        # A client that found stages dead asks around them (at most 16 ids).
        return coord.route(model, tuple(a[:64] for a in (avoid or [])), asker=who)

    @app.get(c.MODELS, response_model=ModelsAnswer, tags=["nodes"], responses=_errors(401))
    def models(_who: NodeId) -> ModelsAnswer:
        """Every model this swarm serves, the default (the first `--model`) first; for
        joined nodes, like the routes and manifests."""
        return coord.models_answer()

    @app.get(c.MANIFEST, tags=["nodes"], responses=_errors(401, 404))
    def manifest(name: str, _who: NodeId) -> Response:
        model = coord.hosted(name).model
        return Response(model.manifest.to_json(), media_type="application/json")

    @app.get(c.PIECE, tags=["nodes"], responses=_errors(401, 404))
    def piece(name: str, file: str, _who: NodeId, request: Request) -> Response:
        model = coord.hosted(name).model
        known = {p.file: p.size for p in model.manifest.pieces}
        if file not in known:
            raise HTTPException(404, f"no piece {file!r}")
        coord.pieces.served(asked_bytes(request.headers.get("range"), known[file]))
        remote = model.remote
        if remote is not None and local_piece(model.directory, file, known[file]) is None:
            # Registered by URL, no copy kept: built from its header and the mirror.
            return piece_response(remote, file, request.headers.get("range"))
        return FileResponse(model.directory / file, media_type="application/octet-stream")

    @app.get(
        c.PIECE_SOURCES, response_model=PieceSources, tags=["nodes"], responses=_errors(401, 404)
    )
    def piece_sources(name: str, file: str, who: NodeId) -> PieceSources:
        """Where to get one piece, best first: peers that hold it, the mirror, us."""
        model = coord.hosted(name).model
        if file not in {p.file for p in model.manifest.pieces}:
            raise HTTPException(404, f"no piece {file!r}")
        return PieceSources(file, tuple(coord.piece_sources(who, file, name)))
