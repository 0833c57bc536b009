"""An OpenAI-compatible HTTP API on localhost, answered by the swarm.

`create_openai_app(backend)` serves `GET /v1/models`, `GET /v1/models/{id}`,
`POST /v1/chat/completions` and `POST /v1/completions`, streamed (Server-Sent Events,
ending with `data: [DONE]`) and not, so tools written for OpenAI work unchanged with
`base_url="http://127.0.0.1:PORT/v1"` and the API's key (app.api.access). `SwarmBackend`
(app.api.swarm_backend) answers through the client library: one connection to the route,
many requests over it, several at once (each request is its own session on the workers);
app.api.generation turns its tokens into text deltas cut at stop strings. Request bodies
are parsed and checked in app.api.openai_requests; app.api.openai_serve runs the app with
uvicorn and holds the `sangama api` entry points.

How OpenAI's parameters map onto Sangama:

- `messages` -> the model's chat template (`Tokenizer.encode_chat`); text content only
  (a string, or a list of `{"type": "text"}` parts); `developer` is treated as `system`.
  `prompt` (completions) -> `Tokenizer.encode`: a string, or one list of token ids.
- `max_completion_tokens`, else `max_tokens`, else `default_max_tokens`; always clamped
  so prompt plus answer fit the workers' context (`context_length`).
- `temperature` (0 = greedy), `top_p` (0 = greedy) and `seed` (default: a fresh random
  seed per request) map one to one. What a request leaves out (temperature, top_p,
  top_k, min_p, the repetition penalty) is the model's recommended sampling
  (`core.sampling_defaults`: its GGUF's `general.sampling.*` keys, else its model card's,
  else temperature 0.7, top_p 0.9, repetition penalty 1.1), not OpenAI's temperature 1.
- `frequency_penalty` and `presence_penalty` have no exact twin: the last stage applies
  a multiplicative repetition penalty over the recent window (64 tokens). We use
  `repetition_penalty = 1 + (frequency_penalty + presence_penalty) / 2`, clamped to
  [0.5, 3]: 0 and 0 switch it off, positive values discourage repeats, negative ones
  encourage them. The extensions `repetition_penalty` (or llama.cpp's `repeat_penalty`),
  `top_k` and `min_p` may be sent in the body (`extra_body` in the openai client) and
  win over the approximation.
- `stop` (a string or up to 4): the text is cut before the first stop string and the
  generation stops (`finish_reason` "stop"); streamed text is held back only while it
  could still be the start of a stop string.
- `finish_reason` is "stop" for an end-of-generation token or a stop string, else
  "length". `usage` counts prompt tokens and generated tokens (an end token or the token
  that completed a stop string included); streams carry it in a last chunk when
  `stream_options.include_usage` is true.
- Refused with 400: `n` other than 1, `best_of` over 1, `logprobs`/`top_logprobs`,
  `echo`, `suffix`, `logit_bias`, tools and functions, non-text content or response
  formats. `model`: with one model, any name is accepted and answered by it (tools
  often hard-code one); where the swarm serves several (`sangama coordinator --model A
  --model B`), `/v1/models` lists them all and the name picks one ("default": the
  swarm's first), an unknown name answered 404 `model_not_found`. Responses name the real model.

Errors are OpenAI-shaped: `{"error": {"message", "type", "param", "code"}}` with a 4xx
status for bad requests, 503 when the swarm fails (`ClientError`: a stage unreachable,
failed or silent), with the reason. A failure after a stream has begun arrives as one
`data: {"error": ...}` event (the openai client raises it).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from app.api.generation import Generation
from app.api.openai_requests import (
    ApiError,
    ChatRequest,
    CommonRequest,
    CompletionRequest,
    bad_request,
    chat_prompt,
    check_common,
    completion_prompt,
    sampling_of,
    stop_strings,
    swarm_error,
)
from app.api.swarm_backend import Backend, aclose_stream
from app.errors import ClientError

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000
DEFAULT_MAX_TOKENS = 512
"""Answer length when a request names none (OpenAI's default is "until the context is full";
a swarm of home PCs is slow, so we stop earlier)."""


# ----------------------------------------------------------------------------- the app


class _ClosingStream(StreamingResponse):
    """Closes its body when the response ends, even when the caller hung up mid-stream,
    so the session on the swarm ends at once rather than whenever the GC gets to it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await aclose_stream(self.body_iterator)


def _sse(obj: object) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def pick_backend(backends: Sequence[Backend], model: str) -> Backend:
    """The backend a request's `model` names: the only one whatever the name (tools
    hard-code names), else the one of that name, the first (the swarm's default) for
    "default"; 404 `model_not_found` for none."""
    if len(backends) == 1 or model == "default":
        return backends[0]
    for b in backends:
        if b.model_name == model:
            return b
    served = ", ".join(b.model_name for b in backends)
    raise ApiError(
        404,
        f"model {model!r} does not exist; this swarm serves {served}",
        code="model_not_found",
        param="model",
    )


