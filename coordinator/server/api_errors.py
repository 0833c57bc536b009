"""What the coordinator's API answers when it refuses a request: the HTTP status of each
of the service's refusals (with Retry-After where waiting helps), validation errors
that never echo a NaN, and 413 for a body over MAX_BODY_BYTES.
"""

from __future__ import annotations

import math

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic_core import to_json
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator import invites as inv
from coordinator.errors import AccessDenied, JoinRefused, NotFound
from coordinator.server.api_models import MAX_BODY_BYTES
from coordinator.server.node_claims import TooFast
from coordinator.server.service import NodeAlive
from coordinator.server.signalling import SignalRefused

_TOO_BIG = f"request body larger than {MAX_BODY_BYTES} bytes"


class LimitBody:
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


def add_error_handlers(app: FastAPI) -> None:
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
