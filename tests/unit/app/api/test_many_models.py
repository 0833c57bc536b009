"""The OpenAI-compatible API over a swarm of several models: `/v1/models` lists each, a
request's `model` picks one, an unknown name is a 404 in OpenAI's error shape; with one
model any name is answered by it, as before."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.openai_api import create_openai_app
from core.types import SamplingParams
from tests.support.letter_tokens import LetterTokenizer

pytestmark = pytest.mark.unit


class _Backend:
    """Answers every prompt with its own letter, repeated."""

    def __init__(self, name: str, letter: int) -> None:
        self.model_name = name
        self.tokenizer: Any = LetterTokenizer()
        self.context_length = 128
        self.letter = letter

    async def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams
    ) -> AsyncIterator[list[int]]:
        for _ in range(max_tokens):
            yield [self.letter]


def _ask(client: TestClient, model: str) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    return client.post("/v1/chat/completions", json=body)


def test_each_model_is_listed_and_a_request_picks_one_by_name() -> None:
    app = create_openai_app([_Backend("tiny8", 0), _Backend("tiny4", 1)])
    with TestClient(app) as client:
        listed = client.get("/v1/models").json()
        assert [m["id"] for m in listed["data"]] == ["tiny8", "tiny4"]
        assert client.get("/v1/models/tiny4").json()["id"] == "tiny4"
        a, b = _ask(client, "tiny8").json(), _ask(client, "tiny4").json()
        assert (a["model"], a["choices"][0]["message"]["content"]) == ("tiny8", "aaa")
        assert (b["model"], b["choices"][0]["message"]["content"]) == ("tiny4", "bbb")
        text = client.post(
            "/v1/completions", json={"model": "tiny4", "prompt": "x", "max_tokens": 2}
        )
        assert text.json()["choices"][0]["text"] == "bb"
        assert _ask(client, "default").json()["model"] == "tiny8"  # the swarm's first
        unknown = _ask(client, "gpt-4o")
        assert unknown.status_code == 404
        error = unknown.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert error["type"] == "invalid_request_error" and "tiny8, tiny4" in error["message"]
        assert client.get("/v1/models/gpt-4o").status_code == 404


def test_with_one_model_any_name_is_answered_by_it() -> None:
    with TestClient(create_openai_app(_Backend("tiny8", 2))) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny8"]
        answer = _ask(client, "gpt-4o").json()
        assert answer["model"] == "tiny8" and answer["choices"][0]["message"]["content"] == "ccc"
