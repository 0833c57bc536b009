"""An OpenAI-compatible HTTP API on localhost, answered by the swarm.

`create_openai_app(backend)` serves `GET /v1/models`, `GET /v1/models/{id}`,
`POST /v1/chat/completions` and `POST /v1/completions`, streamed (Server-Sent Events,
ending with `data: [DONE]`) and not, so tools written for OpenAI work unchanged with
`base_url="http://127.0.0.1:PORT/v1"` and any API key. `SwarmBackend` answers through
the client library (`app.client.swarm_client.SwarmClient`): one connection to the route, many
requests over it, several at once (each request is its own session on the workers).
Request bodies are parsed and checked in app.api.openai_requests; app.api.openai_serve runs
the app with uvicorn and holds the `sangama api` entry points.

How OpenAI's parameters map onto Sangama:

- `messages` -> the model's chat template (`Tokenizer.encode_chat`); text content only
  (a string, or a list of `{"type": "text"}` parts); `developer` is treated as `system`.
  `prompt` (completions) -> `Tokenizer.encode`: a string, or one list of token ids.
- `max_completion_tokens`, else `max_tokens`, else `default_max_tokens`; always clamped
  so prompt plus answer fit the workers' context (`context_length`).
- `temperature` (default 1, as OpenAI's; 0 = greedy), `top_p` (0 = greedy) and `seed`
  (default: a fresh random seed per request) map one to one.
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
  formats. Any `model` name is accepted and answered by the swarm's model (tools often
  hard-code one); responses name the real model.

Errors are OpenAI-shaped: `{"error": {"message", "type", "param", "code"}}` with a 4xx
status for bad requests, 503 when the swarm fails (`ClientError`: a stage unreachable,
failed or silent), with the reason. A failure after a stream has begun arrives as one
`data: {"error": ...}` event (the openai client raises it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

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
from app.client.answer_client import AnswerClient
from app.client.recovering import RecoveringClient, RouteSource
from app.client.swarm_client import ChannelDialer, SwarmClient
from app.config import Route
from app.errors import ClientError, RouteUnavailable, StageFailed, StageTimeout
from core.admission import LLAMA_MAX_SEQ
from core.drafting import DEFAULT_GUESSES
from core.tokenizer import Tokenizer
from core.types import SamplingParams
from net.channel import NodeCredentials
from net.errors import ErrorCode
from net.quic import QuicTuning
from net.tensors import WireDtype

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000
DEFAULT_MAX_TOKENS = 512
"""Answer length when a request names none (OpenAI's default is "until the context is full";
a swarm of home PCs is slow, so we stop earlier)."""
DEFAULT_CONTEXT = 2048
"""Workers' default n_ctx (`WorkerConfig.n_ctx`)."""


# ----------------------------------------------------------------------------- backend


class Backend(Protocol):
    """What the API needs from a model server."""

    @property
    def model_name(self) -> str: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def context_length(self) -> int | None:
        """Prompt plus answer tokens a session may hold; None if unknown."""
        ...

    def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams
    ) -> AsyncIterator[list[int]]:
        """Tokens as they come, stopping at max_tokens or an end-of-generation token.
        Raises `ClientError` when the model cannot answer."""
        ...


async def _aclose(it: object) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        await close()


def model_name_of(route: Route) -> str:
    """A model id for `/v1/models`: the file's stem for a GGUF path, else the route's name."""
    return Path(route.model).stem if route.model.endswith(".gguf") else route.model


