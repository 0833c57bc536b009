"""Stages chained in one process: the reference a networked swarm must reproduce.

`generate` runs a prompt in chunks, then decodes one token per step; each step's rows
go through every stage in order. Running the whole model as a single stage with the
same chunking gives the monolithic reference (`compare_with_whole_model`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from core.errors import CoreError
from core.sampling import make_rng, sample
from core.stage import Stage, StepFailure, StepRequest, StepResult
from core.types import SamplingParams

F32Array = npt.NDArray[np.float32]

DEFAULT_CHUNK = 64
GREEDY = SamplingParams()


@dataclass(frozen=True)
class PipelineGeneration:
    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    logits: F32Array | None
    """Logits each generated token was chosen from, (n_tokens, n_vocab), if kept."""
    prefill_s: float
    decode_s: float
    stage_s: tuple[float, ...]
    """Seconds spent in each stage, prompt and decode together."""
    stopped_by_end_token: bool

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.tokens) - 1  # the first token comes from the prefill
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


class LocalPipeline:
    def __init__(self, stages: Sequence[Stage]) -> None:
        if not stages or not stages[0].spec.is_first or not stages[-1].spec.is_last:
            raise ValueError("a pipeline runs from the first layer to the last")
        self.stages = list(stages)
        self.stage_seconds = [0.0] * len(stages)
        """Seconds spent in each stage since the last `reset_timers`."""

    def reset_timers(self) -> None:
        self.stage_seconds = [0.0] * len(self.stages)

    def forward(
        self, session: str, start: int, tokens: Sequence[int], all_logits: bool = False
    ) -> F32Array:
        """Push rows through every stage; logits of the last row (or all rows)."""
        req = StepRequest(
            session, start, tokens=np.asarray(tokens, dtype=np.int32), all_logits=all_logits
        )
        out: StepResult | None = None
        for i, stage in enumerate(self.stages):
            t0 = time.perf_counter()
            (res,) = stage.step([req])
            self.stage_seconds[i] += time.perf_counter() - t0
            if isinstance(res, StepFailure):
                raise res.error
            out = res
            if res.hidden is not None:
                req = StepRequest(session, start, hidden=res.hidden, all_logits=all_logits)
        assert out is not None and out.logits is not None
        return out.logits

    def open(self, session: str) -> None:
        for s in self.stages:
            s.open(session)

    def close(self, session: str) -> None:
        for s in self.stages:
            s.close(session)

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        sampling: SamplingParams = GREEDY,
        chunk: int = DEFAULT_CHUNK,
        is_end: Callable[[int], bool] = lambda _t: False,
        keep_logits: bool = False,
        on_token: Callable[[int], None] | None = None,
        session: str = "local",
    ) -> PipelineGeneration:
        if not prompt:
            raise CoreError("empty prompt")
        self.reset_timers()
        rng = make_rng(sampling)
        self.open(session)
        try:
            t0 = time.perf_counter()
            logits: F32Array | None = None
            for a in range(0, len(prompt), chunk):
                logits = self.forward(session, a, prompt[a : a + chunk])
            assert logits is not None
            t1 = time.perf_counter()
            history = list(prompt)
            tokens: list[int] = []
            kept: list[F32Array] = []
            ended = False
            pos = len(prompt)
            while True:
                row = logits[-1]
                tok = sample(row, sampling, rng, history)
                tokens.append(tok)
                history.append(tok)
                if keep_logits:
                    kept.append(row.copy())
                if on_token is not None:
                    on_token(tok)
                if is_end(tok):
                    ended = True
                    break
                if len(tokens) >= max_tokens:
                    break
                logits = self.forward(session, pos, [tok])
                pos += 1
            t2 = time.perf_counter()
        finally:
            self.close(session)
        return PipelineGeneration(
            prompt_tokens=tuple(prompt),
            tokens=tuple(tokens),
            logits=np.stack(kept) if kept else None,
            prefill_s=t1 - t0,
            decode_s=t2 - t1,
            stage_s=tuple(self.stage_seconds),
            stopped_by_end_token=ended,
        )

    def shutdown(self) -> None:
        for s in self.stages:
            s.shutdown()


@dataclass(frozen=True)
class Comparison:
    identical: bool
    first_difference: int | None
    max_abs_logit_diff: float
    chain: PipelineGeneration
    whole: PipelineGeneration


def compare_generations(chain: PipelineGeneration, whole: PipelineGeneration) -> Comparison:
    """Tokens identical? Largest |logit difference| over the steps both produced."""
    first = next(
        (i for i, (a, b) in enumerate(zip(chain.tokens, whole.tokens, strict=False)) if a != b),
        None,
    )
    identical = first is None and len(chain.tokens) == len(whole.tokens)
    diff = 0.0
    if chain.logits is not None and whole.logits is not None:
        n = min(len(chain.logits), len(whole.logits))
        diff = float(np.abs(chain.logits[:n] - whole.logits[:n]).max()) if n else 0.0
    return Comparison(identical, first, diff, chain, whole)
