"""One chat turn through a swarm: tokenize, stream the answer, summarise where time went;
and the terminal's form of it, as `sangama chat` and the demos print it."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.client.answer_client import AnswerClient
from app.client.generation import SuspectTokens
from app.client.swarm_client import NO_GUESSES, TokenEvent
from core.guessing import GuessPolicy
from core.repetition_guard import looping_tail
from core.sampling_defaults import SamplingChoice
from core.tokenizer import Tokenizer
from core.types import SamplingParams
from net.wire.tensors import WireDtype

DEMO_SAMPLING = SamplingParams(repetition_penalty=1.2)
"""A mild repetition penalty: reads well on a small base model continuing text."""
DEMO_CHAT_SAMPLING = SamplingParams()
"""Greedy, no penalty, for an instruction-tuned model's answer: a penalty over the
prompt's words (the template's system turn included) steers it off the answer."""

DEMO_QUESTION = "Why do people volunteer? Answer in two sentences."
"""What the demos ask a model that follows chat turns (the default SmolLM2 Instruct)."""
DEMO_CONTINUATION = "Volunteers share their home computers to run one big language model because"
"""A base model (Gemma 3 270M) continues text rather than answering, so it gets a
sentence to finish instead."""


def follows_chat(tokenizer: Tokenizer) -> bool:
    """The model ships its own chat template (instruction-tuned): ask it questions in
    turns. A model without one (Gemma 3 270M, a base model) continues plain text."""
    return tokenizer.has_own_chat_template()


def demo_prompt(tokenizer: Tokenizer, prompt: str | None) -> tuple[str, bool]:
    """The demos' prompt (the given one, else the question or sentence that suits the
    model) and whether to wrap it in the chat template."""
    chat = follows_chat(tokenizer)
    if prompt is None:
        prompt = DEMO_QUESTION if chat else DEMO_CONTINUATION
    return prompt, chat


@dataclass(frozen=True)
class StageTime:
    stage: int
    compute_ms: float
    queue_ms: float


@dataclass(frozen=True)
class ChatReport:
    prompt_tokens: int
    tokens: tuple[int, ...]
    text: str
    first_token_ms: float
    decode_tokens_per_s: float
    trip_ms: float
    """Median client-to-client time of one decode step."""
    stages: tuple[StageTime, ...]
    """Median per-stage compute and queueing over decode steps."""
    finish: str = "end"
    """"end" (the model ended its turn), "length" (cut at max_tokens) or "loop" (ended
    by the loop guard, core.repetition_guard)."""

    @property
    def network_and_handling_ms(self) -> float:
        return max(0.0, self.trip_ms - sum(s.compute_ms + s.queue_ms for s in self.stages))

    def table(self) -> str:
        """The seeds' "where the time goes" table for one decode step."""
        lines = [f"{'where the time goes (median decode step)':44} {'ms':>8}"]
        for s in self.stages:
            lines.append(f"  stage from layer {s.stage:<3} compute{'':15} {s.compute_ms:8.2f}")
            lines.append(
                f"  stage from layer {s.stage:<3} waiting in worker{'':5} {s.queue_ms:8.2f}"
            )
        lines.append(f"  network and handling (rest){'':16} {self.network_and_handling_ms:8.2f}")
        lines.append(f"  {'total trip':42} {self.trip_ms:8.2f}")
        return "\n".join(lines)


def _median_stages(events: list[TokenEvent]) -> tuple[StageTime, ...]:
    if not events:
        return ()
    per: dict[int, list[tuple[float, float]]] = {}
    for ev in events:
        for t in ev.timings:
            per.setdefault(t.stage, []).append((t.compute_ms, t.queue_ms))
    return tuple(
        StageTime(stage, statistics.median(c for c, _ in v), statistics.median(q for _, q in v))
        for stage, v in sorted(per.items())
    )