class SwarmBackend:
    """Serves API requests through one `SwarmClient` connection, opened on first use.

    Requests run concurrently (up to `max_concurrent`, by default as many as a stage
    holds sessions, each a session of its own on the workers, which batch them; the
    workers' admission refuses what does not fit, as OVERLOADED with a retry hint).
    If the route is lost (a link dies, a stage stops answering), the connection is
    dropped and the next request reconnects, asking `refresh_route` for a new route
    first when given one (a joined client asks the coordinator). With a `route_source`
    (a joined client: the coordinator's route avoiding given nodes) a running answer
    survives a stage dying: it pauses and continues on a replacement chain
    (app.client.recovering).
    """

    def __init__(
        self,
        creds: NodeCredentials,
        route: Route,
        tokenizer: Tokenizer,
        *,
        model_name: str | None = None,
        context_length: int | None = DEFAULT_CONTEXT,
        tuning: QuicTuning = QuicTuning(),
        dialer: ChannelDialer | None = None,
        refresh_route: Callable[[], Awaitable[Route]] | None = None,
        max_concurrent: int = LLAMA_MAX_SEQ,
        wire_dtype: WireDtype = WireDtype.F32,
        first_token_timeout: float = 60.0,
        step_timeout: float = 40.0,
        route_source: RouteSource | None = None,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be >= 1")
        self.creds = creds
        self.route = route
        self._tokenizer = tokenizer
        self._model_name = model_name or model_name_of(route)
        self._context_length = context_length
        self.tuning = tuning
        self.wire_dtype = wire_dtype
        self.first_token_timeout = first_token_timeout
        self.step_timeout = step_timeout
        self._dialer = dialer
        self._refresh_route = refresh_route
        self._route_source = route_source
        self._client: AnswerClient | None = None
        self._stale = False
        self._connect_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._active = 0

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def context_length(self) -> int | None:
        return self._context_length

    def _make(self) -> AnswerClient:
        if self._route_source is not None:
            return RecoveringClient(
                self.creds,
                self.route,
                self._route_source,
                tuning=self.tuning,
                dialer=self._dialer,
                step_timeout=self.step_timeout,
                first_token_timeout=self.first_token_timeout,
                guesses=DEFAULT_GUESSES,
            )
        return SwarmClient(
            self.creds,
            self.route,
            self.tuning,
            first_token_timeout=self.first_token_timeout,
            step_timeout=self.step_timeout,
            dialer=self._dialer,
            guesses=DEFAULT_GUESSES,
        )

    async def _connected(self) -> AnswerClient:
        async with self._connect_lock:
            if self._client is None:
                if self._stale and self._refresh_route is not None:
                    self.route = await self._refresh_route()
                client = self._make()
                try:
                    await client.connect()
                except ClientError:
                    self._stale = True
                    raise
                self._client = client
                self._stale = False
            return self._client

    async def _reroute(self, client: AnswerClient) -> None:
        """Ask for a fresh route; if it differs (the coordinator re-planned around a lost
        stage), reconnect along it on the next request."""
        if self._refresh_route is None:
            return
        try:
            route = await self._refresh_route()
        except Exception as exc:  # the coordinator is unreachable too: keep the old route
            log.warning("could not refresh the route: %s", exc)
            return
        if route != self.route and self._client is client:
            self.route = route
            self._client = None
            await client.close()

    async def _drop(self, client: AnswerClient) -> None:
        if self._client is client:
            self._client = None
            self._stale = True
            await client.close()

    async def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams
    ) -> AsyncIterator[list[int]]:
        async with self._slots:
            client = await self._connected()
            events = client.generate(
                prompt_ids,
                max_tokens,
                sampling,
                self.wire_dtype,
                is_end=self._tokenizer.is_end,
            )
            self._active += 1
            try:
                async for event in events:
                    yield list(event.tokens)
            except (RouteUnavailable, StageTimeout):
                await self._drop(client)  # the route is gone: reconnect on the next request
                raise
            except StageFailed as exc:
                if exc.error_code is ErrorCode.STAGE_ERROR:  # e.g. a stage lost its next hop
                    await self._reroute(client)
                raise
            finally:
                self._active -= 1
                await _aclose(events)  # sends CLOSE when the caller stops early

    @property
    def active_sessions(self) -> int:
        """Requests being answered now (a status line for the app)."""
        return self._active

    async def aclose(self) -> None:
        async with self._connect_lock:
            if self._client is not None:
                await self._client.close()
                self._client = None


# ----------------------------------------------------------------------------- generation


