"""An answer taken back (a stage that computed part of it was found faulty): a whole
answer keeps only the tokens computed again in its place; a stream, which cannot unsay
what it sent, ends with a typed error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.generation import Generation
from app.api.openai_api import create_openai_app
from app.client.generation import SuspectTokens
from app.errors import AnswerWithdrawn
from core.types import SamplingParams
from tests.support.letter_tokens import LetterTokenizer

pytestmark = pytest.mark.unit

A, B, X = 0, 1, 23
"""Letters a, b and x."""


class _Backend:
    """Sends `before`, takes back all but its first `keep` tokens, then sends `after`."""

    def __init__(self, before: list[int], keep: int, after: list[int]) -> None:
        self.model_name = "tiny"
        self.tokenizer: Any = LetterTokenizer()
        self.context_length = 128
        self.script: list[list[int] | SuspectTokens] = [
            *([t] for t in before),
            SuspectTokens(keep, len(before) - keep, ("liar",)),
            *([t] for t in after),
        ]

    async def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams
    ) -> AsyncIterator[list[int] | SuspectTokens]:
        for item in self.script:
            yield item


def _text(backend: _Backend, stops: Sequence[str] = ()) -> tuple[str, Generation]:
    gen = Generation(backend, [A], 16, SamplingParams(), stops)
    return asyncio.run(gen.text()), gen


def test_a_whole_answer_keeps_the_tokens_computed_again() -> None:
    text, gen = _text(_Backend([A, X, X], 1, [B, B]))
    assert text == "abb"
    assert gen.completion_tokens == 3 and gen.taken_back == 1


def test_text_held_back_for_a_stop_string_is_held_again_after_taking_back() -> None:
    # "ab" may start the stop string "abc": held back, then taken back with the b; the
    # answer computed again is "aa", which does not stop.
    text, gen = _text(_Backend([A, B], 1, [A]), stops=["abc"])
    assert text == "aa" and gen.finish_reason == "length"


def test_a_stream_ends_with_a_typed_error() -> None:
    gen = Generation(_Backend([A, X], 1, [B]), [A], 16, SamplingParams(), ())
    sent: list[str] = []

    async def stream() -> None:
        async for piece in gen.deltas():
            sent.append(piece)

    with pytest.raises(AnswerWithdrawn, match="found faulty"):
        asyncio.run(stream())
    assert sent == ["a", "x"]


def test_the_api_answers_with_the_text_computed_again() -> None:
    app = create_openai_app([_Backend([A, X, X], 1, [B])])
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with TestClient(app) as client:
        answer = client.post("/v1/chat/completions", json=body).json()
    assert answer["choices"][0]["message"]["content"] == "ab"