async def chat_once(
    client: AnswerClient,
    tokenizer: Tokenizer,
    prompt: str,
    *,
    chat_format: bool = True,
    max_tokens: int = 64,
    sampling: SamplingParams = SamplingParams(),
    wire_dtype: WireDtype = WireDtype.F32,
    stream: Callable[[str], None] | None = None,
    guesses: GuessPolicy = NO_GUESSES,
) -> ChatReport:
    ids = tokenizer.encode_chat([("user", prompt)]) if chat_format else tokenizer.encode(prompt)
    streamer = tokenizer.streamer()
    tokens: list[int] = []
    events: list[TokenEvent] = []
    t0 = time.perf_counter()
    first_ms = 0.0
    t_first = t0
    finish = "length"
    answer: list[int] = []
    generation = client.generate(
        ids, max_tokens, sampling, wire_dtype, is_end=tokenizer.is_end, guesses=guesses
    )
    try:
        async for ev in generation:
            if isinstance(ev, SuspectTokens):
                # A stage found faulty computed these: they come again from a chain
                # without it; the terminal says so and starts the answer's text over.
                del tokens[ev.first :]
                answer = [t for t in tokens if not tokenizer.is_end(t)]
                streamer = tokenizer.streamer()
                if stream is not None:
                    stream(
                        f"\n[{ev.count} tokens taken back: {', '.join(ev.nodes)} was found "
                        "faulty; the answer again from a chain without it]\n"
                    )
                    stream("".join(streamer.push(t) for t in answer))
                continue
            if not tokens:
                t_first = time.perf_counter()
                first_ms = (t_first - t0) * 1e3
            else:
                events.append(ev)
            for tok in ev.tokens:
                tokens.append(tok)
                if tokenizer.is_end(tok):
                    finish = "end"
                    continue
                answer.append(tok)
                if stream is not None:
                    stream(streamer.push(tok))
                # Token by token: the cut must not depend on how tokens were grouped.
                if looping_tail(answer):
                    finish = "loop"
                    break
            if finish == "loop":
                break
    finally:
        close = getattr(generation, "aclose", None)
        if close is not None:  # ends the session on the swarm when cut short
            await close()
    if finish == "length" and len(tokens) < max_tokens:
        finish = "end"
    if stream is not None:
        stream(streamer.flush())
    decode_s = time.perf_counter() - t_first
    n_decode = sum(len(e.tokens) for e in events)
    return ChatReport(
        prompt_tokens=len(ids),
        tokens=tuple(tokens),
        text=tokenizer.decode([t for t in tokens if not tokenizer.is_end(t)]),
        first_token_ms=first_ms,
        decode_tokens_per_s=n_decode / decode_s if decode_s > 0 and n_decode else 0.0,
        trip_ms=statistics.median(e.trip_ms for e in events) if events else 0.0,
        stages=_median_stages(events),
        finish=finish,
    )


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


async def stream_answer(
    client: AnswerClient,
    tokenizer: Tokenizer,
    prompt: str,
    max_tokens: int,
    dtype: WireDtype,
    *,
    chat_format: bool | None = None,
    sampling: SamplingParams | SamplingChoice | None = None,
    guesses: GuessPolicy = NO_GUESSES,
) -> ChatReport:
    """One answer streamed to stdout as it arrives: how both demos and `sangama chat` ask.
    chat_format None: the chat template when the model ships one (an instruction-tuned
    model answers), else plain text continued with a mild repetition penalty. A
    SamplingChoice is resolved against the model's recommended sampling."""
    if chat_format is None:
        chat_format = follows_chat(tokenizer)
    if isinstance(sampling, SamplingChoice):
        sampling = sampling.resolve(tokenizer.recommended_sampling().params)
    if sampling is None:
        sampling = DEMO_CHAT_SAMPLING if chat_format else DEMO_SAMPLING
    return await chat_once(
        client,
        tokenizer,
        prompt,
        chat_format=chat_format,
        max_tokens=max_tokens,
        sampling=sampling,
        wire_dtype=dtype,
        stream=_write,
        guesses=guesses,
    )


def print_report(report: ChatReport, n_stages: int) -> None:
    """After the streamed answer: speed, then the seeds' "where the time goes" table."""
    if report.finish == "length":
        print("\n[cut at the token limit: --max-tokens gives longer answers]", flush=True)
    elif report.finish == "loop":
        print("\n[ended early: the answer kept repeating itself]", flush=True)
    print(
        f"\n\n{len(report.tokens)} tokens from a {n_stages}-stage swarm: "
        f"first token after {report.first_token_ms:.0f} ms "
        f"({report.prompt_tokens} prompt tokens), then {report.decode_tokens_per_s:.1f} tok/s",
        flush=True,
    )
    if report.stages:
        print(report.table(), flush=True)
