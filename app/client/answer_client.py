"""What every client front end (chat, the API, the desktop's chat window) needs from a
connection to the swarm: connect, generate, close. `SwarmClient` is one; the
`RecoveringClient` the product uses (app.client.connect) wraps one and continues an
answer on a replacement chain when a stage dies."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from app.client.generation import AnswerEvent
from app.config import Route
from core.guessing import GuessPolicy
from core.types import SamplingParams
from net.wire.tensors import WireDtype


class AnswerClient(Protocol):
    guesses: GuessPolicy
    """Guessing ahead for answers whose generate() does not choose."""

    @property
    def route(self) -> Route: ...

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        sampling: SamplingParams = ...,
        wire_dtype: WireDtype = ...,
        chunk: int = ...,
        is_end: Callable[[int], bool] = ...,
        guesses: GuessPolicy | None = ...,
    ) -> AsyncIterator[AnswerEvent]: ...
