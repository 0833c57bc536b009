"""The OpenAI-compatible API over a real loopback swarm, driven by the official `openai` client.

A static 3-stage swarm (Gemma 3 270M) runs in a background thread's event loop with the
API served by uvicorn on a free localhost port; the tests talk to it as any OpenAI tool
would. A fake backend (failing, or never ending) and a swarm losing a stage show how
failures and callers hanging up are handled. A 2-stage swarm of the default model
(SmolLM2 135M Instruct) shows a chat answered through its own template.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TypeVar

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.api.generation import StopCutter
from app.api.openai_serve import serve_api
from app.api.swarm_backend import Backend, SwarmBackend
from app.config import Route
from app.errors import Overloaded, RouteUnavailable, StageTimeout
from app.lab.local_swarm import LocalSwarm
from core.tokenizer import Tokenizer
from core.types import SamplingParams

pytestmark = pytest.mark.integration

CUTS = [0, 6, 12, 18]
MODEL = "gemma-3-270m"
PROMPT = "The capital of France is"
QUESTION = "Name three colours of the rainbow."

B = TypeVar("B", bound=Backend)
API_KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@contextlib.contextmanager
def _api_in_thread(
    make_backend: Callable[[], AbstractAsyncContextManager[B]],
) -> Iterator[tuple[str, B]]:
    """Serve `make_backend()` on a free port from a background event loop; yield the base
    URL and the backend."""
    ready: Future[tuple[str, B, asyncio.AbstractEventLoop, asyncio.Event]] = Future()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        async with make_backend() as backend:

            def announce(port: int) -> None:
                ready.set_result((f"http://127.0.0.1:{port}/v1", backend, loop, stop))

            await serve_api(backend, "127.0.0.1", 0, api_key=API_KEY, stop=stop, ready=announce)

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        if not ready.done():
            ready.set_exception(RuntimeError("the API stopped before it was ready"))

    thread = threading.Thread(target=run, name="openai-api", daemon=True)
    thread.start()
    url, backend, loop, stop = ready.result(timeout=300)
    try:
        yield url, backend
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
        assert not thread.is_alive(), "the API and its swarm stop when asked"


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=120)


# ----------------------------------------------------------------------------- the swarm


@pytest.fixture(scope="module")
def tokenizer(gemma_path: Path) -> Iterator[Tokenizer]:
    tok = Tokenizer.from_gguf(gemma_path)
    yield tok
    tok.close()


@pytest.fixture(scope="module")
def swarm(gemma_path: Path) -> Iterator[tuple[str, SwarmBackend]]:
    @contextlib.asynccontextmanager
    async def backend() -> AsyncIterator[SwarmBackend]:
        async with LocalSwarm(model=str(gemma_path), cuts=CUTS) as swarm:
            assert swarm.route is not None and swarm.client_credentials is not None
            tok = Tokenizer.from_gguf(gemma_path)
            served = SwarmBackend(
                swarm.client_credentials, swarm.route, tok, model_name=MODEL, tuning=swarm.tuning
            )
            try:
                yield served
            finally:
                await served.aclose()
                tok.close()

    with _api_in_thread(backend) as served:
        yield served


@pytest.fixture(scope="module")
def swarm_api(swarm: tuple[str, SwarmBackend]) -> str:
    return swarm[0]


def test_models_lists_the_swarm_model(swarm_api: str) -> None:
    client = _client(swarm_api)
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_completion_streamed_equals_non_streamed(swarm_api: str, tokenizer: Tokenizer) -> None:
    client = _client(swarm_api)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": QUESTION},
    ]
    whole = client.chat.completions.create(
        model="gpt-4o-mini", messages=messages, temperature=0, max_tokens=24
    )
    assert whole.object == "chat.completion" and whole.model == MODEL
    (choice,) = whole.choices
    text = choice.message.content
    assert choice.message.role == "assistant"
    assert isinstance(text, str) and text.strip()
    assert choice.finish_reason in ("stop", "length")
    usage = whole.usage
    assert usage is not None
    prompt_ids = tokenizer.encode_chat([("system", "Answer briefly."), ("user", QUESTION)])
    assert usage.prompt_tokens == len(prompt_ids)
    assert 1 <= usage.completion_tokens <= 24
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 24

    chunks = list(
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,
            temperature=0,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == choice.finish_reason and not any(finishes[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage.model_dump() == usage.model_dump()


def test_completions_endpoint_streamed_and_not(swarm_api: str, tokenizer: Tokenizer) -> None:
    client = _client(swarm_api)
    whole = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=12)
    assert whole.object == "text_completion"
    (choice,) = whole.choices
    assert choice.text.strip() and choice.finish_reason in ("stop", "length")
    assert whole.usage is not None and whole.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    streamed = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=12, stream=True
    )
    parts = [c.choices[0] for c in streamed]
    assert "".join(p.text for p in parts) == choice.text
    assert parts[-1].finish_reason == choice.finish_reason
    # A prompt as token ids answers the same.
    by_ids = client.completions.create(
        model=MODEL, prompt=tokenizer.encode(PROMPT), temperature=0, max_tokens=12
    )
    assert by_ids.choices[0].text == choice.text


def test_stop_string_cuts_the_output_and_ends_the_answer(swarm_api: str) -> None:
    client = _client(swarm_api)
    full = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=24)
    text = full.choices[0].text
    assert full.usage is not None
    # A stop string from the middle of the greedy answer (its first occurrence not at 0).
    stop = next(
        s
        for i in range(len(text) // 2, 0, -1)
        if (s := text[i : i + 3]).strip() and text.find(s) > 0
    )
    expected = text[: text.find(stop)]
    cut = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=24, stop=[stop, "never seen"]
    )
    assert cut.choices[0].text == expected
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage is not None and cut.usage.completion_tokens < full.usage.completion_tokens
    streamed = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=24, stop=stop, stream=True
    )
    parts = [c.choices[0] for c in streamed]
    assert "".join(p.text for p in parts) == expected
    assert parts[-1].finish_reason == "stop"


def test_unsupported_parameters_are_refused_openai_style(swarm_api: str) -> None:
    client = _client(swarm_api)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=4
        )
    assert info.value.status_code == 400
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=5)
    r = httpx.post(f"{swarm_api}/chat/completions", json={"model": MODEL}, headers=AUTH, timeout=30)
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_concurrent_requests_share_the_connection(swarm_api: str) -> None:
    client = _client(swarm_api)

    def ask(seed: int) -> str:
        r = client.completions.create(
            model=MODEL, prompt=PROMPT, temperature=0.8, seed=seed, max_tokens=8
        )
        return r.choices[0].text

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(ask, [1, 2, 3]))
    assert all(a.strip() for a in answers)


# ----------------------------------------------------------------------------- failures


class _FakeBackend:
    """Fails to connect ("connect"), fails after its first tokens ("midway"), or never
    ends ("endless"), counting the sessions it closed."""

    model_name = "fake"
    context_length = 64

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.mode = "connect"
        self.closed = 0

    async def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams
    ) -> AsyncIterator[list[int]]:
        if self.mode == "connect":
            raise RouteUnavailable("stage1 could not be reached")
        if self.mode == "overloaded":
            raise Overloaded("all 256 sessions of this stage are in use", 2500, True)
        hello = self.tokenizer.encode(" Hello", add_special=False)
        try:
            yield hello
            if self.mode == "midway":
                raise StageTimeout("no answer from the route within 15 s")
            while True:  # "endless": max_tokens is the caller's to enforce
                await asyncio.sleep(0.01)
                yield hello
        finally:
            self.closed += 1


@pytest.fixture(scope="module")
def fake_api(tokenizer: Tokenizer) -> Iterator[tuple[str, _FakeBackend]]:
    @contextlib.asynccontextmanager
    async def backend() -> AsyncIterator[_FakeBackend]:
        yield _FakeBackend(tokenizer)

    with _api_in_thread(backend) as served:
        yield served


def test_swarm_failures_are_503_with_the_reason(fake_api: tuple[str, _FakeBackend]) -> None:
    url, fake = fake_api
    client = _client(url)
    fake.mode = "connect"
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}])
    assert info.value.status_code == 503
    assert "stage1 could not be reached" in info.value.message
    fake.mode = "midway"
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model="x", prompt="Hi")
    stream = client.completions.create(model="x", prompt="Hi", stream=True)
    with pytest.raises(openai.APIError, match="no answer from the route"):
        for _ in stream:
            pass
    # A full swarm: still a 503, with the stage's retry hint as Retry-After (seconds).
    fake.mode = "overloaded"
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model="x", prompt="Hi")
    assert info.value.status_code == 503 and info.value.response.headers["retry-after"] == "3"
    assert "256 sessions" in info.value.message
    fake.mode = "midway"
    # A prompt longer than the context is the caller's error, not the swarm's.
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model="x", prompt="word " * 100)


def _wait_until(check: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_caller_hanging_up_ends_the_session(fake_api: tuple[str, _FakeBackend]) -> None:
    url, fake = fake_api
    fake.mode = "endless"
    before = fake.closed
    body = {"model": "x", "prompt": "Hi", "max_tokens": 10_000, "stream": True}
    for _ in range(3):
        with httpx.stream("POST", f"{url}/completions", json=body, headers=AUTH, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: {") and next(lines) == ""
    # The endless sessions end only when the API closes them.
    _wait_until(lambda: fake.closed == before + 3, "every abandoned session is closed")
    # max_tokens ends an endless backend too, and closes its session.
    r2 = _client(url).completions.create(model="x", prompt="Hi", max_tokens=5)
    assert r2.choices[0].finish_reason == "length" and r2.usage is not None
    assert r2.usage.completion_tokens == 5
    _wait_until(lambda: fake.closed == before + 4, "the finished session is closed")


def test_abandoned_swarm_streams_end_their_sessions(swarm: tuple[str, SwarmBackend]) -> None:
    url, backend = swarm
    # More abandoned streams than the backend runs at once (4) and the workers hold (8);
    # each sends CLOSE when its caller hangs up, so none keeps writing a long answer.
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1500, "stream": True}
    for _ in range(10):
        with httpx.stream("POST", f"{url}/completions", json=body, headers=AUTH, timeout=120) as r:
            assert r.status_code == 200
            assert next(r.iter_lines()).startswith("data: {")
    _wait_until(lambda: backend.active_sessions == 0, "no session left running")
    r2 = _client(url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    assert r2.choices[0].text


# ----------------------------------------------------------------------------- stop strings


@pytest.mark.parametrize(
    ("pieces", "stops", "expected"),
    [
        (["Hel", "lo wor", "ld"], ["o w"], ("Hell", True)),
        (["ab", "c"], ["bcd"], ("abc", False)),
        (["x##", "#y"], ["###"], ("x", True)),
        (["plain"], [], ("plain", False)),
    ],
)
def test_stop_cutter(pieces: list[str], stops: list[str], expected: tuple[str, bool]) -> None:
    cutter = StopCutter(stops)
    out, hit = "", False
    for p in pieces:
        text, hit = cutter.push(p)
        out += text
        if hit:
            break
    if not hit:
        out += cutter.flush()
    assert (out, hit) == expected


def test_a_stage_vanishing_is_a_503_with_the_reason(gemma_path: Path) -> None:
    swarm = LocalSwarm(model=str(gemma_path), cuts=CUTS)
    refreshed: list[Route] = []

    @contextlib.asynccontextmanager
    async def backend() -> AsyncIterator[SwarmBackend]:
        async with swarm:
            assert swarm.route is not None and swarm.client_credentials is not None
            route = swarm.route

            async def refresh() -> Route:  # a coordinator that has not re-planned yet
                refreshed.append(route)
                return route

            tok = Tokenizer.from_gguf(gemma_path)
            served = SwarmBackend(
                swarm.client_credentials,
                route,
                tok,
                tuning=swarm.tuning,
                refresh_route=refresh,
                first_token_timeout=10,
                step_timeout=5,
            )
            try:
                yield served
            finally:
                await served.aclose()
                tok.close()

    with _api_in_thread(backend) as (url, _served):
        client = _client(url)
        assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).choices
        swarm.kill(1)
        for _ in range(2):
            with pytest.raises(openai.InternalServerError) as info:
                client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8)
            assert info.value.status_code == 503
            assert "stage1" in info.value.message
    assert refreshed, "a stage error makes the backend ask for a fresh route"


# ------------------------------------------------- the default model answers through the API


@pytest.fixture(scope="module")
def smollm2_api(smollm2_path: Path) -> Iterator[str]:
    """A 2-stage swarm of the default model, SmolLM2 135M Instruct, behind the API."""

    @contextlib.asynccontextmanager
    async def backend() -> AsyncIterator[SwarmBackend]:
        async with LocalSwarm(model=str(smollm2_path), cuts=[0, 15, 30]) as swarm:
            assert swarm.route is not None and swarm.client_credentials is not None
            tok = Tokenizer.from_gguf(smollm2_path)
            served = SwarmBackend(swarm.client_credentials, swarm.route, tok, tuning=swarm.tuning)
            try:
                yield served
            finally:
                await served.aclose()
                tok.close()

    with _api_in_thread(backend) as (url, _):
        yield url


def test_the_default_model_answers_a_chat_and_stops_at_its_end_of_turn(smollm2_api: str) -> None:
    client = _client(smollm2_api)
    (model,) = [m.id for m in client.models.list()]
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        max_tokens=48,
        temperature=0,
        # Plain greedy: without it the model's recommended repetition penalty applies.
        extra_body={"repetition_penalty": 1.0},
    )
    answer = r.choices[0].message.content or ""
    # ChatML from the GGUF's template: an answer, not the question continued or echoed,
    # and it ends on <|im_end|> (finish_reason "stop"), which is not part of the text.
    assert "4" in answer and "What is 2 + 2" not in answer, answer
    assert r.choices[0].finish_reason == "stop", answer
    assert r.usage is not None and r.usage.completion_tokens < 48
    assert "<|im_end|>" not in answer and "<|im_start|>" not in answer
