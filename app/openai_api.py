"""An OpenAI-compatible HTTP API on localhost, answered by the swarm.

`create_openai_app(backend)` serves `GET /v1/models`, `GET /v1/models/{id}`,
`POST /v1/chat/completions` and `POST /v1/completions`, streamed (Server-Sent Events,
ending with `data: [DONE]`) and not, so tools written for OpenAI work unchanged with
`base_url="http://127.0.0.1:PORT/v1"` and any API key. `SwarmBackend` answers through
the client library (`app.client.SwarmClient`): one connection to the route, many
requests over it, several at once (each request is its own session on the workers).

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
import contextlib
import json
import logging
import secrets
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from app.client import SwarmClient
from app.config import Route
from app.errors import ClientError, RouteUnavailable, StageFailed, StageTimeout
from core.tokenizer import Message, Tokenizer
from core.types import SamplingParams
from net.channel import Channel, NodeCredentials
from net.errors import ErrorCode
from net.quic import QuicTuning
from net.tensors import WireDtype

if TYPE_CHECKING:
    from app.identity import Identity

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000
DEFAULT_MAX_TOKENS = 512
"""Answer length when a request names none (OpenAI's default is "until the context is full";
a swarm of home PCs is slow, so we stop earlier)."""
DEFAULT_CONTEXT = 2048
"""Workers' default n_ctx (`WorkerConfig.n_ctx`)."""
MAX_STOPS = 4


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

    Requests run concurrently (up to `max_concurrent`, each a session of its own on the
    workers, which batch them). If the route is lost (a link dies, a stage stops
    answering), the connection is dropped and the next request reconnects, asking
    `refresh_route` for a new route first when given one (a joined client asks the
    coordinator).
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
        dialer: Callable[[str, tuple[str, int]], Awaitable[Channel]] | None = None,
        refresh_route: Callable[[], Awaitable[Route]] | None = None,
        max_concurrent: int = 4,
        wire_dtype: WireDtype = WireDtype.F32,
        first_token_timeout: float = 60.0,
        step_timeout: float = 40.0,
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
        self._client: SwarmClient | None = None
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

    async def _connected(self) -> SwarmClient:
        async with self._connect_lock:
            if self._client is None:
                if self._stale and self._refresh_route is not None:
                    self.route = await self._refresh_route()
                client = SwarmClient(
                    self.creds,
                    self.route,
                    self.tuning,
                    first_token_timeout=self.first_token_timeout,
                    step_timeout=self.step_timeout,
                    dialer=self._dialer,
                )
                try:
                    await client.connect()
                except ClientError:
                    self._stale = True
                    raise
                self._client = client
                self._stale = False
            return self._client

    async def _reroute(self, client: SwarmClient) -> None:
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

    async def _drop(self, client: SwarmClient) -> None:
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
                if exc.code == ErrorCode.STAGE_ERROR.name:  # e.g. a stage lost its next hop
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


# ----------------------------------------------------------------------------- errors


