"""The chat window's controller: one answer at a time through the swarm, its tokens as
Qt signals, and how it ended and how fast it went (Finish, ChatStats)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from PySide6.QtCore import QObject, Signal

from app.client.connect import ChatConnection, ChatConnector
from app.client.generation import SuspectTokens, apply_event
from app.node_status import plain_reason
from app.ui.controllers import AsyncThread, Mailbox
from core.repetition_guard import looping_tail
from core.tokenizer import Tokenizer
from core.types import SamplingParams

log = logging.getLogger(__name__)


class Finish:
    """Why an answer ended (ChatStats.finish)."""

    END = "end"
    """The model ended its turn."""
    LENGTH = "length"
    """Cut at the token limit: the answer may be unfinished."""
    LOOP = "loop"
    """Ended by the loop guard (core.repetition_guard): the answer repeated itself."""
    STOPPED = "stopped"
    """The person pressed Stop."""


@dataclass(frozen=True)
class ChatStats:
    tokens: int
    first_token_ms: float
    tokens_per_s: float
    stages: int
    stopped: bool = False
    finish: str = Finish.END
    sampling: str = ""
    """The sampling the answer used, in words (`sampling_words`)."""


@dataclass(frozen=True)
class ChatProgress:
    """While an answer streams: tokens so far and the rate since the first one."""

    tokens: int
    first_token_ms: float
    tokens_per_s: float


def sampling_words(params: SamplingParams, source: str = "") -> str:
    """A sampling setting as the chat window's footer says it."""
    if params.greedy:
        text = "greedy"
    else:
        text = f"temperature {params.temperature:g}, top p {params.top_p:g}"
        if params.top_k:
            text += f", top k {params.top_k}"
    if params.repetition_penalty != 1.0:
        text += f", repetition penalty {params.repetition_penalty:g}"
    return f"{text} ({source})" if source else text


