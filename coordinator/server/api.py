"""HTTP routes: parse the request, call `Coordinator`, shape the answer. No logic here.

The OpenAPI description is served at /openapi.json (FastAPI); the operator page and its
static files come from coordinator/server/web.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import math
import secrets
import threading
import time
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from pydantic_core import to_json
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator import contract as c
from coordinator import invites as inv
from coordinator.contract import (
    MAX_ANSWER_REASON,
    Assignment,
    CaAnswer,
    Heartbeat,
    HeartbeatAnswer,
    InviteCheck,
    JoinAnswer,
    ModelsAnswer,
    PieceSources,
    RouteAnswer,
    RouteAnswerStage,
    Signal,
    SignalPost,
    TurnAnswer,
)
from coordinator.errors import AccessDenied, JoinRefused, NotFound
from coordinator.releases import RELEASE_HEADER, ReleaseRefused, check_release
from coordinator.server.answer_probe import AnswerState
from coordinator.server.api_models import (
    ERROR_REASONS,
    MAX_BODY_BYTES,
    AnswerOut,
    EventOut,
    HeartbeatIn,
    IncidentIn,
    InviteCheckIn,
    InviteIn,
    InviteOut,
    JoinIn,
    LevelOut,
    LoginIn,
    ModelOut,
    NameIn,
    NodeOut,
    PredictionOut,
    RenewIn,
    SignalIn,
    SwarmOut,
    TrustIn,
)
from coordinator.server.api_models import (
    documented_errors as _errors,
)
from coordinator.server.events import KINDS
from coordinator.server.invite_book import InviteRecord, check_invite
from coordinator.server.limits import AttemptLimiter
from coordinator.server.metrics import render_metrics
from coordinator.server.node_claims import TooFast
from coordinator.server.operator_logins import OperatorLogins
from coordinator.server.piece_peers import asked_bytes
from coordinator.server.placement import Plan
from coordinator.server.prediction import Level
from coordinator.server.remote_model import local_piece, piece_response
from coordinator.server.secret_hashes import hash_token
from coordinator.server.service import Coordinator, NodeAlive
from coordinator.server.signalling import SignalRefused
from coordinator.server.spot_api import add_spot_routes
from coordinator.server.store import as_utc, utcnow

_TOO_BIG = f"request body larger than {MAX_BODY_BYTES} bytes"
SESSION_COOKIE = "sangama_session"
ADMIN_TOKEN = "admin_token_hash"


# ---------------------------------------------------------------- who is asking


_FORWARDING_HEADERS = ("x-forwarded-for", "forwarded", "x-real-ip")


def _in(host: str, networks: tuple[str, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(n, strict=False) for n in networks)


def caller_address(request: Request, trusted_proxies: tuple[str, ...]) -> str:
    """Who is asking: the connection's peer, or, where that peer is a configured
    trusted proxy (`--trusted-proxy`), the nearest address in its X-Forwarded-For that
    is not itself a trusted proxy. No header is believed from anyone else: a caller
    would name itself anew on every try and escape every limit."""
    peer = request.client.host if request.client is not None else "unknown"
    if not trusted_proxies or not _in(peer, trusted_proxies):
        return peer
    hops = [h.strip() for h in request.headers.get("x-forwarded-for", "").split(",")]
    for hop in reversed(hops):
        if not hop or _in(hop, trusted_proxies):
            continue
        try:
            return str(ipaddress.ip_address(hop))
        except ValueError:
            return peer  # a hop we cannot read: the proxy itself answers for it
    return peer


def _loopback(request: Request) -> bool:
    """Asked from this machine, and not passed on by a proxy on this machine (which
    would make every caller on the internet look local)."""
    trusted: tuple[str, ...] = request.app.state.coord.settings.trusted_proxies
    host = caller_address(request, trusted)
    peer = request.client.host if request.client is not None else ""
    if not _in(peer, trusted) and any(h in request.headers for h in _FORWARDING_HEADERS):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """An operator: a logged-in browser session or the admin bearer token."""
    if request.cookies.get(SESSION_COOKIE) in request.app.state.sessions:
        return
    stored = request.app.state.coord.store.get_setting(ADMIN_TOKEN)
    bearer = authorization[7:] if authorization and authorization.startswith("Bearer ") else None
    if bearer and stored is not None and hmac.compare_digest(hash_token(bearer), stored):
        return
    raise HTTPException(401, "operator login or admin token required")


def _node(
    request: Request,
    x_sangama_node: Annotated[str | None, Header()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> str:
    """A joined node (worker or client): its id and node token."""
    if not x_sangama_node or not authorization or not authorization.startswith("Bearer "):
        raise HTTPException(401, "node id and node token required")
    request.app.state.coord.authenticate_node(x_sangama_node, authorization[7:])
    return x_sangama_node


Admin = Annotated[None, Depends(_admin)]
NodeId = Annotated[str, Depends(_node)]
InviteId = Annotated[int, PathParam(ge=1, le=2**31 - 1)]  # an INTEGER key fits 32 bits (PostgreSQL)
NodePath = Annotated[str, PathParam(pattern=r"^[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?$")]
"""A node id as net.auth issues them (and so, no NUL for PostgreSQL to choke on)."""


# ---------------------------------------------------------------- the app


class _LimitBody:
    """413 for a body over MAX_BODY_BYTES: announced (Content-Length) or streamed (chunked)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = Headers(scope=scope).get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            too_big = JSONResponse({"detail": _TOO_BIG}, 413)
            return await too_big(scope, receive, send)
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > MAX_BODY_BYTES:  # raised where the route reads its body: a 413 answer
                raise HTTPException(413, _TOO_BIG)
            return message

        await self.app(scope, counted, send)


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
    login_limits, join_limits = AttemptLimiter(5, 60.0), AttemptLimiter(10, 60.0)
    check_limits = AttemptLimiter(10, 60.0)  # invite checks: no guessing codes through it
    limits_lock = threading.Lock()  # sync routes run on a thread pool

    def admit_release(stated: str | None) -> None:
        # 426 Upgrade Required: the node's release is older than this swarm admits.
        try:
            check_release(stated, coord.settings.min_release)
        except ReleaseRefused as exc:
            raise HTTPException(426, str(exc)) from None

    def limited(limiter: AttemptLimiter, request: Request) -> str:
        """The caller, its attempt counted as failed until it succeeds; else a 429."""
        caller = caller_address(request, coord.settings.trusted_proxies)
        with limits_lock:
            wait = limiter.admit(caller, time.monotonic())
        if wait > 0:
            seconds = str(math.ceil(wait))
            raise HTTPException(
                429,
                f"too many failed attempts; try again in {seconds} s",
                headers={"Retry-After": seconds},
            )
        return caller

    def attempt(limiter: AttemptLimiter, caller: str, ok: bool) -> None:
        if ok:  # a failure was counted when the attempt was admitted
            with limits_lock:
                limiter.succeeded(caller)

    app.add_middleware(_LimitBody)

    @app.exception_handler(RequestValidationError)
    async def invalid(_r: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes the input, and a NaN there would break the answer.
        body = to_json({"detail": jsonable_encoder(exc.errors())}, inf_nan_mode="null")
        return Response(body, 422, media_type="application/json")

    @app.exception_handler(inv.InviteError)
    async def invite_error(_r: Request, exc: inv.InviteError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 403)

    @app.exception_handler(AccessDenied)
    async def denied(_r: Request, exc: AccessDenied) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 401)

    @app.exception_handler(NotFound)
    async def not_found(_r: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 404)

    @app.exception_handler(JoinRefused)
    async def refused(_r: Request, exc: JoinRefused) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 400)

    @app.exception_handler(TooFast)
    async def too_fast(_r: Request, exc: TooFast) -> JSONResponse:
        seconds = str(max(1, math.ceil(exc.retry_after_s)))
        return JSONResponse({"detail": str(exc)}, 429, headers={"Retry-After": seconds})

    @app.exception_handler(SignalRefused)
    async def signal_refused(_r: Request, exc: SignalRefused) -> JSONResponse:
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
        return JSONResponse(
            {"detail": str(exc)}, exc.status, headers=headers if exc.status == 429 else None
        )

    @app.exception_handler(NodeAlive)
    async def alive(_r: Request, exc: NodeAlive) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 409)

    @app.exception_handler(ValueError)
    async def bad_value(_r: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 400)

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
        caller = limited(join_limits, request)
        admit_release(request.headers.get(RELEASE_HEADER))
        try:
            answer = coord.join(body.secret, body.csr_pem)
        except inv.InviteError:
            attempt(join_limits, caller, ok=False)
            raise
        attempt(join_limits, caller, ok=True)
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
        caller = limited(check_limits, request)
        found = check_invite(coord.store, body.secret, utcnow())
        attempt(check_limits, caller, ok=found.valid)
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
        if not (coord.settings.metrics_public or _loopback(request)):
            _admin(request, authorization)
        return render_metrics(coord)

    # -- nodes
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
        admit_release(request.headers.get(RELEASE_HEADER))
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

    # -- operator
    @app.post(c.LOGIN, tags=["operator"], responses=_errors(400, 401, 413, 429))
    def login(body: LoginIn, request: Request, response: Response) -> dict[str, str]:
        caller = limited(login_limits, request)
        if not coord.check_admin_password(body.password):
            attempt(login_limits, caller, ok=False)
            raise HTTPException(401, "wrong operator password")
        attempt(login_limits, caller, ok=True)
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
        return _swarm_out(coord)

    add_spot_routes(app, coord, Admin, NodeId, NodePath)

    if web_dir is not None:
        from coordinator.server.web import mount_web

        mount_web(app, web_dir, lambda request: request.cookies.get(SESSION_COOKIE) in sessions)
    return app


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


def _swarm_out(coord: Coordinator) -> SwarmOut:
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
