"""OpenAI request bodies: their models, what Sangama refuses, and how each parameter
maps onto the swarm (sampling, stop strings, prompts). See app.api.openai_api for the table."""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.errors import ClientError, Overloaded
from core.sampling_defaults import FALLBACK
from core.tokenizer import Message, Tokenizer
from core.types import SamplingParams

MAX_STOPS = 4


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
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers or {}
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


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def swarm_error(exc: ClientError) -> ApiError:
    if isinstance(exc, Overloaded):  # nothing ran: the caller may simply try again later
        seconds = max(1, -(-exc.retry_after_ms // 1000))
        return ApiError(
            503,
            f"the swarm is full: {exc.message}",
            "server_error",
            "swarm_overloaded",
            headers={"Retry-After": str(seconds)},
        )
    return ApiError(503, f"the swarm could not answer: {exc}", "server_error", "swarm_unavailable")


# ----------------------------------------------------------------------------- requests


class _StreamOptions(BaseModel):
    include_usage: bool = False


class CommonRequest(BaseModel):
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


class ChatRequest(CommonRequest):
    messages: list[_ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(CommonRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


def check_common(req: CommonRequest) -> None:
    if req.n is not None and req.n != 1:
        raise bad_request("only n=1 is supported", "n")
    if req.logit_bias:
        raise bad_request("logit_bias is not supported", "logit_bias")


def stop_strings(req: CommonRequest) -> list[str]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > MAX_STOPS:
        raise bad_request(f"at most {MAX_STOPS} stop sequences", "stop")
    return [s for s in stops if s]


def sampling_of(req: CommonRequest, recommended: SamplingParams = FALLBACK) -> SamplingParams:
    """The request's sampling; what it leaves out is the model's `recommended` sampling
    (core.sampling_defaults), not OpenAI's temperature 1 (too hot for a small model)."""
    temperature = recommended.temperature if req.temperature is None else req.temperature
    top_p = recommended.top_p if req.top_p is None else req.top_p
    if top_p == 0.0:  # only the most likely token: greedy
        temperature, top_p = 0.0, 1.0
    penalty = req.repetition_penalty or req.repeat_penalty
    if penalty is None and (req.frequency_penalty is not None or req.presence_penalty is not None):
        extra = (req.frequency_penalty or 0.0) + (req.presence_penalty or 0.0)
        penalty = min(3.0, max(0.5, 1.0 + extra / 2))
    if penalty is None:
        penalty = recommended.repetition_penalty
    seed = secrets.randbits(63) if req.seed is None else req.seed % (1 << 64)
    try:
        return SamplingParams(
            temperature=temperature,
            top_k=recommended.top_k if req.top_k is None else req.top_k,
            top_p=top_p,
            min_p=recommended.min_p if req.min_p is None else req.min_p,
            repetition_penalty=penalty,
            seed=seed,
        )
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def _message_text(msg: _ChatMessage, index: int) -> str:
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    parts = []
    for part in msg.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(
                f"only text content is supported (message {index} has a {part.get('type')!r} part)",
                f"messages[{index}].content",
            )
        parts.append(part["text"])
    return "".join(parts)


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def chat_prompt(req: ChatRequest, tokenizer: Tokenizer) -> list[int]:
    if req.logprobs or req.top_logprobs:
        raise bad_request("logprobs are not supported", "logprobs")
    if req.functions or (req.tools and req.tool_choice != "none"):
        raise bad_request("tools and functions are not supported", "tools")
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise bad_request("only the text response format is supported", "response_format")
    messages: list[Message] = []
    for i, msg in enumerate(req.messages):
        role = _ROLES.get(msg.role)
        if role is None:
            raise bad_request(f"unsupported role {msg.role!r}", f"messages[{i}].role")
        messages.append((role, _message_text(msg, i)))
    return tokenizer.encode_chat(messages)


def completion_prompt(req: CompletionRequest, tokenizer: Tokenizer) -> list[int]:
    if req.logprobs:
        raise bad_request("logprobs are not supported", "logprobs")
    if req.echo:
        raise bad_request("echo is not supported", "echo")
    if req.suffix:
        raise bad_request("suffix is not supported", "suffix")
    if req.best_of is not None and req.best_of != 1:
        raise bad_request("only best_of=1 is supported", "best_of")
    prompt: Any = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # one prompt in a batch of one
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        ids = [int(t) for t in prompt]
        if any(not 0 <= t < tokenizer.n_vocab for t in ids):
            raise bad_request(f"token ids must be in [0, {tokenizer.n_vocab})", "prompt")
        return ids
    raise bad_request("prompt must be one string or one list of token ids", "prompt")