class ChatController(QObject):
    """One chat at a time through the swarm; tokens stream back as signals."""

    text = Signal(str)
    taken_back = Signal(str)
    """The answer so far is only this text: a stage found faulty computed the rest,
    which comes again from a chain without it."""
    """A piece of the answer (decoded, UTF-8 safe)."""
    progress = Signal(object)
    """ChatProgress, as tokens arrive (at most once per batch of tokens)."""
    finished = Signal(object)
    """ChatStats, also after Stop."""
    failed = Signal(str)
    busy_changed = Signal(bool)

    def __init__(
        self, runner: AsyncThread, connector: ChatConnector | None, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self._mailbox = Mailbox(self._dispatch, self)
        self.runner = runner
        self.connector = connector
        self._conn: ChatConnection | None = None
        self._job: concurrent.futures.Future[None] | None = None

    @property
    def busy(self) -> bool:
        return self._job is not None and not self._job.done()

    def _dispatch(self, item: object) -> None:
        """Loop-thread events, re-emitted in the Qt thread as the public signals."""
        assert isinstance(item, tuple)
        kind, value = item
        if kind == "text":
            self.text.emit(value)
        elif kind == "taken_back":
            self.taken_back.emit(value)
        elif kind == "progress":
            self.progress.emit(value)
        elif kind == "finished":
            self.finished.emit(value)
        elif kind == "failed":
            self.failed.emit(value)
        elif kind == "idle":
            self.busy_changed.emit(self.busy)

    def set_connector(self, connector: ChatConnector | None) -> None:
        self.connector = connector
        conn, self._conn = self._conn, None
        if conn is not None:
            self.runner.submit(conn.close())

    def send(
        self,
        messages: Sequence[tuple[str, str]],
        sampling: SamplingParams | None = None,
        max_tokens: int = 256,
    ) -> None:
        """Ask; `sampling` None: the model's recommended sampling (its GGUF, else its
        model card, else core.sampling_defaults.FALLBACK)."""
        if self.busy:
            return
        if self.connector is None:
            self.failed.emit("Not connected to a swarm: join one first (tray menu, Join a swarm).")
            return
        self.busy_changed.emit(True)
        job = self.runner.submit(self._generate(list(messages), sampling, max_tokens))
        job.add_done_callback(lambda _f: self._mailbox.post(("idle", None)))
        self._job = job

    def stop(self) -> None:
        if self._job is not None:
            self._job.cancel()

    async def _generate(
        self, messages: list[tuple[str, str]], sampling: SamplingParams | None, max_tokens: int
    ) -> None:
        t0 = time.perf_counter()
        first_ms = 0.0
        t_first = t0
        n = 0
        stages = 0
        finish = Finish.LENGTH
        words = ""
        try:
            if self._conn is None:
                assert self.connector is not None
                self._conn = await self.connector()
            conn = self._conn
            stages = conn.stages
            tok = conn.tokenizer
            if sampling is None:
                recommended = tok.recommended_sampling()
                sampling, words = (
                    recommended.params,
                    sampling_words(recommended.params, recommended.source),
                )
            else:
                words = sampling_words(sampling)
            if not sampling.greedy:
                # A fresh draw per answer, as the API does: asking again gives another
                # answer instead of the same one word for word.
                sampling = replace(sampling, seed=secrets.randbits(63))
            ids = _encode(tok, messages)
            streamer = tok.streamer()
            answer: list[int] = []
            generated: list[int] = []
            stream = conn.client.generate(ids, max_tokens, sampling, is_end=tok.is_end)
            try:
                async for ev in stream:
                    apply_event(generated, ev)
                    if isinstance(ev, SuspectTokens):
                        # A stage found faulty computed these: the window shows the
                        # answer without them, and the ones computed again follow.
                        answer = [t for t in generated if not tok.is_end(t)]
                        n = len(generated)
                        streamer = tok.streamer()
                        kept = "".join(streamer.push(t) for t in answer)
                        self._mailbox.post(("taken_back", kept))
                        continue
                    for t in ev.tokens:
                        if n == 0:
                            t_first = time.perf_counter()
                            first_ms = (t_first - t0) * 1e3
                        n += 1
                        if tok.is_end(t):
                            finish = Finish.END
                            continue
                        answer.append(t)
                        piece = streamer.push(t)
                        if piece:
                            self._mailbox.post(("text", piece))
                        # Checked token by token: where the answer is cut must not
                        # depend on how the swarm grouped its tokens into messages.
                        if looping_tail(answer):
                            finish = Finish.LOOP
                            break
                    if ev.tokens:
                        progress = ChatProgress(n, first_ms, _rate(n, t_first))
                        self._mailbox.post(("progress", progress))
                    if finish == Finish.LOOP:
                        break  # closing the stream ends the session on the swarm
            finally:
                close = getattr(stream, "aclose", None)
                if close is not None:  # ends the session on the swarm when cut short
                    await close()
            rest = streamer.flush()
            if rest:
                self._mailbox.post(("text", rest))
            if finish == Finish.LENGTH and n < max_tokens:
                finish = Finish.END  # the swarm ended the answer before the limit
            stats = ChatStats(n, first_ms, _rate(n, t_first), stages, finish=finish, sampling=words)
            self._mailbox.post(("finished", stats))
        except asyncio.CancelledError:
            stats = ChatStats(
                n,
                first_ms,
                _rate(n, t_first),
                stages,
                stopped=True,
                finish=Finish.STOPPED,
                sampling=words,
            )
            self._mailbox.post(("finished", stats))
            raise
        except Exception as exc:
            log.warning("chat failed: %s", exc)
            conn_, self._conn = self._conn, None
            if conn_ is not None:
                await conn_.close()
            self._mailbox.post(("failed", plain_reason(exc)))

    def shutdown(self) -> None:
        self.stop()
        conn, self._conn = self._conn, None
        if conn is not None and self.runner.running:
            with contextlib.suppress(Exception):
                self.runner.submit(conn.close()).result(5)


def _encode(tok: Tokenizer, messages: list[tuple[str, str]]) -> list[int]:
    """The conversation in the model's chat template; plain text where it has none
    (llama.cpp's fallback template can abort on tiny vocabularies)."""
    if tok.chat_template():
        return tok.encode_chat(messages)
    return tok.encode("\n".join(text for _r, text in messages))


def _rate(n: int, t_first: float) -> float:
    elapsed = time.perf_counter() - t_first
    return (n - 1) / elapsed if n > 1 and elapsed > 0 else 0.0