class StopCutter:
    """Cuts text before the first stop string; holds back what may start one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Text safe to emit now, and whether a stop string was found."""
        buf = self._held + text
        hits = [i for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            self._held = ""
            return buf[: min(hits)], True
        keep = 0
        for k in range(min(len(buf), max((len(s) for s in self.stops), default=1) - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                keep = k
                break
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


class Generation:
    """One request's answer as text deltas; `finish_reason` and token counts once done."""

    def __init__(
        self,
        backend: Backend,
        prompt_ids: list[int],
        max_tokens: int,
        sampling: SamplingParams,
        stops: Sequence[str],
    ) -> None:
        self.backend = backend
        self.prompt_tokens = len(prompt_ids)
        self.max_tokens = max_tokens
        self.completion_tokens = 0
        self.finish_reason: Literal["stop", "length"] = "length"
        self._tokens = backend.generate(prompt_ids, max_tokens, sampling)
        self._first: list[int] | None = None
        self._started = False
        self._stops = stops

    async def start(self) -> None:
        """Wait for the first tokens, so that a failing swarm is still an HTTP error."""
        self._started = True
        try:
            self._first = await anext(self._tokens)
        except StopAsyncIteration:
            self._first = []
        except BaseException:
            await self.aclose()
            raise

    async def _next_batch(self) -> list[int] | None:
        if not self._started:
            await self.start()
        if self._first is not None:
            first, self._first = self._first, None
            return first
        try:
            return await anext(self._tokens)
        except StopAsyncIteration:
            return None

    async def aclose(self) -> None:
        """End the session on the swarm (the client sends CLOSE) if it still runs."""
        await _aclose(self._tokens)

    async def deltas(self) -> AsyncIterator[str]:
        tok = self.backend.tokenizer
        streamer = tok.streamer()
        cutter = StopCutter(self._stops)
        done = False
        try:
            while not done and (batch := await self._next_batch()) is not None:
                for t in batch:
                    self.completion_tokens += 1
                    if tok.is_end(t):
                        self.finish_reason = "stop"
                        done = True
                        break
                    text, hit = cutter.push(streamer.push(t))
                    if text:
                        yield text
                    if hit:
                        self.finish_reason = "stop"
                        return
                    if self.completion_tokens >= self.max_tokens:
                        done = True
                        break
        finally:
            await self.aclose()
        text, hit = cutter.push(streamer.flush())
        if hit:
            self.finish_reason = "stop"
        else:
            text += cutter.flush()
        if text:
            yield text

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


# ----------------------------------------------------------------------------- the app


class _ClosingStream(StreamingResponse):
    """Closes its body when the response ends, even when the caller hung up mid-stream,
    so the session on the swarm ends at once rather than whenever the GC gets to it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await _aclose(self.body_iterator)


def _sse(obj: object) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def create_openai_app(
    backend: Backend, *, default_max_tokens: int = DEFAULT_MAX_TOKENS, title: str = "Sangama"
) -> FastAPI:
    """The OpenAI-compatible API over `backend` (serve it with uvicorn, or `serve_api`)."""
    app = FastAPI(title=f"{title} OpenAI-compatible API", version="1")
    created_at = int(time.time())

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

    def model_card() -> dict[str, Any]:
        return {
            "id": backend.model_name,
            "object": "model",
            "created": created_at,
            "owned_by": "sangama",
        }

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id != backend.model_name:
            raise ApiError(
                404, f"model {model_id!r} does not exist", code="model_not_found", param="model"
            )
        return model_card()

    def budget(req: CommonRequest, prompt_ids: list[int], requested: int | None) -> int:
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
        req: CommonRequest, prompt_ids: list[int], max_tokens: int, kind: Literal["chat", "text"]
    ) -> Response:
        gen = Generation(backend, prompt_ids, max_tokens, sampling_of(req), stop_strings(req))
        ident = f"chatcmpl-{uuid.uuid4().hex}" if kind == "chat" else f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = backend.model_name
        try:
            await gen.start()
        except ClientError as exc:
            raise swarm_error(exc) from None
        if not req.stream:
            try:
                text = "".join([d async for d in gen.deltas()])
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
                await _aclose(deltas)
                await gen.aclose()

        return _ClosingStream(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatRequest) -> Response:
        check_common(req)
        ids = chat_prompt(req, backend.tokenizer)
        return await answer(
            req, ids, budget(req, ids, req.max_completion_tokens or req.max_tokens), "chat"
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> Response:
        check_common(req)
        ids = completion_prompt(req, backend.tokenizer)
        return await answer(req, ids, budget(req, ids, req.max_tokens), "text")

    return app


# ----------------------------------------------------------------------------- serving
