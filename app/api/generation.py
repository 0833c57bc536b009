"""One request's answer as text: token batches from a `Backend` turned into text deltas,
cut at stop strings (`StopCutter`), with the finish reason and usage counts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Literal

from app.api.swarm_backend import Backend, aclose_stream
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
        await aclose_stream(self._tokens)

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
