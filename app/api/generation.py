"""One request's answer as text: token batches from a `Backend` turned into text deltas,
cut at stop strings (`StopCutter`), with the finish reason and usage counts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Literal

from app.api.swarm_backend import Backend, aclose_stream
from app.client.generation import SuspectTokens
from app.errors import AnswerWithdrawn
from core.types import SamplingParams


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
        self.taken_back = 0
        """Times the answer was taken back to fewer tokens (a faulty stage found)."""
        self._first: list[int] | SuspectTokens | None = None
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

    async def _next_batch(self) -> list[int] | SuspectTokens | None:
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
        await aclose_stream(self._tokens)

    async def deltas(self) -> AsyncIterator[str]:
        """The answer's text as it comes (a stream): tokens taken back after they were
        sent (a stage found faulty computed them) end it with `AnswerWithdrawn`."""
        async for _, text in self._pieces():
            if text is None:
                raise AnswerWithdrawn(
                    "a stage that computed part of this answer was found faulty by a spot "
                    "check; ask again for an answer from a chain without it"
                )
            yield text

    async def text(self) -> str:
        """The whole answer (not streamed): tokens taken back are replaced by the ones
        computed again without the faulty stage, as if they had never come."""
        parts: list[tuple[int, str]] = []
        async for at, text in self._pieces():
            if text is None:
                parts = [(k, t) for k, t in parts if k <= at]
                self.taken_back += 1
            else:
                parts.append((at, text))
        return "".join(t for _, t in parts)

    async def _pieces(self) -> AsyncIterator[tuple[int, str | None]]:
        """(tokens of the answer so far, text they let out); (first, None) when the
        answer is taken back to its first `first` tokens."""
        tok = self.backend.tokenizer
        ids: list[int] = []
        streamer = tok.streamer()
        cutter = StopCutter(self._stops)
        done = False
        try:
            while not done and (batch := await self._next_batch()) is not None:
                if isinstance(batch, SuspectTokens):
                    # Back to the state after the kept tokens: the text they let out
                    # is kept by the caller, what they held back is held again.
                    del ids[batch.first :]
                    streamer, cutter = tok.streamer(), StopCutter(self._stops)
                    for t in ids:
                        cutter.push(streamer.push(t))
                    self.completion_tokens = len(ids)
                    yield len(ids), None
                    continue
                for t in batch:
                    ids.append(t)
                    self.completion_tokens += 1
                    if tok.is_end(t):
                        self.finish_reason = "stop"
                        done = True
                        break
                    text, hit = cutter.push(streamer.push(t))
                    if text:
                        yield self.completion_tokens, text
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
            yield self.completion_tokens, text

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
