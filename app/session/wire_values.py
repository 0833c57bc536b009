"""Conversions between core's value types and their wire twins (net may not import core)."""

from __future__ import annotations

from core.types import SamplingParams
from net.wire import SamplingSpec


def sampling_to_wire(p: SamplingParams) -> SamplingSpec:
    return SamplingSpec(
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        min_p=p.min_p,
        repetition_penalty=p.repetition_penalty,
        repetition_window=p.repetition_window,
        seed=p.seed,
    )


def sampling_from_wire(s: SamplingSpec) -> SamplingParams:
    return SamplingParams(
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        min_p=s.min_p,
        repetition_penalty=s.repetition_penalty,
        repetition_window=s.repetition_window,
        seed=s.seed,
    )