class ApiError(Exception):
    """Answered as `{"error": {...}}` with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _swarm_error(exc: ClientError) -> ApiError:
    return ApiError(503, f"the swarm could not answer: {exc}", "server_error", "swarm_unavailable")


# ----------------------------------------------------------------------------- requests


class _StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extensions (llama.cpp server names), sent through `extra_body`.
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, lt=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)


class _ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_Common):
    messages: list[_ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


def _check_common(req: _Common) -> None:
    if req.n is not None and req.n != 1:
        raise _bad("only n=1 is supported", "n")
    if req.logit_bias:
        raise _bad("logit_bias is not supported", "logit_bias")


def _stops(req: _Common) -> list[str]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > MAX_STOPS:
        raise _bad(f"at most {MAX_STOPS} stop sequences", "stop")
    return [s for s in stops if s]


def _sampling(req: _Common) -> SamplingParams:
    temperature = 1.0 if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    if top_p == 0.0:  # only the most likely token: greedy
        temperature, top_p = 0.0, 1.0
    penalty = req.repetition_penalty or req.repeat_penalty
    if penalty is None:
        extra = (req.frequency_penalty or 0.0) + (req.presence_penalty or 0.0)
        penalty = min(3.0, max(0.5, 1.0 + extra / 2))
    seed = secrets.randbits(63) if req.seed is None else req.seed % (1 << 64)
    try:
        return SamplingParams(
            temperature=temperature,
            top_k=req.top_k or 0,
            top_p=top_p,
            min_p=req.min_p or 0.0,
            repetition_penalty=penalty,
            seed=seed,
        )
    except ValueError as exc:
        raise _bad(str(exc)) from None


def _message_text(msg: _ChatMessage, index: int) -> str:
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    parts = []
    for part in msg.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise _bad(
                f"only text content is supported (message {index} has a {part.get('type')!r} part)",
                f"messages[{index}].content",
            )
        parts.append(part["text"])
    return "".join(parts)


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def chat_prompt(req: ChatRequest, tokenizer: Tokenizer) -> list[int]:
    if req.logprobs or req.top_logprobs:
        raise _bad("logprobs are not supported", "logprobs")
    if req.functions or (req.tools and req.tool_choice != "none"):
        raise _bad("tools and functions are not supported", "tools")
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise _bad("only the text response format is supported", "response_format")
    messages: list[Message] = []
    for i, msg in enumerate(req.messages):
        role = _ROLES.get(msg.role)
        if role is None:
            raise _bad(f"unsupported role {msg.role!r}", f"messages[{i}].role")
        messages.append((role, _message_text(msg, i)))
    return tokenizer.encode_chat(messages)


def completion_prompt(req: CompletionRequest, tokenizer: Tokenizer) -> list[int]:
    if req.logprobs:
        raise _bad("logprobs are not supported", "logprobs")
    if req.echo:
        raise _bad("echo is not supported", "echo")
    if req.suffix:
        raise _bad("suffix is not supported", "suffix")
    if req.best_of is not None and req.best_of != 1:
        raise _bad("only best_of=1 is supported", "best_of")
    prompt: Any = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # one prompt in a batch of one
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        ids = [int(t) for t in prompt]
        if any(not 0 <= t < tokenizer.n_vocab for t in ids):
            raise _bad(f"token ids must be in [0, {tokenizer.n_vocab})", "prompt")
        return ids
    raise _bad("prompt must be one string or one list of token ids", "prompt")


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
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        where = ".".join(loc) or None
        message = f"{where}: {first.get('msg', 'invalid')}" if where else "invalid request body"
        return JSONResponse(_bad(message, where).body(), status_code=400)

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

    def budget(req: _Common, prompt_ids: list[int], requested: int | None) -> int:
        if not prompt_ids:
            raise _bad("the prompt is empty", "prompt")
        limit = backend.context_length
        if limit is not None and len(prompt_ids) >= limit:
            raise _bad(
                f"the prompt has {len(prompt_ids)} tokens; this swarm's context holds {limit}",
                "messages",
                "context_length_exceeded",
            )
        n = requested or default_max_tokens
        return min(n, limit - len(prompt_ids)) if limit is not None else n

    async def answer(
        req: _Common, prompt_ids: list[int], max_tokens: int, kind: Literal["chat", "text"]
    ) -> Response:
        gen = Generation(backend, prompt_ids, max_tokens, _sampling(req), _stops(req))
        ident = f"chatcmpl-{uuid.uuid4().hex}" if kind == "chat" else f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model = backend.model_name
        try:
            await gen.start()
        except ClientError as exc:
            raise _swarm_error(exc) from None
        if not req.stream:
            try:
                text = "".join([d async for d in gen.deltas()])
            except ClientError as exc:
                raise _swarm_error(exc) from None
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
                yield _sse(_swarm_error(exc).body())
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
        _check_common(req)
        ids = chat_prompt(req, backend.tokenizer)
        return await answer(
            req, ids, budget(req, ids, req.max_completion_tokens or req.max_tokens), "chat"
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> Response:
        _check_common(req)
        ids = completion_prompt(req, backend.tokenizer)
        return await answer(req, ids, budget(req, ids, req.max_tokens), "text")

    return app


# ----------------------------------------------------------------------------- serving


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: `serve_api`'s caller decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_api(
    backend: Backend,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[int], None] | None = None,
    log_level: str = "warning",
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
) -> None:
    """Serve the API in the running loop until `stop` is set (default: SIGINT or SIGTERM).

    `ready` gets the bound port once the socket listens (useful with port 0). Localhost
    by default: the API has no authentication of its own (any API key is accepted).
    """
    loop = asyncio.get_running_loop()
    signals: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
                signals.append(sig)
            except (NotImplementedError, RuntimeError):  # Windows, or not the main thread
                break
    app = create_openai_app(backend, default_max_tokens=default_max_tokens)
    sock = _listen_socket(host, port)  # bound here, so "port in use" is a plain OSError
    bound = int(sock.getsockname()[1])
    server = _Server(
        uvicorn.Config(app, host=host, port=bound, log_level=log_level, timeout_graceful_shutdown=5)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    stopping = asyncio.create_task(stop.wait())
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started and ready is not None:
            ready(bound)
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()
        for sig in signals:
            loop.remove_signal_handler(sig)


def _listen_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


# ----------------------------------------------------------------------------- commands


def _announce(host: str, n_stages: int) -> Callable[[int], None]:
    def say(port: int) -> None:
        print(
            f"OpenAI-compatible API on http://{host}:{port}/v1 for a {n_stages}-stage swarm "
            "(any API key); Ctrl+C to stop",
            flush=True,
        )

    return say


async def serve_identity(
    identity: Identity,
    route: Route,
    tokenizer_path: Path,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    max_concurrent: int = 4,
    stop: asyncio.Event | None = None,
    ready: Callable[[int], None] | None = None,
) -> None:
    """The API as a joined client: links through the coordinator (ICE for peers behind
    NAT), a fresh route from the coordinator after the old one fails. Until `stop` is set
    (default: SIGINT or SIGTERM). Used by `sangama api`, `sangama demo --api-port` and the
    desktop app (submit it to the app's loop with its own `stop` event)."""
    from app.coordinated import fetch_route
    from app.links import channel_dialer, start_links

    loop = asyncio.get_running_loop()

    async def refresh() -> Route:
        new_route, _ = await loop.run_in_executor(None, fetch_route, identity)
        return new_route

    creds = identity.credentials()
    tokenizer = Tokenizer.from_gguf(tokenizer_path)
    try:
        link_dialer, router = await start_links(identity.client(), creds, QuicTuning())
        backend = SwarmBackend(
            creds,
            route,
            tokenizer,
            dialer=channel_dialer(link_dialer),
            refresh_route=refresh,
            max_concurrent=max_concurrent,
        )
        try:
            await serve_api(
                backend, host, port, stop=stop, ready=ready or _announce(host, len(route.stages))
            )
        finally:
            await backend.aclose()
            await router.stop()
    finally:
        tokenizer.close()


async def serve_joined_client(
    identity_dir: Path, host: str = "127.0.0.1", port: int = DEFAULT_PORT, max_concurrent: int = 4
) -> int:
    """`sangama api --identity DIR`: fetch the route, then serve until SIGINT or SIGTERM."""
    from app.coordinated import fetch_route
    from app.identity import Identity

    loop = asyncio.get_running_loop()
    me = await loop.run_in_executor(None, Identity.load, identity_dir)
    route, tokenizer_path = await loop.run_in_executor(None, fetch_route, me)
    await serve_identity(me, route, tokenizer_path, host, port, max_concurrent=max_concurrent)
    return 0


async def serve_static(
    route: Route,
    creds: NodeCredentials,
    tokenizer_path: Path,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    max_concurrent: int = 4,
) -> int:
    """`sangama api --route R --credentials C`: a static swarm (no coordinator)."""
    tokenizer = Tokenizer.from_gguf(tokenizer_path)
    backend = SwarmBackend(creds, route, tokenizer, max_concurrent=max_concurrent)
    try:
        await serve_api(backend, host, port, ready=_announce(host, len(route.stages)))
    finally:
        await backend.aclose()
        tokenizer.close()
    return 0


async def serve_local_swarm(
    model: str, cuts: list[int], host: str = "127.0.0.1", port: int = DEFAULT_PORT
) -> int:
    """`sangama demo --static --api-port P`: a loopback swarm behind the API until SIGINT."""
    from app.local_swarm import LocalSwarm

    print(f"Starting {len(cuts) - 1} workers on loopback (layers cut at {cuts}) ...", flush=True)
    async with LocalSwarm(model=model, cuts=cuts, threads=1) as swarm:
        assert swarm.route is not None and swarm.client_credentials is not None
        tokenizer = Tokenizer.from_gguf(Path(swarm.route.model))
        backend = SwarmBackend(
            swarm.client_credentials, swarm.route, tokenizer, tuning=swarm.tuning
        )
        try:
            await serve_api(backend, host, port, ready=_announce(host, len(swarm.workers)))
        finally:
            await backend.aclose()
            tokenizer.close()
    print("all workers stopped cleanly", flush=True)
    return 0


def run_api_cli(
    *,
    identity: Path | None,
    route_path: Path | None,
    credentials: Path | None,
    node_id: str,
    model: str | None,
    host: str,
    port: int,
    max_concurrent: int = 4,
) -> int:
    """`sangama api`: as a joined client (`identity`) or along a static route file."""
    if identity is not None:
        return asyncio.run(serve_joined_client(identity, host, port, max_concurrent))
    from app.credentials import load_credentials
    from app.errors import ConfigError
    from core.models import resolve_model

    if route_path is None or credentials is None:
        raise ConfigError("give --identity (a joined client) or --route with --credentials")
    route = Route.load(route_path)
    creds = load_credentials(credentials, node_id)
    tokenizer_path = resolve_model(model or route.model)
    return asyncio.run(serve_static(route, creds, tokenizer_path, host, port, max_concurrent))