def create_openai_app(
    backend: Backend | Sequence[Backend],
    *,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    title: str = "Sangama",
) -> FastAPI:
    """The OpenAI-compatible API over `backend`, or several, one per model of the swarm
    (the first answers where none is named); serve it with uvicorn, or `serve_api`."""
    app = FastAPI(title=f"{title} OpenAI-compatible API", version="1")
    created_at = int(time.time())
    backends: tuple[Backend, ...] = tuple(backend) if isinstance(backend, Sequence) else (backend,)
    if not backends:
        raise ValueError("the API needs at least one model")

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> Response:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        where = ".".join(loc) or None
        message = f"{where}: {first.get('msg', 'invalid')}" if where else "invalid request body"
        return JSONResponse(bad_request(message, where).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        err = ApiError(exc.status_code, str(exc.detail), "invalid_request_error")
        return JSONResponse(err.body(), status_code=exc.status_code)

    def model_card(b: Backend) -> dict[str, Any]:
        return {
            "id": b.model_name,
            "object": "model",
            "created": created_at,
            "owned_by": "sangama",
        }

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(b) for b in backends]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        for b in backends:
            if model_id == b.model_name:
                return model_card(b)
        raise ApiError(
            404, f"model {model_id!r} does not exist", code="model_not_found", param="model"
        )

    def budget(
        backend: Backend, req: CommonRequest, prompt_ids: list[int], requested: int | None
    ) -> int:
        if not prompt_ids:
            raise bad_request("the prompt is empty", "prompt")
        limit = backend.context_length
        if limit is not None and len(prompt_ids) >= limit:
            raise bad_request(
                f"the prompt has {len(prompt_ids)} tokens; this swarm's context holds {limit}",
                "messages",
                "context_length_exceeded",
            )
        n = requested or default_max_tokens
        return min(n, limit - len(prompt_ids)) if limit is not None else n

    async def answer(
        backend: Backend,
        req: CommonRequest,
        prompt_ids: list[int],
        max_tokens: int,
        kind: Literal["chat", "text"],
    ) -> Response:
        recommended = backend.tokenizer.recommended_sampling().params
        sampling = sampling_of(req, recommended)
        gen = Generation(backend, prompt_ids, max_tokens, sampling, stop_strings(req))
        ident = f"chatcmpl-{uuid.uuid4().hex}" if kind == "chat" else f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = backend.model_name
        try:
            await gen.start()
        except ClientError as exc:
            raise swarm_error(exc) from None
        if not req.stream:
            try:
                text = await gen.text()
            except ClientError as exc:
                raise swarm_error(exc) from None
            finally:
                await gen.aclose()
            if kind == "chat":
                choice: dict[str, Any] = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": gen.finish_reason,
                }
                obj = "chat.completion"
            else:
                choice = {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": gen.finish_reason,
                }
                obj = "text_completion"
            return JSONResponse(
                {
                    "id": ident,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "system_fingerprint": None,
                    "choices": [choice],
                    "usage": gen.usage(),
                }
            )
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        def chunk(delta: dict[str, Any] | str, finish: str | None) -> bytes:
            if kind == "chat":
                c: dict[str, Any] = {"index": 0, "delta": delta}
            else:
                c = {"index": 0, "text": delta}
            c["logprobs"] = None
            c["finish_reason"] = finish
            body: dict[str, Any] = {
                "id": ident,
                "object": obj,
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [c],
            }
            if include_usage:
                body["usage"] = None
            return _sse(body)

        async def events() -> AsyncIterator[bytes]:
            deltas = gen.deltas()
            try:
                if kind == "chat":
                    yield chunk({"role": "assistant", "content": ""}, None)
                async for text in deltas:
                    yield chunk({"content": text} if kind == "chat" else text, None)
                yield chunk({} if kind == "chat" else "", gen.finish_reason)
                if include_usage:
                    yield _sse(
                        {
                            "id": ident,
                            "object": obj,
                            "created": created,
                            "model": model,
                            "system_fingerprint": None,
                            "choices": [],
                            "usage": gen.usage(),
                        }
                    )
                yield b"data: [DONE]\n\n"
            except ClientError as exc:
                log.warning("stream %s failed: %s", ident, exc)
                yield _sse(swarm_error(exc).body())
            finally:  # the caller went away: end the session on the swarm now
                await aclose_stream(deltas)
                await gen.aclose()

        return _ClosingStream(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatRequest) -> Response:
        check_common(req)
        backend = pick_backend(backends, req.model)
        ids = chat_prompt(req, backend.tokenizer)
        wanted = req.max_completion_tokens or req.max_tokens
        return await answer(backend, req, ids, budget(backend, req, ids, wanted), "chat")

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> Response:
        check_common(req)
        backend = pick_backend(backends, req.model)
        ids = completion_prompt(req, backend.tokenizer)
        return await answer(backend, req, ids, budget(backend, req, ids, req.max_tokens), "text")

    return app


# ----------------------------------------------------------------------------- serving
